"""The vectorised scoring against brute force: the enumeration baseline (bruteforce.enumerate_space)
finds brute force's optimum, and the search finds it too when every branch is left to CP-SAT
(the path of branches too large to score point by point)."""

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from trnopt.optimizer.search import spacebounds
from trnopt.optimizer.search.bruteforce import brute_force, enumerate_space
from trnopt.optimizer.search.driver import solve_space
from trnopt.optimizer.search.space import Space

from test_solver import small_problems

SETTINGS = dict(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 25)), deadline=None,
                derandomize=not os.environ.get("TRNOPT_EXAMPLES"), suppress_health_check=[HealthCheck.too_slow])


@settings(**SETTINGS)
@given(problem=small_problems())
def test_enumeration_equals_brute_force(problem):
    problem = replace(problem, objective="step-time")
    reference = brute_force(problem)
    found = enumerate_space(problem)
    if reference.best is None:
        assert found.best is None
        return
    assert found.best is not None and found.best.fits
    assert found.best.step.total == pytest.approx(reference.best.step.total, rel=1e-9)
    # every layout brute force scores keeps the rules, and the enumeration counts each once
    assert found.points == reference.evaluated


@settings(**SETTINGS)
@given(problem=small_problems())
def test_the_cpsat_path_equals_brute_force(problem):
    problem = replace(problem, objective="step-time")
    reference = brute_force(problem)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spacebounds, "MAX_POINTS", 0)  # no branch scored point by point: CP-SAT solves each
        results = [solve_space(Space(problem, lnc), time_limit=60, workers=1) for lnc in problem.lnc_values]
    if reference.best is None:
        assert all(r.status == "INFEASIBLE" for r in results)
        return
    assert all(r.status in ("OPTIMAL", "INFEASIBLE") for r in results)
    best = min((r for r in results if r.evaluation), key=lambda r: r.objective)
    assert best.objective <= reference.best.step.total * (1 + 1e-9) + best.rounding
