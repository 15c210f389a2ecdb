"""`trnopt evaluate`: flags named in errors, exit 1 for a layout that does not fit, a compact JSON rank map."""

import json

from trnopt.optimizer.commands.cli import main

BASE = ["evaluate", "--target", "trn2", "--model", "llama3-8b"]


def run(capsys, *argv):
    code = main([*BASE, *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_errors_name_the_flag(capsys):
    for argv, flag in ((("--tp", 0), "--tp:"), (("--zero", 5), "--zero:"), (("--lnc", 3), "--lnc:"),
                       (("--lnc", 0), "--lnc:"), (("--tp", 4, "--micro-batch", 0), "--micro-batch:"),
                       (("--tp", 4, "--dp", 16, "--interleave", 2), "--interleave:"),
                       (("--tp", 4, "--recompute", "most"), "--recompute:"),
                       (("--tp", 64, "--dp", 1), "--tp:"),  # llama3-8b has 32 heads
                       (("--tp", 4, "--pp", 16, "--dp", 1, "--recompute", "every-4"), "--recompute:")):  # 2 layers a stage
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.startswith(f"trnopt: error: {flag}"), (argv, err)
        assert "layout:" not in err


def test_a_layout_that_does_not_fit_exits_1(capsys):
    code, out, err = run(capsys, "--tp", 1, "--dp", 64, "--zero", 0, "--recompute", "none", "--global-batch", 64)
    assert code == 1 and "DOES NOT FIT" in out and err.startswith("trnopt evaluate: the layout does not fit")


def test_json_rank_map_is_a_summary_and_the_full_map_a_csv(capsys, tmp_path):
    code, out, _ = run(capsys, "--tp", 4, "--dp", 16, "--zero", 3, "--global-batch", 64, "--json", "-")
    summary = json.loads(out)["rank_map"]
    assert code == 0 and summary["ranks"] == 64 and summary["tp_groups"]["size"] == 4
    code, out, _ = run(capsys, "--tp", 4, "--dp", 16, "--zero", 3, "--global-batch", 64, "--rank-map", "-")
    rows = out.splitlines()
    assert code == 0 and rows[0] == "rank,instance,chip,core,lnc" and len(rows) == 65
    assert rows[5] == "4,d0i0,1,0,2"  # TP4 over a chip's 4 cores: rank 4 starts chip 1
    code, _, err = run(capsys, "--tp", 4, "--dp", 16, "--json", "-", "--rank-map", "-")
    assert code == 2 and "--rank-map" in err
