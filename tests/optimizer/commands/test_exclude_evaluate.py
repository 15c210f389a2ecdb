"""`evaluate` on a partial machine: a layout file of `solve --exclude` scored again (`--layout`), the same
layout given by flags with `--exclude`, the machine left chosen by the placement, and bad input in one line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from trnopt.optimizer.commands.cli import main

TARGETS = Path(__file__).resolve().parents[3] / "targets" / "machines"
WHOLE = ["--target", "trn2u", "--model", "llama3-8b", "--ultraservers", "2"]


@pytest.fixture(scope="module", params=["trn2u", "any-count"])
def solved(request, tmp_path_factory):
    """`solve --exclude d1i2` on trn2u (1 whole UltraServer planned) and on a trn2u whose runtime joins any
    count of instances (lines of 3 round the hole): the target, the layout file and the rank map."""
    out = tmp_path_factory.mktemp("evaluate-exclude")
    target = "trn2u"
    if request.param == "any-count":
        target = str(out / "any.toml")
        text = (TARGETS / "trn2u.toml").read_text()
        (out / "any.toml").write_text("\n".join(line for line in text.splitlines()
                                                if not line.startswith("domain_instances")
                                                and "a partial plan keeps these" not in line))
    assert main(["solve", "--target", target, *WHOLE[2:], "--top", "0", "--exclude", "d1i2",
                 "--json", str(out / "s.json"), "--rank-map", str(out / "s.csv")]) == 0
    return target, out


def test_evaluate_of_the_layout_file_gives_solves_step_time_and_rank_map(solved, capsys):
    _, out = solved
    capsys.readouterr()
    assert main(["evaluate", "--layout", str(out / "s.json"), "--json", str(out / "e.json"),
                 "--rank-map", str(out / "e.csv")]) == 0
    assert "excluded d1i2: planned on" in capsys.readouterr().out
    s, e = json.loads((out / "s.json").read_text()), json.loads((out / "e.json").read_text())
    assert all(e[k] == s[k] for k in ("step_time_s", "step_breakdown_s", "memory_breakdown_gib", "layout", "rank_map"))
    assert e["problem"] == s["problem"] and e["problem"]["exclude"] == ["d1i2"]
    assert (out / "e.csv").read_bytes() == (out / "s.csv").read_bytes()
    # evaluate's JSON is a layout file too: read again, the same number
    assert main(["evaluate", "--layout", str(out / "e.json"), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == s["step_time_s"]


def _flags(layout: dict) -> list[str]:
    """The evaluate flags of a layout file's layout object."""
    placement = ";".join(f"{d}=" + ",".join(f"{a}{f}" for a, f in axes.items())
                         for d, axes in layout["placement"].items() if axes)
    return ["--tp", str(layout["tp"]), "--pp", str(layout["pp"]), "--dp", str(layout["dp"]), "--ep", str(layout["ep"]),
            "--cp", str(layout["cp"]), "--zero", str(layout["zero"]), "--recompute", layout["recompute"],
            "--micro-batch", str(layout["micro_batch"]), "--interleave", str(layout["interleave"]),
            "--schedule", layout["schedule"], "--lnc", str(layout["lnc"]), "--placement", placement]


def test_the_same_layout_by_flags_with_exclude_lands_on_the_same_machine(solved, capsys):
    target, out = solved
    s = json.loads((out / "s.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", "--target", target, *WHOLE[2:], "--exclude", "d1i2", *_flags(s["layout"]),
                 "--json", "-"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["step_time_s"] == s["step_time_s"] and e["problem"]["instances_per_domain"] == \
        s["problem"]["instances_per_domain"]


def test_the_placement_picks_the_machine_left_and_the_rank_map_goes_around_the_hole(tmp_path, capsys):
    # trn2u less d1i2 leaves 1 whole UltraServer or 2 pairs of neighbours: both 256 ranks at LNC=2;
    # the degrees alone take the first (whole UltraServers), a placement with efa2 the pairs
    common = ["evaluate", *WHOLE, "--exclude", "d1i2", "--lnc", "2", "--zero", "3"]
    assert main([*common, "--tp", "8", "--json", "-"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["problem"]["instances_per_domain"] == 4 and "efa" not in first["layout"]["placement"]["dp"]
    assert main([*common, "--placement", "tp=core4,x2;dp=x2,y4,ring2,efa2", "--json", str(tmp_path / "p.json"),
                 "--rank-map", str(tmp_path / "m.csv")]) == 0
    pairs = json.loads((tmp_path / "p.json").read_text())
    assert pairs["problem"]["instances_per_domain"] == 2 and pairs["problem"]["domains"] == 2
    rows = list(csv.DictReader(io.StringIO((tmp_path / "m.csv").read_text())))
    # a pair of ring neighbours in each UltraServer, none on d1i2; check-map reads it against the file
    assert {r["instance"] for r in rows} == {"d0i0", "d0i1", "d1i0", "d1i1"} and len(rows) == 256
    capsys.readouterr()
    assert main(["check-map", "--layout", str(tmp_path / "p.json"), "--rank-map", str(tmp_path / "m.csv")]) == 0


@pytest.mark.parametrize("extra, flag, rule", [
    (["--tp", "8", "--exclude", "d0i1"], "--exclude", "--ultraservers"),
    ([*WHOLE[4:], "--exclude", "d0i9", "--tp", "8"], "--exclude", "no instance 9"),
    ([*WHOLE[4:], "--exclude", "d1x2", "--tp", "8"], "--exclude", "is not d<domain>i<instance>"),
    ([*WHOLE[4:], "--exclude", "d0i0,d0i1,d0i2,d0i3,d1i0,d1i1,d1i2,d1i3", "--tp", "8"], "--exclude",
     "leave no healthy instance"),
    ([*WHOLE[4:], "--exclude", "d1i2", "--tp", "8", "--dp", "16"], "--exclude", "tiles none of the machines left"),
])
def test_bad_exclude_is_one_line_naming_the_flag(extra, flag, rule, capsys):
    assert main(["evaluate", *WHOLE[:4], *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: {flag}:" in err[0] and rule in err[0], err


def test_a_layout_file_takes_no_problem_or_layout_flags(solved, capsys):
    _, out = solved
    for extra, flag in ((["--exclude", "d0i1"], "--exclude"), (["--tp", "4"], "--tp"), (["--model", "llama3-70b"],
                                                                                         "--model"),
                        (["--framework", "nxd"], "--framework")):
        assert main(["evaluate", "--layout", str(out / "s.json"), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"error: {flag}:" in err[0] and "--layout" in err[0], err


def test_a_layout_file_whose_exclusion_breaks_is_one_line_naming_the_key(solved, tmp_path, capsys):
    _, out = solved
    data = json.loads((out / "s.json").read_text())
    for exclude, rule in ((["d1i7"], "no instance 7"), ("d1i2", "non-empty list"), ([], "non-empty list")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**data, "problem": {**data["problem"], "exclude": exclude}}))
        assert main(["evaluate", "--layout", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "problem.exclude" in err[0] and rule in err[0], err


def test_a_model_that_does_not_fit_on_what_is_left(capsys):
    # evaluate: the report and exit 1, as any layout that does not fit
    assert main(["evaluate", "--target", "trn2u", "--model", "llama3-405b", "--ultraservers", "1",
                 "--exclude", "d0i1", "--tp", "8", "--pp", "2"]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and len(captured.err.strip().splitlines()) == 1
    # solve: proven that nothing fits on any machine left, one line naming the flag (exit 3, infeasible)
    assert main(["solve", "--target", "trn2u", "--model", "llama3-405b", "--ultraservers", "1",
                 "--exclude", "d0i1", "--top", "0"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "infeasible: --exclude: exclude:" in err[0] and "more healthy instances" in err[0], err
