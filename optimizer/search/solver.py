"""CP-SAT solves bounded by work, with a wall-clock safety stop that holds whatever CP-SAT does meanwhile.

Work, not time, decides between layouts: every solve runs on a fixed worker count with a
budget in CP-SAT's deterministic time (``max_deterministic_time``, a count of the solver's
own work), so a loaded machine finds the same layouts as an idle one. Wall-clock time is
only the command's safety stop (``--time-limit``), read through search/clock.py, and a solve or a step
the safety stop ends is reported as such (``BoundedSolver.wall_stopped``, search/clock.py),
since its answer may then differ from machine to machine.

CP-SAT checks its time limit between steps, and some steps do not count towards it: on the
model of 1,600 Trn2 UltraServers one presolve pass (``PresolveToFixPoint``) takes seconds
and charges no deterministic time, and on a loaded machine a 28.6 s limit ended after
42 s. A command that promises ``--time-limit`` cannot wait for that, so each solve runs in
a forked child: the parent reads the child's response until the limit plus ``GRACE_S``,
then kills it and reports UNKNOWN (no solution, bound 0), as CP-SAT itself would at its
limit. A child that dies without a response (CP-SAT aborts on a failed internal check)
raises SolverCrash instead of passing for a time-out. Where fork is unavailable the solve
runs in this process, bounded only by CP-SAT.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import time

from ortools.sat.python import cp_model
from ortools.sat.python import cp_model_helper as cmh

from trnopt.optimizer.defaults import SOLVE_DETERMINISTIC_S

STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
          cp_model.MODEL_INVALID: "MODEL_INVALID", cp_model.UNKNOWN: "UNKNOWN"}

GRACE_S = 1.0  # past its own limit, CP-SAT is given this long to report before it is stopped
class SolverCrash(RuntimeError):
    """CP-SAT ended without a response (a signal or a non-zero exit of the solving process)."""


class BoundedSolver:
    """The CpSolver interface trnopt uses (parameters, solve, value, boolean_value,
    objective_value, best_objective_bound), with ``solve`` bounded in wall-clock time."""

    def __init__(self) -> None:
        self._solver = cp_model.CpSolver()
        self.parameters = self._solver.parameters
        self._response: cmh.CpSolverResponse | None = None
        self.timed_out = False  # the last solve was stopped at its limit plus GRACE_S

    def solve(self, model: cp_model.CpModel) -> cmh.CpSolverStatus:
        self.timed_out = False
        if not hasattr(os, "fork"):
            self._solver.solve(model)
            self._response = self._solver.response_proto
            return self._response.status
        text = self._solve_in_child(model, self.parameters.max_time_in_seconds + GRACE_S)
        self._response = cmh.CpSolverResponse()
        if text is None:
            self.timed_out = True
            self._response.status = cp_model.UNKNOWN
        else:
            self._response.parse_text_format(text)
        return self._response.status

    def _solve_in_child(self, model: cp_model.CpModel, wall_s: float) -> str | None:
        """The child's response in text format, or None when it did not end within ``wall_s``."""
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: solve, write the response, leave without running the parent's exit code
            code = 1
            try:
                os.close(read_end)
                # one line on stderr is the parent's to write (SolverCrash): a failed CP-SAT check's
                # own report, or a fault handler's traceback, would add more
                faulthandler.disable()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                self._solver.solve(model)
                data = str(self._solver.response_proto).encode()
                while data:
                    data = data[os.write(write_end, data):]
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        deadline = time.monotonic() + wall_s
        chunks, done = [], False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_end], [], [], left)[0]:
                    break
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    done = True
                    break
                chunks.append(chunk)
        finally:
            os.close(read_end)
            if not done:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        if not done:
            return None
        if status != 0 or not chunks:
            raise SolverCrash(f"CP-SAT ended without an answer ({_describe(status)})")
        return b"".join(chunks).decode()

    def _checked(self) -> cmh.CpSolverResponse:
        if self._response is None:
            raise RuntimeError("solve() has not been called")
        return self._response

    def value(self, expression) -> int:
        return cmh.ResponseHelper.value(self._checked(), expression)

    def boolean_value(self, literal) -> bool:
        return cmh.ResponseHelper.boolean_value(self._checked(), literal)

    @property
    def deterministic_time(self) -> float:
        """CP-SAT's deterministic seconds in the last solve (its count of work, the same on any machine)."""
        return self._checked().deterministic_time

    @property
    def wall_stopped(self) -> bool:
        """The last solve ended by its wall-clock limit (the safety stop), not by its work: it was
        neither settled (OPTIMAL, INFEASIBLE) nor out of deterministic time."""
        response = self._checked()
        if response.status in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
            return False
        return self.timed_out or response.deterministic_time < self.parameters.max_deterministic_time * (1 - 1e-9)

    @property
    def objective_value(self) -> float:
        return self._checked().objective_value

    @property
    def best_objective_bound(self) -> float:
        return self._checked().best_objective_bound


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def solver_for(time_limit: float, workers: int, seed: int, interleave: bool = True,
               deterministic_limit: float | None = None) -> BoundedSolver:
    """A solver with its parameters and their reasons: ``deterministic_limit`` (default
    defaults.SOLVE_DETERMINISTIC_S) is its work budget, ``time_limit`` only the safety stop."""
    solver = BoundedSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    # a budget in CP-SAT's deterministic time: the same answer on a loaded machine as on an idle one
    solver.parameters.max_deterministic_time = SOLVE_DETERMINISTIC_S if deterministic_limit is None \
        else deterministic_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # interleaved search makes several workers deterministic for a fixed seed and count
    solver.parameters.interleave_search = interleave and workers > 1
    return solver
