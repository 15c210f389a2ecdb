"""The command line end to end: output keys, exit codes, one-line errors, no overwrites."""

import json
import shutil
import subprocess

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.model.target import BUILTIN_TARGETS


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_targets_lists_every_builtin(capsys):
    code, out, _ = run(capsys, "targets")
    assert code == 0
    for name in BUILTIN_TARGETS:
        assert name in out


def test_evaluate_json_keys(capsys):
    # TP64 past Llama 3 405B's 8 KV heads (ZeRO-1): a layout of NxD's, which replicates KV heads
    code, out, _ = run(capsys, "evaluate", "--tp", "64", "--pp", "4", "--dp", "2", "--recompute", "full",
                       "--ultraservers", "2", "--framework", "nxd", "--json", "-")
    assert code == 0
    data = json.loads(out)
    assert data["problem"]["framework"] == "nxd"
    for key in ("memory_gib_per_chip", "memory_breakdown_gib", "step_time_s", "step_breakdown_s", "tokens_per_s",
                "mfu", "fits"):
        assert key in data
    assert data["fits"] is True


def test_solve_json_keys_and_layout_round_trip(capsys, tmp_path):
    path = tmp_path / "layout.json"
    # a deterministic budget: proven optimal on a loaded machine as on an idle one
    code, out, err = run(capsys, "solve", "--model", "llama3-8b", "--target", "trn2", "--global-batch", "64",
                         "--time-limit", "600", "--deterministic-limit", "120", "--json", str(path),
                         "--rank-map", str(tmp_path / "ranks.csv"))
    assert code == 0, err
    assert "rank-to-chip map" in out and "NEURON_LOGICAL_NC_CONFIG" in out and "--logical-nc-config" in out
    data = json.loads(path.read_text())
    for key in ("status", "stopped_by", "layout", "rank_map", "memory_gib_per_chip", "step_time_s", "tokens_per_s"):
        assert key in data
    for key in ("tp", "pp", "dp", "ep", "zero", "recompute", "micro_batch", "lnc", "placement"):
        assert key in data["layout"]
    assert data["status"] == "OPTIMAL"
    assert data["rank_map"]["ranks"] == 16 * 8 // data["layout"]["lnc"]
    rows = (tmp_path / "ranks.csv").read_text().splitlines()
    assert len(rows) == 1 + 16 * 8 // data["layout"]["lnc"] and rows[0] == "rank,instance,chip,core,lnc"
    assert main(["check-map", "--layout", str(path), "--rank-map", str(tmp_path / "ranks.csv")]) == 0
    # never overwrite what is there
    code, _, err = run(capsys, "solve", "--model", "llama3-8b", "--target", "trn2", "--global-batch", "64",
                       "--time-limit", "30", "--json", str(path))
    assert code == 2 and "never overwrites" in err


def test_bad_target_file_is_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n')
    code, _, err = run(capsys, "solve", "--target", str(bad), "--time-limit", "5")
    assert code == 2
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err


def test_bad_degrees_is_one_line_exit_2(capsys):
    code, _, err = run(capsys, "evaluate", "--tp", "3", "--pp", "1", "--dp", "1")
    assert code == 2 and err.count("\n") == 1


def test_infeasible_exit_3_with_explanation(capsys):
    code, _, err = run(capsys, "solve", "--target", "trn2", "--instances", "1", "--time-limit", "20")
    assert code == 3
    assert "the least-memory layout" in err and "GiB per chip" in err and "--instances" in err


@pytest.mark.skipif(shutil.which("trnopt") is None, reason="console script not on PATH")
def test_console_script_runs():
    done = subprocess.run(["trnopt", "models"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "llama3-405b" in done.stdout


def test_exit_codes_of_the_errors(capsys, monkeypatch):
    from trnopt.optimizer.commands import solve
    from trnopt.optimizer.errors import TimeLimitError

    def timed_out(args):
        raise TimeLimitError("no layout found within 1 s\nraise --time-limit")
    monkeypatch.setattr(solve, "run", timed_out)
    code, _, err = run(capsys, "solve", "--time-limit", "1")
    assert code == 4 and err == "trnopt: time limit: no layout found within 1 s\\nraise --time-limit\n"


def test_argparse_errors_are_one_line(capsys):
    for argv in (["solve", "--seed", "2^63"], ["evaluate", "--tp"], ["nosuch"], ["map"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("trnopt: error: "), err


@pytest.mark.parametrize("argv", [
    ["solve", "--seed", "\u0661\u0662"],                 # Arabic-Indic 12
    ["solve", "--workers", "\uff12"],                    # full-width 2
    ["solve", "--ultraservers", "\u0664"],
    ["evaluate", "--tp", "\u0668"],
    ["compare", "--ultraservers", "\u0661"],
])
def test_integer_flags_take_ascii_digits_only(argv, capsys):
    """int() reads other scripts' digits; a flag that took them would echo a number the user never typed."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected an integer in ASCII digits" in err[0] and argv[1] in err[0]
