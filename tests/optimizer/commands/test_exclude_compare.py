"""`compare --exclude TARGET:NAMES`: that target planned on what its failed instances leave, the others whole;
names that cannot mean one machine refused in one line."""

from __future__ import annotations

import json

import pytest

from trnopt.optimizer.commands.cli import main

FAST = ["--model", "llama3-8b", "--ultraservers", "2", "--time-limit", "60"]


def test_the_named_target_is_planned_around_its_hole_the_other_whole(tmp_path, capsys):
    assert main(["compare", "--targets", "trn2u,trn2", *FAST, "--exclude", "trn2u:d1i2", "--json",
                 str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    rows = {r["target"]: r for r in json.loads((tmp_path / "c.json").read_text())["rows"]}
    partial, whole = rows["trn2u"], rows["trn2"]
    assert partial["exclude"] == ["d1i2"] and partial["solver_status"] == "OPTIMAL"
    assert partial["instances_per_domain"] in (4, 2) and partial["chips"] == 64  # 1 whole UltraServer, or 2 pairs
    assert "exclude" not in whole and whole["chips"] == 2 * 16
    assert "trn2u: " in text and "excluded d1i2: planned on" in text
    # the row's numbers are the cost model's on the machine it names: evaluate of its layout, as a layout file
    (tmp_path / "l.json").write_text(json.dumps({
        "problem": {"target": "trn2u", "model": "llama3-8b", "domains": 2, "exclude": partial["exclude"],
                    "instances_per_domain": partial["instances_per_domain"]},
        "layout": partial["layout"]}))
    assert main(["evaluate", "--layout", str(tmp_path / "l.json"), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == partial["step_time_s"]


def test_bare_names_with_one_target_are_its_own(capsys):
    assert main(["compare", "--targets", "trn2u", *FAST, "--exclude", "d1i2", "--json", "-"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["exclude"] == ["d1i2"] and row["status"] == "solved"


@pytest.mark.parametrize("extra, rule", [
    (["--targets", "trn2u,trn2", *FAST, "--exclude", "d1i2"], "write TARGET:NAMES"),
    (["--targets", "trn2u,trn2", *FAST, "--exclude", "trn3-gen2:d1i2"], "is not one of --targets"),
    (["--targets", "trn2u,trn2", *FAST, "--exclude", "trn2u:d1i2", "--exclude", "trn2u:d0i0"], "given twice"),
    (["--targets", "trn2u,trn2", "--model", "llama3-8b", "--exclude", "trn2u:d1i2"], "needs --ultraservers"),
    (["--targets", "trn2u,trn2", *FAST, "--exclude", "trn2u:d2i0"], "no domain 2"),
    (["--targets", "trn2u,trn2", *FAST, "--exclude", "trn2:d0i0,d1i0"], "leave no healthy instance"),
])
def test_names_that_mean_no_one_machine_are_one_line(extra, rule, capsys):
    assert main(["compare", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --exclude: exclude:" in err[0] and rule in err[0], err
