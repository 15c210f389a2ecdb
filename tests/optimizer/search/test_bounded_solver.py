"""BoundedSolver: the answer of CP-SAT, and an end by the wall-clock limit whatever the solve does."""

from __future__ import annotations

import os
import time

import pytest
from ortools.sat.python import cp_model

from trnopt.optimizer.search import solver as S


def small_model():
    m = cp_model.CpModel()
    x, y = m.new_int_var(0, 10, "x"), m.new_int_var(0, 10, "y")
    b = m.new_bool_var("b")
    m.add(x + y >= 7)
    m.add(x >= 5).only_enforce_if(b)
    m.minimize(3 * x + 2 * y - 4 * b)
    return m, x, y, b


def test_bounded_solve_gives_cp_sats_answer():
    m, x, y, b = small_model()
    reference = cp_model.CpSolver()
    assert reference.solve(m) == cp_model.OPTIMAL
    bounded = S.solver_for(10.0, 1, 0)
    assert S.STATUS[bounded.solve(m)] == "OPTIMAL" and not bounded.timed_out
    assert bounded.objective_value == reference.objective_value
    assert bounded.best_objective_bound == reference.best_objective_bound
    assert bounded.value(3 * x + 2 * y) == reference.value(3 * x + 2 * y)
    assert bounded.boolean_value(b) == reference.boolean_value(b)


def test_infeasible_is_reported():
    m = cp_model.CpModel()
    x = m.new_int_var(0, 3, "x")
    m.add(x >= 5)
    assert S.STATUS[S.solver_for(10.0, 1, 0).solve(m)] == "INFEASIBLE"


class _Stalls:
    """Stands in for CpSolver in the child: a solve step that ignores the time limit."""

    def solve(self, model):
        time.sleep(600)


class _Aborts:
    def solve(self, model):
        os.abort()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the bound needs fork")
def test_a_solve_that_ignores_its_limit_is_stopped_and_reads_unknown(monkeypatch):
    monkeypatch.setattr(S, "GRACE_S", 0.2)
    m, *_ = small_model()
    bounded = S.solver_for(0.1, 1, 0)
    bounded._solver = _Stalls()  # the child would sleep 600 s; the parent stops it at 0.3 s
    assert S.STATUS[bounded.solve(m)] == "UNKNOWN"
    assert bounded.timed_out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the bound needs fork")
def test_a_crashed_solve_is_an_error_not_a_time_out():
    m, *_ = small_model()
    bounded = S.solver_for(30.0, 1, 0)
    bounded._solver = _Aborts()
    with pytest.raises(S.SolverCrash, match="SIGABRT"):
        bounded.solve(m)

