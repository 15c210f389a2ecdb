"""The solve report's answer with no overlap: one line, the JSON's ``no_overlap``, and every
number from the one cost model with every hidden share 0 (``overlap.NO_OVERLAP``)."""

from __future__ import annotations

import json

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.commands.report import NoOverlapAnswer, no_overlap_line
from trnopt.optimizer.cost.overlap import NO_OVERLAP
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.layoutfile import read_layout


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    path = tmp_path_factory.mktemp("solve") / "layout.json"
    # a deterministic budget: the same answer on a loaded machine as on an idle one
    code = main(["solve", "--model", "llama3-8b", "--target", "trn2", "--global-batch", "64", "--time-limit", "600",
                 "--deterministic-limit", "60", "--json", str(path)])
    assert code == 0
    return path


def test_the_json_states_the_answer_with_no_overlap_from_the_cost_model(solved):
    data = json.loads(solved.read_text())
    target, workload, layout = read_layout(str(solved))
    bare = Problem(workload, target, layout.domains, overlap=NO_OVERLAP)
    with_table = Problem(workload, target, layout.domains)
    no = data["no_overlap"]
    assert no["status"] in ("OPTIMAL", "FEASIBLE", "unchanged")
    # the chosen layout hides TP traffic here, so without overlap it is slower, as the cost model says
    assert with_table.evaluate(layout).step.tp < with_table.evaluate(layout).step.tp_raw
    assert no["chosen_layout_step_time_s"] == pytest.approx(bare.evaluate(layout).step.total, rel=1e-12)
    assert no["chosen_layout_step_time_s"] > data["step_time_s"]
    # the best layout without overlap is at least as fast as the chosen one without it, and no
    # faster than the answer with overlap (every layout only slows when nothing is hidden)
    assert data["step_time_s"] <= no["step_time_s"] <= no["chosen_layout_step_time_s"] * (1 + 1e-9)


def test_the_text_report_says_it_in_one_line(capsys, solved):
    target, workload, layout = read_layout(str(solved))
    bare = Problem(workload, target, layout.domains, overlap=NO_OVERLAP)
    e = bare.evaluate(layout)
    assert no_overlap_line(NoOverlapAnswer(e, "unchanged", e)) == (
        f"with no overlap (every hidden share 0): the same layout, {e.step.total:.3f} s/step")
    assert no_overlap_line(NoOverlapAnswer(e, "FEASIBLE", e)).endswith(f"{e.step.total:.3f} s/step, FEASIBLE")
