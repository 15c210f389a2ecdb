"""The CP-SAT split search (search/stagesplit.py) against every split enumerated (search/stageenum.py)."""

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost import stages
from trnopt.optimizer.cost.memory import FRAGMENTATION_DIVISOR
from trnopt.optimizer.search import stageenum
from trnopt.optimizer.search.stagesplit import SplitData, best_joint, best_split, split_layout, split_runners_up

sys.path.insert(0, str(Path(__file__).parents[1] / "cost"))
from stage_layouts import piped  # noqa: E402

SETTINGS = dict(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 60)), deadline=None,
                derandomize=not os.environ.get("TRNOPT_EXAMPLES"), suppress_health_check=[HealthCheck.too_slow])


@st.composite
def split_spaces(draw):
    """Small spaces: 2-6 stages of 2-22 layers, work a n + d (n // k) + c, a head, per-stage bytes
    (falling with the stage under 1F1B, or not), a capacity from roomy to nothing fits."""
    p = draw(st.integers(2, 6))
    L = draw(st.integers(p, 22))
    k = draw(st.integers(1, 5))
    a, d = draw(st.integers(1, 1000)), (draw(st.integers(0, 700)) if k > 1 else 0)
    per = draw(st.lists(st.integers(1, 50), min_size=p, max_size=p))
    if draw(st.booleans()):
        per = [per[0]] + sorted(per[1:-1], reverse=True) + [per[-1]]
    fixed = draw(st.lists(st.integers(0, 200), min_size=p, max_size=p))
    if draw(st.booleans()):
        fixed = [fixed[0]] + [fixed[1]] * (p - 2) + [fixed[-1]]
    need = max(f + x * b for f, b, x in zip(fixed, per, [L // p + 1] * p))
    capacity = (FRAGMENTATION_DIVISOR + 1) * draw(st.integers(max(per) // 2, 2 * need))
    return SplitData(L, a, d, k, draw(st.integers(0, 5000)), draw(st.integers(0, 3 * a)), tuple(per), tuple(fixed),
                     capacity)


@settings(**SETTINGS)
@given(data=split_spaces())
def test_cpsat_finds_the_enumerations_optimum(data):
    found = best_split(data)
    top, where, scored = stageenum.best(data)
    assert scored == stageenum.count(data.layers, data.stages)
    if top is None:
        assert found.status == "INFEASIBLE" and found.layers is None
        return
    assert found.status == "OPTIMAL"
    assert found.bottleneck == top == data.bottleneck(where)
    assert sum(found.layers) == data.layers and min(found.layers) >= 1 and data.fits(found.layers)


def test_the_enumeration_visits_every_composition_once():
    rows = [tuple(r) for block in stageenum.chunks(9, 4) for r in block.tolist()]
    assert len(rows) == len(set(rows)) == stageenum.count(9, 4) == 56
    assert all(sum(r) == 9 and min(r) >= 1 for r in rows)


@pytest.mark.parametrize("model,tp,pp,recompute", [("llama3-8b", 4, 8, "full"), ("llama3-8b", 8, 4, "every-4"),
                                                   ("mixtral-8x7b", 4, 8, "full")])
def test_real_layouts_agree_and_are_never_slower_than_even(model, tp, pp, recompute):
    problem, layout = piped(model, tp, pp, recompute)
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    data = SplitData.of(costs)
    found = best_split(data, hint=costs.even_split())
    top, _, _ = stageenum.best(data)
    assert found.status == "OPTIMAL" and found.bottleneck == top
    assert costs.step(found.layers) <= costs.step(costs.even_split())
    # the integer step of the even split is the layout's step time, in ns
    assert data.step(costs.even_split()) == round(costs.even_step * 1e9)
    assert found.step == data.step(found.layers) == pytest.approx(costs.step(found.layers) * 1e9, abs=len(found.layers))


def test_memory_makes_the_first_stage_lighter():
    """With the HBM just short of the even split's first stage (it holds p micro-batches in flight),
    the best split moves layers off it; the enumeration agrees."""
    problem, layout = piped("llama3-8b", 8, 8, "selective")
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    data = SplitData.of(costs)
    even = costs.even_split()
    grow = FRAGMENTATION_DIVISOR + 1
    first = data.fixed_bytes[0] + even[0] * data.layer_bytes[0]
    assert first == max(f + x * a for f, a, x in zip(data.fixed_bytes, data.layer_bytes, even))
    tight = replace(data, capacity=grow * (first - 1))
    assert not tight.fits(even)
    found = best_split(tight, hint=even)
    top, _, _ = stageenum.best(tight)
    assert found.status == "OPTIMAL" and found.bottleneck == top and tight.fits(found.layers)
    assert found.layers[0] < even[0] and found.layers[0] < max(found.layers[1:])


def test_nothing_fits_is_infeasible():
    problem, layout = piped("llama3-8b", 4, 4, "full")
    data = SplitData.of(stages.stage_costs(problem.workload, layout, problem.target, problem.headroom,
                                           problem.overlap))
    none = replace(data, capacity=0)
    assert best_split(none).status == "INFEASIBLE" and stageenum.best(none)[0] is None


@st.composite
def joint_spaces(draw):
    """One to three layouts of one model and pipeline degree, each with its own step per unit of bottleneck."""
    first = draw(split_spaces())
    out = [first]
    for _ in range(draw(st.integers(0, 2))):
        other = draw(split_spaces())
        while other.stages != first.stages or other.layers != first.layers:
            other = replace(other, layers=first.layers, layer_bytes=(other.layer_bytes * first.stages)[:first.stages],
                            fixed_bytes=(other.fixed_bytes * first.stages)[:first.stages])
        out.append(other)
    return [replace(d, step_den=(den := draw(st.integers(1, 64))), step_num=den + draw(st.integers(0, 9)),
                    step_base=draw(st.integers(0, 10**6))) for d in out]


@settings(**SETTINGS)
@given(datas=joint_spaces())
def test_cpsat_finds_the_joint_enumerations_optimum(datas):
    found = best_joint(datas)
    top, where, which, scored = stageenum.best_joint(datas)
    assert scored == len(datas) * stageenum.count(datas[0].layers, datas[0].stages)
    if top is None:
        assert found.status == "INFEASIBLE"
        return
    assert found.status == "OPTIMAL" and found.step == top == datas[which].step(where)
    assert datas[found.choice].fits(found.layers) and sum(found.layers) == datas[0].layers


def test_split_layout_gives_the_chosen_layout_its_best_split():
    problem, layout = piped("llama3-8b", 4, 8, "full")
    even = problem.evaluate(layout)
    split, info = split_layout(problem, even)
    assert info["status"] == "OPTIMAL" and split.layout.stage_layers == tuple(info["layers"])
    assert split.step.total == pytest.approx(info["step_s"], rel=1e-12) and split.step.total < even.step.total
    assert info["even_step_s"] == even.step.total and split.fits
    assert split.step.stage_split == pytest.approx(split.step.total - even.step.total, rel=1e-9)
    assert "layers per stage" in info["note"] and "with the even split" in info["note"]


def test_split_layout_keeps_what_it_cannot_split():
    problem, layout = piped("llama3-8b", 4, 8, "full")
    inter = replace(layout, interleave=2)
    kept, info = split_layout(problem, problem.evaluate(inter))
    assert info["status"] == "UNSUPPORTED" and kept.layout == inter
    flat, one_stage = piped("llama3-8b", 4, 1, "full")
    kept, info = split_layout(flat, flat.evaluate(one_stage))
    assert info["status"] == "NO_PIPELINE" and not kept.layout.stage_layers


def test_a_headroom_the_even_split_breaks_makes_the_first_stage_lighter():
    """End to end from the HBM headroom: a usable HBM between the even split's first stage and the
    rest leaves the even split out of memory and the best split with a lighter first stage."""
    problem, layout = piped("llama3-8b", 8, 8, "selective")
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    even = costs.even_split()
    fullest = costs.stage_bytes(even)
    assert fullest[0] == max(fullest)
    usable = (fullest[0] + max(fullest[1:])) / 2
    headroom = 1 - usable / problem.target.chip.hbm_bytes
    tight = stages.stage_costs(problem.workload, layout, problem.target, headroom, problem.overlap)
    assert not tight.fits(even)
    found = best_split(SplitData.of(tight), hint=even)
    assert found.status == "OPTIMAL" and tight.fits(found.layers)
    assert found.layers[0] < even[0] and found.layers[0] < max(found.layers[1:])
    assert found.bottleneck == stageenum.best(SplitData.of(tight))[0]


def test_runners_up_are_split_and_compared_with_the_answer():
    problem, best = piped("llama3-8b", 4, 8, "full")
    _, slower = piped("llama3-8b", 8, 8, "full")
    _, flat = piped("llama3-8b", 8, 1, "full")
    answer = problem.evaluate(best)
    rows = split_runners_up(problem, answer, [problem.evaluate(slower), problem.evaluate(flat)])
    assert [r["layout"] for r in rows] == [slower.describe()]  # PP1 has nothing to split
    row = rows[0]
    assert sum(row["layers"]) == 32 and row["step_s"] < row["even_step_s"]
    assert row["beats_answer"] == (row["step_s"] < answer.step.total)
