"""Per-stage costs of uneven pipeline splits (cost/stages.py) against the cost model they come from."""

from dataclasses import replace

import pytest

from trnopt.optimizer.cost import stages
from trnopt.optimizer.cost.memory import memory_per_chip
from trnopt.optimizer.cost.steptime import step_time

from stage_layouts import piped

CASES = [("llama3-8b", 4, 8, "full", ""), ("llama3-70b", 8, 8, "selective", ""), ("llama3-70b", 4, 16, "every-4", ""),
         ("llama3-405b", 8, 8, "full", ""), ("mixtral-8x22b", 4, 16, "full", ""), ("llama3-8b", 4, 4, "op", "GPipe")]


@pytest.mark.parametrize("model,tp,pp,recompute,schedule", CASES)
def test_the_even_split_gives_the_layouts_step_time_exactly(model, tp, pp, recompute, schedule):
    problem, layout = piped(model, tp, pp, recompute, schedule=schedule)
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    even = costs.even_split()
    assert sum(even) == problem.workload.model.layers and max(even) == -(-problem.workload.model.layers // pp)
    assert costs.step(even) == problem.evaluate(layout).step.total  # exact: no tolerance
    assert max(costs.stage_seconds(even)) == costs.even_work


@pytest.mark.parametrize("model,tp,pp,recompute,schedule", CASES)
def test_stage_work_is_the_cost_models_work_at_every_layer_count(model, tp, pp, recompute, schedule):
    """work(n) = a n + d (n // k) + c against the cost model's W of a model with n layers a stage."""
    problem, layout = piped(model, tp, pp, recompute, schedule=schedule)
    w = problem.workload
    costs = stages.stage_costs(w, layout, problem.target, problem.headroom, problem.overlap)
    for n in (1, 3, 4, 5, 7, 9):
        st = step_time(replace(w, model=replace(w.model, layers=n * pp)), layout, problem.target, problem.overlap)
        assert costs.work(n) == pytest.approx(sum(getattr(st, k) for k in stages.WORK), rel=1e-9)


def test_a_lighter_last_stage_saves_the_head_and_a_heavier_one_costs_it():
    problem, layout = piped("llama3-8b", 4, 8)
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    t = costs.stage_seconds((4, 4, 4, 4, 4, 4, 4, 4))
    assert t[-1] - t[0] == pytest.approx(costs.head) and costs.head > 0
    assert costs.step((4, 4, 4, 4, 4, 4, 5, 3)) < costs.step((4,) * 8) < costs.step((3, 4, 4, 4, 4, 4, 4, 5))
    # the bubble scales the bottleneck: (1 + (p - 1) / m) per second of it under 1F1B
    m = layout.micro_batches(problem.workload)
    assert costs.pipeline_factor == 1 + 7 / m


@pytest.mark.parametrize("model,tp,pp,recompute,schedule", CASES[:4])
def test_stage_memory_keeps_the_layouts_state_and_activations(model, tp, pp, recompute, schedule):
    problem, layout = piped(model, tp, pp, recompute, schedule=schedule)
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    even = costs.even_split()
    whole = memory_per_chip(problem.workload, layout, problem.target)
    # the stages' state adds up to p times the layout's (the cost model spreads it evenly)
    state = sum(sum(costs.state_fixed[s]) + x * sum(costs.state_layer) for s, x in enumerate(even))
    assert state == pytest.approx(pp * whole.state, rel=1e-9)
    # 1F1B: the first stage holds min(m, p) micro-batches, the last one (and the logits), as memory.py
    m = layout.micro_batches(problem.workload)
    assert costs.act_layer[0] == pytest.approx(costs.act_layer[-1] * min(m, pp))
    # the fullest stage's activations are the layout's (the busier of the first and the last stage)
    # when p divides L (else the layout's count ceil(L / p) layers on the first stage too)
    if problem.workload.model.layers % pp == 0:
        assert max(costs.act_fixed[s] + x * costs.act_layer[s] for s, x in enumerate(even)) == pytest.approx(
            whole.activations, rel=1e-9)
        middle = costs.stage_bytes(even)[1:-1]
        assert costs.stage_bytes(even)[0] > max(middle) and list(middle) == sorted(middle, reverse=True)


def test_gpipe_holds_every_micro_batch_on_every_stage():
    problem, layout = piped("llama3-8b", 4, 4, "op", schedule="GPipe")
    costs = stages.stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    assert len(set(costs.act_layer)) == 1


def test_interleaved_layouts_and_mixed_models_are_refused():
    problem, layout = piped("llama3-8b", 4, 4)
    inter = replace(layout, interleave=2)
    assert "interleave 2" in stages.split_problem(problem.workload, inter)
    ds, ds_layout = piped("deepseek-v3", 8, 4)
    assert "dense and" in stages.split_problem(ds.workload, ds_layout)
    w = problem.workload
    assert "pp=4" in stages.split_problem(w, layout, (10, 10, 12))
    assert "at least one" in stages.split_problem(w, layout, (0, 10, 10, 12))
    assert "add up to 33" in stages.split_problem(w, layout, (8, 8, 8, 9))
    assert stages.split_problem(w, layout, (7, 9, 8, 8)) is None


@pytest.mark.parametrize("model,tp,pp,recompute,schedule", CASES)
def test_the_floor_over_every_split_is_the_stages_mean_less_the_extra_micro_batches(model, tp, pp, recompute, schedule):
    """split_memory_terms' proof, on the per-stage memory: on any split the stages' raw bytes add up to p times
    the floor's raw bytes plus A x_s (i_s - 1) each (the micro-batches in flight past one), so the fullest stage
    is at least the floor; and the floor is at most the layout's even memory."""
    import random
    from trnopt.optimizer.cost import factors as f
    from trnopt.optimizer.cost.memory import FRAGMENTATION_DIVISOR
    problem, layout = piped(model, tp, pp, recompute, schedule=schedule)
    w, L = problem.workload, problem.workload.model.layers
    costs = stages.stage_costs(w, layout, problem.target, problem.headroom, problem.overlap)
    point = f.decisions(layout, w)
    floor = sum(t.value(point) for t in stages.split_memory_terms(w, problem.target, layout.axes).values())
    assert floor <= memory_per_chip(w, layout, problem.target).total * (1 + 1e-12)
    grow, m = 1 + 1 / FRAGMENTATION_DIVISOR, layout.micro_batches(w)
    held = [stages.in_flight(layout.pipeline_schedule, m, pp, s) for s in range(pp)]
    one = costs.act_layer[-1] / held[-1]  # A: a layer's activations of one micro-batch
    rng = random.Random(0)
    for split in [costs.even_split(), (L - pp + 1,) + (1,) * (pp - 1), (1,) * (pp - 1) + (L - pp + 1,)] + [
            tuple(b - a for a, b in zip((0, *cuts), (*cuts, L))) for cuts in
            (sorted(rng.sample(range(1, L), pp - 1)) for _ in range(5))]:
        raw = [(x - costs.reserve) / grow for x in costs.stage_bytes(split)]
        extra = one * sum(x * (i - 1) for x, i in zip(split, held))
        assert sum(raw) - extra == pytest.approx(pp * (floor - costs.reserve) / grow, rel=1e-9)
        assert max(costs.stage_bytes(split)) >= floor * (1 - 1e-12)


@pytest.mark.parametrize("model,tp,pp,recompute,schedule", [c for c in CASES if c[4] != "GPipe"])
def test_the_numpy_screen_says_a_split_fits_exactly_when_one_does(model, tp, pp, recompute, schedule):
    """fits_some_split, on split_memory_parts' values at the layout, against the exact split test on
    stage_costs' per-stage memory, at usable HBM sizes around the least that fits some split."""
    import numpy as np
    from trnopt.optimizer.cost import factors as f
    from trnopt.optimizer.cost.memory import memory_terms
    from trnopt.optimizer.search.stagebottleneck import least_bottleneck
    from trnopt.optimizer.search.stagesplit import SplitData
    problem, layout = piped(model, tp, pp, recompute, schedule=schedule)
    w, t = problem.workload, problem.target
    costs = stages.stage_costs(w, layout, t, problem.headroom, problem.overlap)
    point = f.decisions(layout, w)
    trees = stages.split_memory_parts(w, t, layout.axes, memory_terms(w, t, layout.axes))
    parts = {k: np.array([tree.value(point)]) for k, tree in trees.items()}
    even = max(costs.stage_bytes(costs.even_split()))
    said = set()
    for scale in np.linspace(0.5, 1.2, 71):
        usable = even * scale
        fits = least_bottleneck(SplitData.of(replace(costs, usable=usable))) is not None
        screen = stages.fits_some_split(parts, w.model, pp, [layout.micro_batches(w)], usable, costs.reserve)
        assert bool(screen[0]) == fits, scale
        said.add(fits)
    assert said == {True, False}
