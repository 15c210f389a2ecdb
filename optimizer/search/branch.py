"""Branch and bound over degrees, memory plans and placements; each promising degree tuple scored
at every point in NumPy, or, past what that can score, solved exactly by CP-SAT.

Why. One CP-SAT model of the whole space (cpsat.LayoutModel) proves small spaces at once,
but its step time is a sum of products of tables, whose linear relaxation bounds the step
near 0: on mixture-of-experts models and at 100,000 chips it found layouts and proved
nothing (gap 100% at its limit). Most of that space is ruled out by arithmetic alone: a
degree tuple whose compute or memory cannot beat the best layout found needs no search.

Method (best-first branch and bound; Land and Doig 1960, the form in Nemhauser and
Wolsey, *Integer and Combinatorial Optimization*, 1988, ch. II.4). One queue holds every
LNC's branches, lowest floor first; what comes up is taken one level deeper:
1. A branch is a degree tuple (tp, cp, ep, edp, pp) whose product is the rank count. Its
   floor is a lower bound of the step time over every layout with those degrees
   (search/bounds.py: interval arithmetic on the cost model's own trees, each decision
   ranging over what the degrees leave it: the placement rows of each family's degree,
   the micro-batch sizes that divide the batch, ...). A tuple whose memory floor exceeds
   the usable HBM is dropped.
2. Refined: its (recompute, ZeRO) plans are bounded one by one, in step time and memory;
   a plan that cannot fit or cannot beat the cutoff is dropped, and the branch's floor
   becomes its best plan's.
3. Placed: every point of the branch (placement x plan x micro-batch size x interleave x
   HSDP) is scored at once in NumPy, memory too (SpaceBounds.place). With every decision
   fixed a point's interval is one number, the cost model's own step time, so the best
   point that fits is the branch's best layout: re-scored by the float cost model, it is
   offered at once and the branch is settled. (Vectorised scoring beat a CP-SAT solve per
   placement on every preset, benchmarks/solver_scaling.py.) A branch with more points
   than MAX_POINTS, or whose points were not exact, goes on to 4, each placement that
   could beat the cutoff on its own at its least point's floor (or the branch whole).
4. Solved: a placement that comes up is solved by the space's LayoutModel (built on first
   need) with the tuple's degrees and the placement's rows fixed, its plans limited to
   the surviving ones and its objective capped at the cutoff (``LayoutModel.restricted``);
   CP-SAT then chooses the memory plan, micro-batch size, interleave and HSDP under all of
   the model's rules.
The cutoff is the k-th best objective found, k = 1 + the runner-ups asked for, each from a
different (LNC, degree tuple). The search stops when the least floor left is not below it,
or when its work budget (nodes taken from the queue, points bounded, CP-SAT deterministic
seconds: counts, not seconds, so the answer is the same on any machine) runs out, or at
the wall-clock safety stop, which is reported as such.

Why the split loses nothing. Every layout of the space has exactly one LNC, degree tuple,
(recompute, ZeRO) plan and placement. Whatever is dropped or left in the queue has a floor
not below the cutoff, and the floors bound every layout beneath them from below, so none
of those layouts would enter the best k. A placed branch's best point is the minimum of
the cost model over all of its points, and what is solved is the monolithic model with
some literals fixed: the same integer objective and rules, so its optimum is the
monolithic model's optimum over that part, and the best of the parts is the monolithic
optimum (the brute-force referee, tests/optimizer/search/test_solver.py and
test_enumeration.py, with and without the CP-SAT path, checks this on enumerable spaces; tests/optimizer/search/test_branch.py checks that the floors never
exceed a layout's step time). A stop leaves parts unsettled: the gap is then against the
least of their floors and CP-SAT bounds.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.search.clock import SafetyStop, clock, interruptible
from trnopt.optimizer.search.spacebounds import EXACT, SLACK, SpaceBounds


@dataclass
class BranchResult:
    """The best layouts found, one per degree tuple, best first, and what was proven."""

    found: list[tuple[float, Evaluation]] = field(default_factory=list)  # (score, evaluation)
    bound: float = math.inf   # seconds: no layout of the space is faster
    proven: bool = False      # the search ended by its bounds: found holds the best k (all, if fewer)
    branches: int = 0         # degree tuples bounded
    solves: int = 0           # of them, solved with CP-SAT
    nodes: int = 0            # branches and placements taken from the queue
    points: int = 0           # points scored in NumPy
    stopped: str = ""         # what ended the search before its bounds did: "work" (the budget) or "time" (the
                              # safety stop, machine-dependent)
    rounding: float = 0.0     # seconds: the best's integer objective's rounding bound


@dataclass(frozen=True)
class Budget:
    """The work a search may do before it stops with its gap: counts, never seconds, so that
    the same inputs give the same answer on any machine."""

    nodes: int = defaults.SEARCH_NODES        # branches and placements taken from the queue
    points: int = defaults.SEARCH_POINTS      # points bounded in NumPy (SpaceBounds.place)
    deterministic_s: float = defaults.SEARCH_DETERMINISTIC_S  # CP-SAT deterministic seconds over all solves
    per_solve_s: float = defaults.SOLVE_DETERMINISTIC_S       # CP-SAT deterministic seconds per solve


def search(spaces: list[SpaceBounds], deadline: float, keep: int = 1, cutoff: float = math.inf, seed: int = 0,
           budget: Budget = Budget(), known: tuple[Layout, ...] = ()) -> BranchResult:
    """The best ``keep`` layouts of distinct (LNC, degree tuple) branches of ``spaces`` that beat
    ``cutoff`` (seconds), within ``budget``: one queue for every LNC, so the work goes where the
    floors are lowest. ``known`` layouts (the greedy hint) are incumbents from the start; their
    branches are still searched. ``deadline`` (on solver.clock) is the safety stop only: when it
    ends the search, ``result.stopped`` says so."""
    problem = spaces[0].problem
    result = BranchResult()
    try:
        with interruptible(deadline):
            branches = [b for s in spaces for b in s.branches()]
    except SafetyStop:
        result.bound, result.stopped = 0.0, "time"
        return result
    result.branches = len(branches)
    best: dict[tuple, tuple[float, Evaluation, float]] = {}  # branch key -> (score, evaluation, rounding)

    def offer(e: Evaluation, rounding: float) -> None:
        key, score = _key(e.layout), problem.score(e)
        if key not in best or score < best[key][0]:
            best[key] = (score, e, rounding)

    def limit() -> float:  # the k-th best score found, or the cutoff
        scores = sorted(s for s, _, _ in best.values())
        return min(cutoff, scores[keep - 1] if len(scores) >= keep else math.inf)

    for layout in known:
        e = problem.evaluate(layout)
        if e.fits and problem.score(e) < cutoff:
            offer(e, 0.0)
    # the queue holds branches, and once a branch is placed, its placements: (floor, count, branch, rows)
    queue = [(b.floor, i, b, None) for i, b in enumerate(branches)]
    heapq.heapify(queue)
    count = itertools.count(len(queue))
    unsettled = math.inf  # a bound on the branch a stop left unsettled
    spent = 0.0           # CP-SAT deterministic seconds
    while queue and queue[0][0] < limit() * (1 + SLACK):
        stop = "time" if clock() >= deadline else "work" if (
            result.nodes >= budget.nodes or result.points >= budget.points or spent >= budget.deterministic_s) else ""
        if stop:
            unsettled, result.stopped = queue[0][0], stop
            break
        result.nodes += 1
        floor, _, branch, rows = heapq.heappop(queue)
        bounds = branch.space
        if not branch.floored:
            bounds.deepen(branch)
            heapq.heappush(queue, (branch.floor, next(count), branch, None))
            continue
        if rows is None and branch.plans is None:
            bounds.refine(branch, limit())
            if branch.plans:
                heapq.heappush(queue, (branch.floor, next(count), branch, None))
            continue
        if rows is None and not branch.placed:
            result.points += bounds.place(branch, limit())
            if branch.best is not None:
                if _offer_exact(problem, branch.best, branch.floor, offer):
                    continue
                branch.placements = None  # the float model disagrees: CP-SAT settles the branch whole
            # each placement that could beat the cutoff is solved on its own; a branch with too
            # many to bound goes to CP-SAT whole
            for f, r in branch.placements if branch.placements is not None else [(branch.floor, None)]:
                if branch.plans:
                    heapq.heappush(queue, (f, next(count), branch, r))
            continue
        try:
            with interruptible(deadline):  # the model's build checks no clock
                lm = bounds.lm
        except SafetyStop:
            unsettled, result.stopped = floor, "time"
            break
        model = lm.restricted(branch.degrees, branch.plans, limit() * (1 + SLACK), rows)
        status, solver = _solve_branch(model, deadline, seed, min(budget.per_solve_s, budget.deterministic_s - spent))
        spent += solver.deterministic_time
        result.solves += 1
        if status in ("OPTIMAL", "FEASIBLE"):
            from trnopt.optimizer.search.cpsat import check_agreement  # OR-Tools: imported when a branch needs it
            e = problem.evaluate(lm.layout(solver))
            check_agreement(lm, solver, e)
            offer(e, lm.objective.error(solver.value) * lm.objective_unit)
        if status not in ("OPTIMAL", "INFEASIBLE"):  # a limit ended this solve
            unsettled = max(floor, solver.best_objective_bound * lm.objective_unit)
            result.stopped = "time" if solver.wall_stopped else "work"
            break
    ranked = sorted(best.values(), key=lambda t: t[0])[:keep]
    result.found = [(score, e) for score, e, _ in ranked]
    result.rounding = ranked[0][2] if ranked else 0.0
    left = min(unsettled, queue[0][0] if queue else math.inf)
    result.bound = min(left, ranked[0][0]) if ranked else left
    result.proven = left >= limit() * (1 + SLACK)
    return result


def _solve_branch(model, deadline: float, seed: int, deterministic_s: float):
    """(status name, solver) of one branch's restricted CP-SAT model, within ``deterministic_s``."""
    from trnopt.optimizer.search.solver import STATUS, solver_for  # OR-Tools: imported when a branch needs it
    # one worker: a branch's model is small, and the portfolio's start-up cost more than
    # it saved on them (benchmarks/solver_scaling.py); deterministic for a seed besides
    solver = solver_for(deadline - clock(), 1, seed, deterministic_limit=deterministic_s)
    # no probing in presolve: on these small models it cost more than it pruned (the 43 branch
    # solves of deepseek-v3 on 4 trn2u: 38.2 s with it, 30.3 s without)
    solver.parameters.cp_model_probing_level = 0
    return STATUS[solver.solve(model)], solver


def _offer_exact(problem, layout: Layout, value: float, offer) -> bool:
    """Offer a branch's best point (SpaceBounds.place) once the float cost model agrees with its
    value and that it fits; False (the branch then goes to CP-SAT) if not."""
    e = problem.evaluate(layout)
    score = problem.score(e)
    if not e.fits or abs(score - value) > max(EXACT, SLACK) * score:
        return False
    offer(e, 0.0)
    return True


def _key(layout: Layout) -> tuple[int, ...]:
    return (layout.lnc, layout.tp, layout.cp, layout.ep, layout.dp // layout.ep, layout.pp)
