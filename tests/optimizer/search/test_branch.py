"""The branch and bound's parts against the cost model and the enumerated space: its floors
never exceed a layout's step time (and meet it where nothing is left to range), its
placements are the space's, and its runner-ups are the next best degree tuples."""

import math
import os
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings

from trnopt.optimizer.cost.steptime import TERMS
from trnopt.optimizer.model.layout import DIMS
from trnopt.optimizer.search.spacebounds import FAMILIES, SpaceBounds
from trnopt.optimizer.search.cpsat import LayoutModel
from trnopt.optimizer.search.driver import solve
from trnopt.optimizer.search.space import Space

from test_solver import small_problems

EXAMPLES = int(os.environ.get("TRNOPT_EXAMPLES", 15))
SETTINGS = dict(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TRNOPT_EXAMPLES"),
                suppress_health_check=[HealthCheck.too_slow])


def _degrees(layout):
    return {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "edp": layout.dp // layout.ep, "pp": layout.pp}


def _rows(layout):
    rows = dict(zip(DIMS, layout.placement))
    return {"span.tp": rows["tp"], "span.cp": rows["cp"], "span.ep": rows["ep"], "span.edp": rows["dp"],
            "span.pp": rows["pp"], "span.dp": tuple(a * b for a, b in zip(rows["ep"], rows["dp"]))}


def _spaces(problem):
    """(space, its bounds) per LNC."""
    for lnc in problem.lnc_values:
        space = Space(problem, lnc)
        yield space, SpaceBounds(LayoutModel(space))


def _point_floor(bounds: SpaceBounds, layout) -> float:
    """The PointBounder's step floor at exactly this layout's point (HSDP left to range)."""
    degrees, rows = _degrees(layout), _rows(layout)
    base = bounds.ranges(degrees)
    lists = {"recompute": (layout.recompute,), "zero": (layout.zero,), "micro_batch": (layout.micro_batch,),
             "micro_batches": (layout.micro_batches(bounds.problem.workload),), "interleave": (layout.interleave,)}
    lists.update({key: [bounds._span(row)] for key, row in rows.items()})
    index = {key: np.zeros(1, dtype=int) for key in lists}
    ranged = {k: base.values[k] for k in ("tp", "cp", "ep", "pp", "edp", "dp", "hsdp", "ep_fold")}
    steps = [bounds.lm.steps[name] for name in TERMS if name != "tp_raw"]
    tags = {k: (k, tuple(v)) for k, v in {**lists, **ranged}.items()}
    values = bounds.points_bounder.intervals(steps, lists, ranged, index, tags)
    return float(sum(np.broadcast_to(lo, (1,)) for lo, _ in values)[0])


@settings(**SETTINGS)
@given(problem=small_problems())
def test_floors_hold_below_every_layout_and_meet_it_at_its_point(problem):
    for space, bounds in _spaces(problem):
        floors = {tuple(b.degrees[d] for d in FAMILIES): b for b in bounds.branches()}
        for layout in list(space.layouts())[:400]:
            e = problem.evaluate(layout)
            step = e.step.total
            key = tuple(_degrees(layout)[d] for d in FAMILIES)
            if e.fits:
                # a branch the coarse floors drop holds no layout that fits
                assert key in floors, f"{layout.describe()} fits but its branch was dropped"
                assert floors[key].floor <= step * (1 + 1e-9), (layout.describe(), floors[key].floor, step)
                # the floor over every term (the search's second look at a branch) holds too
                cheap = floors[key].floor
                bounds.deepen(floors[key])
                assert cheap <= floors[key].floor <= step * (1 + 1e-9), (layout.describe(), floors[key].floor, step)
            plan = {"recompute": layout.recompute, "zero": layout.zero}
            plan_floor, _ = bounds.floors(bounds.ranges(_degrees(layout), plan))
            assert plan_floor <= step * (1 + 1e-9), (layout.describe(), plan_floor, step)
            point = _point_floor(bounds, layout)
            assert point <= step * (1 + 1e-9), (layout.describe(), point, step)
            if len(space.hsdp_values) == 1:  # nothing left to range: the floor is the step time
                assert math.isclose(point, step, rel_tol=1e-9), (layout.describe(), point, step)


@settings(**SETTINGS)
@given(problem=small_problems())
def test_placements_are_the_spaces(problem):
    for space, bounds in _spaces(problem):
        expected: dict[tuple, set] = {}
        for layout in space.layouts():
            expected.setdefault(tuple(_degrees(layout)[d] for d in FAMILIES), set()).add(
                tuple(sorted(_rows(layout).items())))
        for key, rows in expected.items():
            found = {tuple(sorted(p.items())) for p in bounds.placements(dict(zip(FAMILIES, key)))}
            # the enumerator may hold placements that no memory plan makes valid, never fewer
            assert rows <= found, f"{key}: {len(rows - found)} placements of the space are not enumerated"


@settings(**SETTINGS)
@given(problem=small_problems())
def test_runner_ups_are_the_next_best_degree_tuples(problem):
    problem = replace(problem, objective="step-time")
    best_per_tuple: dict[tuple, float] = {}
    for lnc in problem.lnc_values:
        for layout in Space(problem, lnc).layouts():
            e = problem.evaluate(layout)
            if e.fits:
                key = (lnc, *(_degrees(layout)[d] for d in FAMILIES))
                best_per_tuple[key] = min(best_per_tuple.get(key, math.inf), e.step.total)
    if not best_per_tuple:
        return
    result = solve(problem, time_limit=60, workers=1, top=2)
    assert result.status == "OPTIMAL"
    got = [result.best.step.total] + [e.step.total for e in result.runners_up]
    expected = sorted(best_per_tuple.values())[:3]
    assert len(got) == len(expected), (got, expected)
    # each within the integer model's rounding of the tuple's brute-force best (a tick is 2^-24 of compute)
    for g, x in zip(got, expected):
        assert math.isclose(g, x, rel_tol=1e-6), (got, expected)
