"""Exhaustive search over the same space and the same cost model: the solver's referee."""

from __future__ import annotations

import time
from dataclasses import dataclass

from trnopt.optimizer.cost.evaluate import Evaluation, objective_value
from trnopt.optimizer.cost.problem import Problem
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
