"""The whole search a user asks for: every LNC's space, the runner-ups, the robust choice, and
the obvious alternatives with why each lost.

Step time, the default objective, is one branch and bound over every LNC's degree tuples
(search/branch.py), each promising tuple scored at every point (or solved exactly by the
CP-SAT model where it has too many); its runner-ups are the best layouts of the next best degree tuples, proven like the best.
Goodput (step time / goodput) is solved per LNC with the whole CP-SAT model, in two phases
(the step-time optimum bounds the goodput optimum's step), the best so far a cutoff for
the next LNC, and runner-ups by excluding each answer's degrees in turn.

Determinism: the answer is a function of the inputs alone. Work budgets end a search
early, never wall time: the branch and bound's counted nodes and points and CP-SAT's
deterministic time (branch.Budget), on a fixed worker count; every LNC's space is
searched and the robust choice is always looked for. ``time_limit`` is a safety stop: when it ends
a step (``stopped == "time"``), the result says so, since its answer may then differ on
another machine. The wall clock is read through solver.clock alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InfeasibleError, InputError, TimeLimitError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import GIB
from trnopt.optimizer.search.branch import Budget, search
from trnopt.optimizer.search.spacebounds import SLACK, SpaceBounds
from trnopt.optimizer.search.clock import SafetyStop, clock, interruptible
from trnopt.optimizer.search.hint import greedy_layout
from trnopt.optimizer.search.space import Space

RUNNER_UP_DETERMINISTIC_S = 5.0  # CP-SAT deterministic seconds per runner-up solve


@dataclass
class LnCResult:
    """One LNC's answer: the best layout found, its status and proven bound, and runner-ups."""

    lnc: int
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, or NO_BETTER (nothing beats the cutoff)
    evaluation: Evaluation | None
    objective: float
    bound: float
    seconds: float
    runners_up: list[Evaluation] = field(default_factory=list)
    rounding: float = 0.0  # seconds: how far the integer objective may be from the cost model's
    runners_up_cut: bool = False  # the runner-up budget ended before every runner-up asked for
    stopped: str = ""  # "work" (a deterministic budget) or "time" (the safety stop) ended it unproven


@dataclass(frozen=True)
class Alternative:
    name: str
    evaluation: Evaluation
    verdict: str


@dataclass
class SearchResult:
    problem: Problem
    best: Evaluation
    status: str            # OPTIMAL when every LNC's model was proven optimal, else FEASIBLE
    gap: float             # relative gap between the best layout and the proven bound
    seconds: float
    space_size: int
    runners_up: list[Evaluation] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    domains_note: str = ""
    runners_up_cut: bool = False
    fastest: Evaluation | None = None  # the fastest layout, when the robust choice is another
    robust_skipped: bool = False  # the safety stop came before the robust choice was settled
    uncertainty: float = 0.0           # the relative step-time uncertainty near-ties were judged by
    search_seconds: float = 0.0        # of ``seconds``, the search for the fastest and its proof (the rest:
                                       # the robust choice and the alternatives)
    stopped: str = ""  # what ended the search before its proof: "work" (a budget: the same answer on any
                       # machine) or "time" (the --time-limit safety stop: the answer may differ elsewhere)
    uneven_stages: dict | None = None  # --uneven-stages: what the split search found (search/stagesplit.split_layout)
    bounds: dict = field(default_factory=dict)  # LNC -> the branch and bound's SpaceBounds (their cached floors:
                                                # the joint layout-and-split search, search/jointsplit.py)


def solve_space(space: Space, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
                seed: int = defaults.SEED, runners_up: int = 0, cutoff: float | None = None,
                deterministic_limit: float | None = None) -> LnCResult:
    """Solve one LNC's space; re-score the answer with the cost model and check they agree.

    ``cutoff`` (the objective of a layout found elsewhere, e.g. at another LNC) keeps only
    layouts at least as good: status NO_BETTER then proves there is none, usually at once.
    Each CP-SAT solve's work is ``deterministic_limit`` deterministic seconds (default
    defaults.SOLVE_DETERMINISTIC_S); ``time_limit`` is the safety stop. When the budget ends
    the search before CP-SAT found a layout, the greedy layout (the model's hint) is the
    answer, with CP-SAT's proven bound.
    """
    return _solve_space(space, clock() + time_limit, workers, seed, runners_up, cutoff, deterministic_limit)


def _solve_space(space: Space, deadline: float, workers: int, seed: int, runners_up: int, cutoff: float | None,
                 deterministic_limit: float | None) -> LnCResult:
    """solve_space by ``deadline`` (on solver.clock)."""
    start = clock()
    p = space.problem
    if p.objective == "step-time":
        return _solve_by_branches(space, deadline, seed, runners_up, cutoff, deterministic_limit)
    # goodput: the step-time optimum S with goodput g bounds the goodput optimum's step: S / g / min goodput
    first = _solve_space(Space(replace(p, objective="step-time"), space.lnc), deadline, workers, seed, 0, None,
                         deterministic_limit)
    from trnopt.optimizer.search.cpsat import LayoutModel, check_agreement  # OR-Tools: goodput's whole model
    from trnopt.optimizer.search.solver import STATUS, solver_for
    if first.evaluation is None:
        return first
    bound = p.score(first.evaluation) * 1.000001 + 1e-12
    with interruptible(deadline):
        if cutoff is not None:
            # Prove first that nothing beats the cutoff, usually at once. Without interleaving:
            # CP-SAT 9.15 aborts ("heuristics.fixed_search != nullptr") when an interleaved search
            # meets a model that the cutoff makes infeasible.
            probe = LayoutModel(space, step_bound=bound)
            probe.model.add(probe.objective.expr <= math.floor(cutoff * (1 + 1e-6) / probe.objective_unit) + 1)
            probe_solver = solver_for(deadline - clock(), workers, seed, False, deterministic_limit)
            if STATUS[probe_solver.solve(probe.model)] == "INFEASIBLE":
                return LnCResult(space.lnc, "NO_BETTER", None, math.inf, math.inf, clock() - start)
        lm = LayoutModel(space, step_bound=bound)
    hint = greedy_layout(space)
    if hint is not None:
        lm.hint(hint)
    solver = solver_for(deadline - clock(), workers, seed, deterministic_limit=deterministic_limit)
    # CP-SAT 9.15's presolve wrongly proves the step x (1 / goodput) objective infeasible on
    # some models (found by the brute-force referee); this phase is bounded by the step-time
    # optimum, so it is solved without presolve
    solver.parameters.cp_model_presolve = False
    status = STATUS[solver.solve(lm.model)]
    stopped = ("time" if solver.wall_stopped else "work") if status in ("FEASIBLE", "UNKNOWN") else ""
    if status not in ("OPTIMAL", "FEASIBLE"):
        if status == "UNKNOWN" and hint is not None and p.score(p.evaluate(hint)) < (cutoff or math.inf):
            e = p.evaluate(hint)
            return LnCResult(space.lnc, "FEASIBLE", e, p.score(e), solver.best_objective_bound * lm.objective_unit,
                             clock() - start, stopped=stopped)
        return LnCResult(space.lnc, status, None, math.inf, math.inf, clock() - start, stopped=stopped)
    e = p.evaluate(lm.layout(solver))
    check_agreement(lm, solver, e)
    objective = p.score(e)
    scale = objective / solver.objective_value if solver.objective_value else 0.0
    result = LnCResult(space.lnc, status, e, objective, solver.best_objective_bound * scale,
                       clock() - start, rounding=lm.objective.error(solver.value) * lm.objective_unit,
                       stopped=stopped)
    for _ in range(runners_up):
        lm.forbid_degrees(result.runners_up[-1].layout if result.runners_up else e.layout)
        lm.model.clear_hints()
        # one worker on deterministic time: the same runner-ups on any machine, and clear of
        # the interleaved-search abort noted above
        sub = solver_for(deadline - clock(), 1, seed, deterministic_limit=RUNNER_UP_DETERMINISTIC_S)
        sub_status = STATUS[sub.solve(lm.model)]
        if sub_status == "INFEASIBLE":
            break
        if sub_status not in ("OPTIMAL", "FEASIBLE"):
            result.runners_up_cut = True
            result.stopped = result.stopped or ("time" if sub.wall_stopped else "")
            break
        result.stopped = result.stopped or ("time" if sub.wall_stopped else "")
        result.runners_up.append(p.evaluate(lm.layout(sub)))
    return result


def _solve_by_branches(space: Space, deadline: float, seed: int, runners_up: int, cutoff: float | None,
                       deterministic_limit: float | None) -> LnCResult:
    """The step-time optimum of one LNC's space by branch and bound over its degree tuples (search/branch.py)."""
    start = clock()
    hint = greedy_layout(space)
    found = search([SpaceBounds(space)], deadline, 1 + runners_up, math.inf if cutoff is None else cutoff, seed,
                   _budget(deterministic_limit), (hint,) if hint is not None else ())
    seconds = clock() - start
    if not found.found:
        status = ("NO_BETTER" if cutoff is not None else "INFEASIBLE") if found.proven else "UNKNOWN"
        return LnCResult(space.lnc, status, None, math.inf, found.bound, seconds, stopped=found.stopped)
    (objective, best), *others = found.found
    return LnCResult(space.lnc, "OPTIMAL" if found.proven else "FEASIBLE", best, objective, found.bound, seconds,
                     [e for _, e in others], found.rounding, runners_up > 0 and not found.proven,
                     stopped=found.stopped)


def _budget(deterministic_limit: float | None) -> Budget:
    """The branch and bound's work budget; ``deterministic_limit`` replaces its CP-SAT seconds per solve."""
    return Budget() if deterministic_limit is None else Budget(per_solve_s=deterministic_limit)


@dataclass
class _Found:
    """What a search of every LNC's space found: the layouts best first (the best, then runner-ups)."""

    evaluations: list[Evaluation]
    proven: bool          # the best is optimal over every LNC
    bound: float          # seconds: no layout is faster
    runners_up_cut: bool
    statuses: str         # per LNC, for the time-limit message
    infeasible: bool      # proven that no layout fits
    stopped: str          # "work", "time" or "" (see SearchResult.stopped)
    bounds: dict = field(default_factory=dict)  # LNC -> the search's SpaceBounds (their tables, for the robust choice)


def _by_branches(spaces: list[Space], deadline: float, seed: int, top: int,
                 deterministic_limit: float | None) -> _Found:
    """Step time: one branch and bound over every LNC's degree tuples (search/branch.py)."""
    known = tuple(h for h in (greedy_layout(space) for space in spaces) if h is not None)
    bounds = [SpaceBounds(space) for space in spaces]
    found = search(bounds, deadline, 1 + top, math.inf, seed, _budget(deterministic_limit), known)
    evaluations = [e for _, e in found.found]
    status = "OPTIMAL" if found.proven else "FEASIBLE" if evaluations else "UNKNOWN"
    return _Found(evaluations, found.proven, found.bound, top > 0 and not found.proven,
                  f"{status} after {found.solves} CP-SAT solves over {found.branches} degree tuples",
                  found.proven and not evaluations, found.stopped, {b.space.lnc: b for b in bounds})


def _per_lnc(problem: Problem, spaces: list[Space], deadline: float, workers: int, seed: int,
             top: int, deterministic_limit: float | None) -> _Found:
    """Goodput: each LNC's space in turn, the best so far a cutoff for the next (branch and bound across LNC)."""
    results = []
    for space in spaces:
        if clock() >= deadline:  # the safety stop: this LNC is not searched
            results.append(LnCResult(space.lnc, "UNKNOWN", None, math.inf, 0.0, 0.0, stopped="time"))
            continue
        incumbent = min((r.objective for r in results if r.evaluation is not None), default=None)
        try:
            results.append(_solve_space(space, deadline, workers, seed, top, incumbent, deterministic_limit))
        except SafetyStop:
            results.append(LnCResult(space.lnc, "UNKNOWN", None, math.inf, 0.0, 0.0, stopped="time"))
    found = sorted((r for r in results if r.evaluation is not None), key=lambda r: r.objective)
    evaluations = []
    if found:
        best = found[0].evaluation
        evaluations = [best] + sorted((e for r in found for e in [r.evaluation, *r.runners_up] if e is not best),
                                      key=problem.score)
    bound = min((r.bound if r.evaluation else 0.0 for r in results if r.status not in ("INFEASIBLE", "NO_BETTER")),
                default=math.inf)
    proven = all(r.status in ("OPTIMAL", "INFEASIBLE", "NO_BETTER") for r in results)
    stops = {r.stopped for r in results}
    return _Found(evaluations, proven, bound, any(r.runners_up_cut for r in results),
                  ", ".join(f"LNC={r.lnc} {r.status}" for r in results),
                  all(r.status == "INFEASIBLE" for r in results), "time" if "time" in stops else
                  "work" if "work" in stops else "")


def solve(problem: Problem, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
          seed: int = defaults.SEED, top: int = defaults.TOP, deterministic_limit: float | None = None,
          uncertainty: float = 0.0) -> SearchResult:
    """Solve every LNC's space, ``time_limit`` the safety stop of the whole; raise InfeasibleError with
    the explanation. ``deterministic_limit``: CP-SAT's deterministic seconds per solve (its default
    budget otherwise)."""
    from trnopt.optimizer.search.domains import explain_infeasible

    start = clock()
    deadline = start + time_limit
    # the target's default LNC first: with goodput its optimum is then a cutoff for the others
    default = problem.target.chip.lnc_default
    spaces = [Space(problem, lnc) for lnc in sorted(problem.lnc_values, key=lambda v: v != default)]
    if problem.objective == "step-time":
        found = _by_branches(spaces, deadline, seed, top, deterministic_limit)
    else:
        found = _per_lnc(problem, spaces, deadline, workers, seed, top, deterministic_limit)
    if not found.evaluations:
        if found.infeasible:
            raise InfeasibleError(explain_infeasible(problem, workers, seed, deadline=start + time_limit))
        raise TimeLimitError(f"no layout found within {time_limit:g} s ({found.statuses}), and none is proven "
                             "impossible; raise --time-limit")
    searched = clock() - start
    fastest = found.evaluations[0]
    score = problem.score(fastest)
    gap = 0.0 if found.proven else max(0.0, (score - found.bound) / score)
    chosen, robust_skipped, stopped = fastest, False, found.stopped
    if uncertainty > 0:
        try:
            chosen = robust_choice(problem, fastest, uncertainty, seed, deadline - clock(),
                                   found.bounds.get(fastest.layout.lnc))
        except SafetyStop:
            robust_skipped, stopped = True, "time"
    runners = sorted((e for e in found.evaluations if e.layout != chosen.layout), key=problem.score)[:top]
    return SearchResult(problem, chosen, "OPTIMAL" if found.proven else "FEASIBLE", gap,
                        clock() - start, sum(s.size() for s in spaces), runners,
                        alternatives(problem, chosen), runners_up_cut=found.runners_up_cut,
                        fastest=fastest, uncertainty=uncertainty, robust_skipped=robust_skipped,
                        search_seconds=searched, stopped=stopped, bounds=found.bounds)


def robust_choice(problem: Problem, fastest: Evaluation, uncertainty: float, seed: int,
                  time_limit: float = defaults.TIME_LIMIT_S, bounds: SpaceBounds | None = None) -> Evaluation:
    """Among layouts within ``uncertainty`` of the fastest (step time, same LNC), the one that leans
    least on slow links for TP, then with the most headroom (LayoutModel.prefer_robust); the
    fastest itself when nothing else qualifies. Every point of the degree tuples whose floor
    lets them come within the cap is scored (SpaceBounds.robust), or, past what that can score,
    CP-SAT solves it with RUNNER_UP_DETERMINISTIC_S of deterministic time. ``time_limit`` is the
    safety stop, whose binding raises SafetyStop (the choice would then depend on the machine).
    ``bounds``: the search's SpaceBounds of the fastest's LNC (step time), whose tables carry over."""
    deadline = clock() + time_limit
    space = Space(replace(problem, objective="step-time"), fastest.layout.lnc)
    cap = fastest.step.total * (1 + uncertainty)
    with interruptible(deadline):
        # only the degree tuples whose floor (search/branch.py) lets them come within the cap
        bounds = bounds or SpaceBounds(space)
        candidates = []
        for branch in bounds.branches():
            if branch.floor <= cap * (1 + SLACK):
                bounds.deepen(branch)
            if branch.floor <= cap * (1 + SLACK):
                bounds.refine(branch, cap * (1 + SLACK))
                if branch.plans:
                    candidates.append(branch)
        picks = [bounds.robust(branch, cap) for branch in candidates]
        if False in picks:
            chosen = _robust_by_cpsat(space, fastest, cap, [b.degrees for b in candidates], seed, deadline)
        else:
            chosen = min((p for p in picks if p is not None), key=lambda p: p[:3], default=(0, 0, 0, fastest.layout))[3]
    if chosen is None:
        return fastest
    e = problem.evaluate(chosen)
    return e if e.fits and problem.score(e) <= problem.score(fastest) * (1 + uncertainty) else fastest


def _robust_by_cpsat(space: Space, fastest: Evaluation, cap: float, candidates: list[dict], seed: int,
                     deadline: float) -> Layout | None:
    """robust_choice's layout by CP-SAT over the ``candidates`` degree tuples (LayoutModel.prefer_robust)."""
    from trnopt.optimizer.search.cpsat import LayoutModel
    from trnopt.optimizer.search.solver import STATUS, solver_for
    lm = LayoutModel(space)
    lm.narrow_degrees(candidates)
    lm.prefer_robust(cap)
    lm.hint(fastest.layout)
    solver = solver_for(deadline - clock(), 1, seed, deterministic_limit=RUNNER_UP_DETERMINISTIC_S)
    status = STATUS[solver.solve(lm.model)]
    if solver.wall_stopped:
        raise SafetyStop
    return lm.layout(solver) if status in ("OPTIMAL", "FEASIBLE") else None


def change_text(ratio: float) -> str:
    """'slower by 570.0%' / 'faster by 3.2%' for a score ratio (other / chosen): fixed-point, so a
    large difference never prints in exponent form (5.7e+02%)."""
    d = 100 * (ratio - 1)
    return f"{'slower' if d >= 0 else 'faster'} by {abs(d):.1f}%"


def alternatives(problem: Problem, best: Evaluation) -> list[Alternative]:
    """The obvious other choices, scored by the same cost model, and why each lost."""
    lay, p = best.layout, problem
    out: list[tuple[str, Layout]] = []
    greedy = greedy_layout(Space(p, lay.lnc))
    if greedy is not None:
        out.append(("greedy: TP of 8 (or the nearest degree) on the fastest links, the rest DP", greedy))
    cores = lay.ranks_per_chip
    if lay.tp != cores and cores > 1 and lay.ranks % (cores * lay.pp * lay.cp) == 0:
        inside = {"tp": cores, "cp": lay.cp, "ep": 1, "dp": lay.ranks // (cores * lay.pp * lay.cp), "pp": lay.pp}
        try:
            out.append((f"TP inside a chip (TP{cores} on its cores, the rest DP)",
                        replace(lay, tp=cores, ep=1, dp=inside["dp"], placement=default_placement(lay.axes, inside),
                                dp_replicate=1)))
        except InputError:
            pass
    degrees = {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp // lay.ep, "pp": lay.pp}
    try:
        out.append(("same degrees, TP innermost placement", replace(lay, placement=default_placement(lay.axes, degrees))))
    except Exception:  # these degrees may not tile the axes in the default order
        pass
    for zero in p.zero_stages:
        if zero != lay.zero and lay.dp > 1:  # one data-parallel rank: every ZeRO stage is the same layout
            out.append((f"ZeRO-{zero} instead of ZeRO-{lay.zero}", replace(lay, zero=zero)))
    for rc in p.recompute:
        if rc != lay.recompute:
            out.append((f"{rc} recompute instead of {lay.recompute}", replace(lay, recompute=rc)))
    result, seen = [], {lay}
    base = p.score(best)
    for name, alt in out:
        if alt in seen or alt.workload_problems(p.workload, p.rules):
            continue
        seen.add(alt)
        e = p.evaluate(alt)
        if not e.fits:
            verdict = f"over memory: {e.memory.total / GIB:.1f} GiB/chip > {e.usable_bytes / GIB:.1f} usable"
        else:
            verdict = change_text(p.score(e) / base)
        result.append(Alternative(name, e, verdict))
    return result


def score_layout(space: Space, layout: Layout, workers: int = 1) -> tuple[float, float]:
    """(objective, rounding) of one layout in the CP-SAT model, in the objective's seconds."""
    from trnopt.optimizer.search.cpsat import LayoutModel, SolverMismatch
    from trnopt.optimizer.search.solver import STATUS, solver_for
    lm = LayoutModel(space, scoring=True)
    lm.fix(layout)
    # the safety stop only: a fixed layout's model is settled within its work budget, and under a
    # loaded machine's wall clock (a 30 s stop failed the referee tests at load 10 on 2 cores)
    solver = solver_for(defaults.TIME_LIMIT_S * 10, workers, 0)
    if STATUS[solver.solve(lm.model)] != "OPTIMAL":
        raise SolverMismatch(f"the model rejects {layout.describe()} [{layout.placement_text()}]")
    return solver.objective_value * lm.objective_unit, lm.objective.error(solver.value) * lm.objective_unit
