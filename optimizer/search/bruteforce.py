"""Exhaustive search over the same space and the same cost model: the solver's referee, one
layout at a time (``brute_force``) and vectorised (``enumerate_space``, the baseline of the
search's speed)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from trnopt.optimizer.cost.evaluate import Evaluation, objective_value
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.layout import every_nth
from trnopt.optimizer.search.space import Space


@dataclass(frozen=True)
class BruteForceResult:
    best: Evaluation | None
    evaluated: int
    seconds: float


def brute_force(problem: Problem, limit: int | None = None) -> BruteForceResult:
    """Score every layout of every LNC's space; the best that fits wins (``limit`` caps the count)."""
    start, best, best_value, count = time.perf_counter(), None, float("inf"), 0
    for lnc in problem.lnc_values:
        for layout in Space(problem, lnc).layouts():
            if limit is not None and count >= limit:
                return BruteForceResult(best, count, time.perf_counter() - start)
            count += 1
            e = problem.evaluate(layout)
            value = objective_value(e, problem.objective)
            if e.fits and value < best_value:
                best, best_value = e, value
    return BruteForceResult(best, count, time.perf_counter() - start)


@dataclass(frozen=True)
class Enumeration:
    best: Evaluation | None  # the fastest layout that fits (step time)
    points: int              # points scored: every point of every LNC's space that keeps the rules
    cpu_seconds: float


def enumerate_space(problem: Problem) -> Enumeration:
    """Step time at every point of every LNC's space, vectorised, with no pruning: each degree
    tuple's points (placement x recompute x ZeRO x micro-batch size x interleave x HSDP, after
    the space's rules) scored at once in NumPy by PointBounder over the cost model's own trees
    (SpaceBounds.place, with no cutoff and no cap), memory checked at each; the best re-scored
    by the float cost model. What a competent engineer would write instead of a search: the
    same space, the same trees, no Layout object per point."""
    from trnopt.optimizer.search.spacebounds import SpaceBounds  # the search's own module, imported on use

    start, points, best, least = time.process_time(), 0, None, math.inf
    for lnc in problem.lnc_values:
        bounds = SpaceBounds(Space(problem, lnc))
        layers = problem.workload.model.layers
        for branch in bounds.branches(prune=False):
            pp = branch.degrees["pp"]
            branch.plans = {(rc, zero): 0.0 for rc, zero in itertools.product(problem.recompute, problem.zero_stages)
                            if not every_nth(rc) or math.ceil(layers / pp) % every_nth(rc) == 0}
            points += bounds.place(branch, math.inf, most=math.inf)
            if branch.placements:  # not one number per point: enumeration cannot score this space
                raise ValueError(f"{problem.workload.model.name}: a point's value is an interval")
            if branch.best is not None and branch.floor < least:
                least, best = branch.floor, branch.best
    e = problem.evaluate(best) if best is not None else None
    return Enumeration(e, points, time.process_time() - start)
