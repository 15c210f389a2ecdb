"""Layout files the commands read, and the hand-written placement `evaluate` reads: what is refused, and how."""

from __future__ import annotations

import json

import pytest

from trnopt.optimizer.commands.args import load_runnable_layout
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.errors import DoesNotFitError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def write_layout(tmp_path, model_in_file: str, name: str = "layout.json") -> str:
    """TP8 x DP64, ZeRO-3, no recompute on one trn2u at LNC=1: runs llama3-8b; the file may name another model."""
    target = load_target("trn2u")
    axes = target.axes(1, 1)
    layout = Layout(tp=8, pp=1, dp=64, zero=3, recompute="none", lnc=1, axes=axes,
                    placement=default_placement(axes, {"tp": 8, "dp": 64}))
    workload = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=1024))
    path = tmp_path / name
    path.write_text(json.dumps({"problem": problem_dict("trn2u", model_in_file, workload, 1),
                                "layout": layout_dict(layout)}))
    return str(path)


def test_a_layout_that_fits_loads_with_its_evaluation(tmp_path):
    target, workload, layout, e = load_runnable_layout(write_layout(tmp_path, "llama3-8b"))
    assert e.fits and layout.tp == 8 and workload.model.name == "llama3-8b"


def test_an_edited_model_that_does_not_fit_is_refused_by_every_reader(tmp_path, capsys):
    path = write_layout(tmp_path, "llama3-405b")
    with pytest.raises(DoesNotFitError, match=r"692\.5 GiB per chip.*96\.0 GiB of HBM"):
        load_runnable_layout(path)
    rank_map = tmp_path / "map.csv"
    rank_map.write_text("rank,instance,chip,core\n0,i,0,0\n")
    for argv in (["map", "--layout", path], ["check-map", "--layout", path, "--rank-map", str(rank_map)],
                 ["kernels", "--layout", path]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("trnopt: does not fit: ") and "692.5 GiB" in err[0]


def test_a_bad_problem_key_is_named_once(tmp_path, capsys):
    path = tmp_path / "bad.json"
    data = json.loads(open(write_layout(tmp_path, "llama3-8b")).read())
    data["problem"]["global_batch"] = 0
    path.write_text(json.dumps(data))
    assert main(["map", "--layout", str(path)]) == 2
    err = capsys.readouterr().err
    assert ": problem.global_batch: must be >= 1" in err and "problem.problem" not in err


@pytest.mark.parametrize("placement, rule", [
    ("tp=x2,x2", "axis x is named twice in tp"),
    ("tp=core4;tp=x2", "tp is given twice"),
    ("tp=core\u0664", "ASCII digits"),         # Arabic-Indic four
    ("tp=core\uff14", "ASCII digits"),         # full-width four
    ("tp=core4, x\u0662", "ASCII digits"),
])
def test_a_lax_placement_is_refused_naming_the_rule(capsys, placement, rule):
    assert main(["evaluate", "--ultraservers", "1", "--placement", placement]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--placement" in err[0] and rule in err[0], err


@pytest.mark.parametrize("target, dp, flag", [("trn2u", "x4,y4,ring4,efa2", "--ultraservers 2"),
                                              ("trn2", "x4,y4,efa2", "--instances 2")])
def test_a_scale_out_factor_needs_the_machine_size(capsys, target, dp, flag):
    argv = ["evaluate", "--target", target, "--model", "llama3-8b", "--zero", "3", "--placement", f"tp=core4;dp={dp}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no machine size is given" in err and f"pass {flag}" in err
    # with the size given, the same placement is scored
    assert main(argv + flag.split()) in (0, 1)
    assert f"placement: tp: core4; dp: {dp.replace(',', ' ')}" in capsys.readouterr().out
