"""The joint layout-and-split search (search/jointsplit.py) against brute force: every layout of a
small space, each on every split of its layers (search/stageenum.py), scored by the cost model."""

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost import stages
from trnopt.optimizer.search import stageenum
from trnopt.optimizer.search.driver import solve
from trnopt.optimizer.search.jointsplit import JointBudget, head_share, joint_optimum, uneven_answer
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.search.stagebottleneck import least_bottleneck
from trnopt.optimizer.search.stagesplit import SplitData, split_layout

from test_solver import small_problems
from test_stagesplit import split_spaces

SETTINGS = dict(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 6)), deadline=None,
                derandomize=not os.environ.get("TRNOPT_EXAMPLES"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
REFEREED = 1200  # layouts brute force scores at most in one example (each split every way: about 2 ms a layout)


def referee(problem):
    """(the least step of the joint space over every layout whose even split fits the HBM, the same over
    those whose even split does not, None where none fits): brute force, no bound used. A layout that cannot be split counts
    as it is; one that can, on its best split by the per-stage memory (stageenum: every split)."""
    inside = outside = None
    for lnc in problem.lnc_values:
        for layout in Space(problem, lnc).layouts():
            e = problem.evaluate(layout)
            step = e.step.total if e.fits else None
            if layout.pp > 1 and not stages.split_problem(problem.workload, layout):
                costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
                _, where, _ = stageenum.best(SplitData.of(costs))
                step = None
                if where is not None:
                    split = problem.evaluate(replace(layout, stage_layers=where))
                    step = split.step.total if split.fits else None
            if step is None:
                continue
            if e.fits:
                inside = step if inside is None else min(inside, step)
            else:
                outside = step if outside is None else min(outside, step)
    return inside, outside


@st.composite
def piped_problems(draw):
    """small_problems with a step-time objective and a model of 4 to 12 layers and a 32k vocabulary (room
    for uneven splits: an LM head heavier than a layer), of at most REFEREED layouts."""
    problem = draw(small_problems())
    layers = draw(st.sampled_from([4, 5, 6, 9, 12]))
    model = replace(problem.workload.model, layers=layers, vocab=32000)
    problem = replace(problem, objective="step-time", workload=replace(problem.workload, model=model))
    assume(sum(Space(problem, lnc).size() for lnc in problem.lnc_values) <= REFEREED)
    return problem


@settings(**SETTINGS)
@given(problem=piped_problems())
def test_the_joint_optimum_equals_brute_force(problem):
    try:
        result = solve(problem, time_limit=600, workers=1, top=0, uncertainty=0.0)
    except Exception as exc:  # nothing fits with even stages (the joint search starts from the even answer)
        assert type(exc).__name__ == "InfeasibleError"
        assert referee(problem)[0] is None
        return
    assert result.status == "OPTIMAL"
    uneven_answer(result)
    joint = result.uneven_stages["joint"]
    found = [x for x in referee(problem) if x is not None]  # every layout, every split
    if not found:  # the search's layout fits with even stages, but no layout on any split of the per-stage memory
        assert joint["status"] == "INFEASIBLE"
        return
    best = min(found)
    assert joint["status"] == "OPTIMAL" and joint["gap"] == 0.0 and joint["answer"]
    assert result.best.fits and result.best.step.total == pytest.approx(best, rel=1e-9)
    assert joint["step_s"] == result.best.step.total


@pytest.mark.parametrize("chips,batch,hbm", [(4, 8, 1), (6, 12, 1), (6, 12, 0.5)])
def test_a_layout_the_even_search_ranks_lower_wins_on_its_split(chips, batch, hbm):
    """A 9- or 6-layer model with a 32k vocabulary on a few chips of 1 GiB or less and slow links: the
    search's fastest layout with even stages (TP1 x PP2 x DP2 under full recompute; TP1 x PP1 x DP6;
    TP2 x PP3, which fits no split of its stages by the per-stage memory) is not the best once every
    layout may split its layers (TP1 x PP2 x DP2 with no recompute, whose even split does not fit but
    6,3 does; TP1 x PP3 x DP2, its LM head stage lighter; an interleaved layout, which cannot be split),
    and the joint search finds brute force's optimum."""
    problem = _case(chips, batch, hbm, layers=9 if hbm == 1 else 6)
    result = solve(problem, time_limit=600, workers=1, top=0, uncertainty=0.0)
    even_best = result.best
    uneven_answer(result)
    inside, outside = referee(problem)
    joint = result.uneven_stages["joint"]
    assert joint["status"] == "OPTIMAL" and joint["answer"]
    assert result.best.step.total == pytest.approx(min(inside, outside or inside), rel=1e-9)
    assert joint["replaced"].startswith(even_best.layout.describe()[:-1])
    assert replace(result.best.layout, stage_layers=()) != even_best.layout


def test_a_layout_whose_even_split_does_not_fit_wins_on_an_uneven_split():
    """0.6 GiB chips: brute force's joint optimum is TP2 x PP2, whose even split 4,5 does not fit (its
    last stage holds the FP32 logits and the output layer) but 6,3 does; every layout whose even split
    fits is slower. The joint search admits it by the floor over every split (cost/stages.py
    ``split_memory_terms``) and finds it."""
    problem = _case(4, 8, 0.6, 9)
    result = solve(problem, time_limit=600, workers=1, top=0, uncertainty=0.0)
    uneven_answer(result)
    inside, outside = referee(problem)
    assert inside is not None and outside is not None and outside < inside * (1 - 1e-6)
    joint = result.uneven_stages["joint"]
    assert joint["status"] == "OPTIMAL" and joint["gap"] == 0.0 and joint["answer"]
    assert result.best.fits and result.best.step.total == pytest.approx(outside, rel=1e-9)
    assert not problem.evaluate(replace(result.best.layout, stage_layers=())).fits  # its even split does not


def _case(chips: int = 4, batch: int = 8, hbm: float = 1, layers: int = 9):
    """A small machine (``chips`` chips of ``hbm`` GiB on a 1 GB/s ring) and a tiny model whose LM head
    outweighs a layer."""
    from trnopt.optimizer.cost.problem import Problem
    from trnopt.optimizer.model.target import parse_target
    from trnopt.optimizer.model.workload import Training, Workload, parse_model
    target = parse_target({
        "name": "small", "description": "test target", "instance": "box", "chips_per_instance": chips,
        "runtime_reserve_gib": 0,
        "chip": {"name": "chip", "physical_cores": 1, "lnc_default": 1, "lnc_allowed": [1], "hbm_gib": hbm,
                 "hbm_bandwidth_gbs": 1000, "bf16_tflops": 100, "fp8_tflops": 200, "sbuf_kib_per_partition": 192,
                 "on_chip_bandwidth_gbs": 1000},
        "axes": [{"name": "a0", "size": chips, "kind": "ring", "bandwidth_gbs": 1, "latency_us": 1}],
        "scale_out": {"name": "net", "bandwidth_gbps_per_instance": 800, "latency_us": 10},
        "reliability": {"instance_mtbf_hours": 1000, "checkpoint_gbs_per_instance": 5, "restart_minutes": 5},
        "efficiency": {"matmul": 0.7, "elementwise": 0.5, "microbatch_overhead_us": 0, "collective_fixed_share": 0.1,
                       "fitted_on": "test"},
        "engines": {"tensor_ghz": 1.0, "pe_rows": 128, "stationary_fmax": 128, "moving_fmax": 512,
                    "matmul_min_cycles": 64, "vector_ghz": 1.0, "vector_lanes": 128, "scalar_ghz": 1.0,
                    "scalar_lanes": 128},
    }, "test")
    model = parse_model({"name": "tiny", "layers": layers, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 2048,
                         "vocab": 32000}, "test")
    return Problem(Workload(model, Training(seq=2048, global_batch=batch)), target, 1, headroom=0.1)


@settings(**SETTINGS)
@given(data=split_spaces())
def test_the_monotone_test_finds_the_enumerations_optimum(data):
    found = least_bottleneck(data)
    top, _, _ = stageenum.best(data)
    if top is None:
        assert found is None
        return
    bottleneck, split = found
    assert bottleneck == top == data.bottleneck(split)
    assert sum(split) == data.layers and min(split) >= 1 and data.fits(split)


def test_the_head_share_bounds_every_split_of_a_real_layout():
    """Any split of a layout is at most f head faster than its even split (the pigeonhole floor)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "cost"))
    from stage_layouts import piped
    for model, tp, pp in (("llama3-8b", 4, 8), ("llama3-8b", 8, 4), ("llama3-70b", 8, 8)):
        problem, layout = piped(model, tp, pp, "full")
        costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
        share = head_share(problem, layout.lnc, tp, 1, pp, layout.micro_batch, layout.micro_batches(problem.workload))
        assert share == pytest.approx(costs.pipeline_factor * costs.head, rel=1e-12)
        _, where = least_bottleneck(SplitData.of(costs))  # the best split (refereed by the enumeration above)
        assert costs.step(where) >= costs.even_step - share * (1 + 1e-9)


def test_a_spent_budget_reports_the_gap():
    problem = _case()
    result = solve(problem, time_limit=600, workers=1, top=0, uncertainty=0.0)
    chosen, info = split_layout(problem, result.best)
    assert "layers" in info  # a member of the joint space: the search's layout on its best split
    spent = joint_optimum(problem, chosen, problem.score(result.best), JointBudget(layouts=0))
    assert not spent.proven and spent.stopped == "work" and 0 < spent.gap < 1 and spent.bound < spent.step
    full = joint_optimum(problem, chosen, problem.score(result.best))
    assert full.proven and full.step < chosen.step.total and full.step >= spent.bound


def test_the_memory_screens_over_every_split_in_numpy_agree_with_the_cost_model():
    """SpaceBounds with ``split``, on every point of a small space: the floor over every split (cost/stages.py
    ``split_memory_terms``, scored in NumPy) is the tree's value at that point's layout and never above its
    even memory; ``fits_some_split`` on the per-stage parts says yes exactly where the exact split test on
    the cost model's per-stage memory (``least_bottleneck``) finds a split that fits; the degree tuples the
    even rule keeps, the split rule keeps too, and some points only the split rule keeps."""
    import numpy as np
    from trnopt.optimizer.cost import factors as f
    from trnopt.optimizer.search.spacebounds import SpaceBounds
    problem = _case(4, 8, 0.6, 9)
    bounds = SpaceBounds(Space(problem, 1))
    terms = stages.split_memory_terms(problem.workload, problem.target, bounds.space.axes)
    even = {tuple(b.degrees.values()) for b in bounds.branches()}
    relaxed = bounds.branches(split=True)
    assert even <= {tuple(b.degrees.values()) for b in relaxed}
    said, only_split = set(), 0
    for branch in relaxed:
        bounds.refine(branch, float("inf"), split=True)
        if not branch.plans:
            continue
        (placements, plans, sizes, inters, hsdps), chunks = bounds.points(branch, split=True)
        pp, dp = branch.degrees["pp"], branch.degrees["ep"] * branch.degrees["edp"]
        for grid, _, _, memory, rules, parts in chunks:
            assert np.all(parts["floor"] <= memory * (1 + 1e-12))
            counts = np.array([problem.workload.training.global_batch // (dp * b) for b in sizes])[grid[2]]
            screen = stages.fits_some_split(parts, problem.workload.model, pp, counts, bounds.usable,
                                            problem.target.runtime_reserve_bytes)
            only_split += int(np.sum(rules & (parts["floor"] <= bounds.usable) & (memory > bounds.usable)))
            for k in np.flatnonzero(rules):
                i, plan, size, inter, on = (int(g[k]) for g in grid)
                layout = bounds.layout(branch.degrees, placements[i], plans[plan], sizes[size], inters[inter], hsdps[on])
                point = f.decisions(layout, problem.workload)
                assert parts["floor"][k] == pytest.approx(sum(t.value(point) for t in terms.values()), rel=1e-9)
                if pp > 1 and layout.interleave == 1:
                    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom,
                                               problem.overlap)
                    fits = least_bottleneck(SplitData.of(costs)) is not None
                    assert bool(screen[k]) == fits
                    said.add(fits)
    assert said == {True, False} and only_split > 0
