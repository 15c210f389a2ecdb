"""`trnopt evaluate --stage-layers` and `trnopt solve --uneven-stages`: uneven pipeline stages end to end."""

import json

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layoutfile import read_layout

BASE = ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", "4", "--pp", "4", "--dp", "4",
        "--zero", "1", "--recompute", "full", "--global-batch", "64"]


def run(capsys, *argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_split_is_scored_and_the_even_one_is_todays_answer(capsys):
    code, out, _ = run(capsys, *BASE, "--json", "-")
    plain = json.loads(out)
    code_even, out_even, _ = run(capsys, *BASE, "--json", "-", "--stage-layers", "8,8,8,8")
    even = json.loads(out_even)
    assert code == code_even == 0
    assert even["step_time_s"] == plain["step_time_s"] and even["layout"]["stage_layers"] == [8, 8, 8, 8]
    assert "stage_layers" not in plain["layout"] and "stage_split" not in plain["step_breakdown_s"]
    code, out, _ = run(capsys, *BASE, "--json", "-", "--stage-layers", "8,8,9,7")
    doc = json.loads(out)
    assert code == 0 and doc["step_time_s"] < plain["step_time_s"]  # a lighter last stage carries the LM head
    assert doc["step_breakdown_s"]["stage_split"] == doc["step_time_s"] - plain["step_time_s"]


def test_the_report_prints_layers_per_stage_against_even(capsys):
    code, out, _ = run(capsys, *BASE, "--stage-layers", "8,8,9,7")
    assert code == 0
    line = next(x for x in out.splitlines() if "layers per stage 8,8,9,7 (first to last)" in x)
    assert "with the even split" in line and "faster" in line


def test_bad_splits_are_one_line_exit_2(capsys):
    for split, rule in (("8,8,16", "gives 3 stages, the layout has pp=4"), ("0,8,12,12", "at least one layer"),
                        ("8,8,8,9", "add up to 33, llama3-8b has 32"), ("8,8,x,8", "whole numbers separated"),
                        ("", "whole numbers separated")):
        code, _, err = run(capsys, *BASE, "--stage-layers", split)
        assert code == 2 and err.startswith("trnopt: error: --stage-layers: ") and rule in err, (split, err)
        assert len(err.strip().splitlines()) == 1


def test_interleaved_layouts_are_refused(capsys):
    code, _, err = run(capsys, *BASE, "--interleave", 2, "--stage-layers", "8,8,8,8")
    assert code == 2 and "one stage a rank" in err and len(err.strip().splitlines()) == 1


def test_the_layout_file_keeps_the_split(capsys, tmp_path):
    path = tmp_path / "layout.json"
    code, _, _ = run(capsys, *BASE, "--stage-layers", "8,8,9,7", "--json", path)
    assert code == 0
    _, workload, layout = read_layout(str(path))
    assert layout.stage_layers == (8, 8, 9, 7)
    doc = json.loads(path.read_text())
    doc["layout"]["stage_layers"] = [8, 8, 9, 8]
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="layout.stage_layers.*add up to 33"):
        read_layout(str(path))
    doc["layout"]["stage_layers"] = [8, 8, 16, 0]
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="layout.stage_layers.*whole numbers from 1"):
        read_layout(str(path))


def test_solve_refuses_uneven_stages_for_nxd(capsys):
    code, _, err = run(capsys, "solve", "--target", "trn2", "--model", "llama3-8b", "--instances", "1",
                       "--framework", "nxd", "--uneven-stages")
    assert code == 2 and err.startswith("trnopt: error: --uneven-stages: ") and "pipeline_cuts" in err
    assert len(err.strip().splitlines()) == 1


def test_solve_answers_the_best_layout_and_split_together(capsys, tmp_path):
    path = tmp_path / "answer.json"
    code, out, _ = run(capsys, "solve", "--target", "trn2", "--model", "llama3-8b", "--instances", "1",
                       "--uneven-stages", "--uncertainty", "0", "--json", path)
    assert code == 0
    joint = json.loads(path.read_text())["uneven_stages"]["joint"]
    assert joint["status"] == "OPTIMAL" and joint["gap"] == 0.0 and joint["answer"]
    assert joint["layouts_split"] > 0 and joint["scope"].startswith("every layout of the space on every split")
    line = next(x for x in out.splitlines() if x.startswith("  layout and split together: "))
    assert "proven optimal" in line and f"{joint['layouts_split']} layouts split exactly" in line
