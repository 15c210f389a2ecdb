"""The whole search a user asks for: every LNC's space, the runner-ups, the robust choice, and
the obvious alternatives with why each lost.

Step time, the default objective, is one branch and bound over every LNC's degree tuples
(search/branch.py), each promising placement solved exactly by the CP-SAT model; its
runner-ups are the best layouts of the next best degree tuples, proven like the best.
Goodput (step time / goodput) is solved per LNC with the whole CP-SAT model, in two phases
(the step-time optimum bounds the goodput optimum's step), the best so far a cutoff for
the next LNC, and runner-ups by excluding each answer's degrees in turn.

Determinism: the best layout is proven (or its gap stated) within the wall-clock limit;
the branch solves and the runner-up solves run with one worker, and
``deterministic_limit`` bounds each by CP-SAT's deterministic time, so the same command
gives the same answer on a loaded machine as on an idle one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InfeasibleError, InputError, TimeLimitError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import GIB
from trnopt.optimizer.search.branch import SLACK, SpaceBounds, search
from trnopt.optimizer.search.cpsat import LayoutModel, SolverMismatch, check_agreement
from trnopt.optimizer.search.solver import STATUS, solver_for
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
    build_seconds: float = 0.0  # building this LNC's CP-SAT model (what another model of the space costs)


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
    robust_skipped: bool = False  # the time limit left too little to look for a robust choice
    uncertainty: float = 0.0           # the relative step-time uncertainty near-ties were judged by
    search_seconds: float = 0.0        # of ``seconds``, the search for the fastest and its proof (the rest:
                                       # the robust choice and the alternatives)


def solve_space(space: Space, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
                seed: int = defaults.SEED, runners_up: int = 0, cutoff: float | None = None,
                deterministic_limit: float | None = None) -> LnCResult:
    """Solve one LNC's space; re-score the answer with the cost model and check they agree.

    ``cutoff`` (the objective of a layout found elsewhere, e.g. at another LNC) keeps only
    layouts at least as good: status NO_BETTER then proves there is none, usually at once.
    When the limit ends the search before CP-SAT found a layout, the greedy layout (the
    model's hint) is the answer, with CP-SAT's proven bound.
    """
    start = time.perf_counter()
    deadline = start + time_limit
    p = space.problem
    if p.objective == "step-time":
        return _solve_by_branches(space, deadline, seed, runners_up, cutoff, deterministic_limit)
    # goodput: the step-time optimum S with goodput g bounds the goodput optimum's step: S / g / min goodput
    first = solve_space(Space(replace(p, objective="step-time"), space.lnc), time_limit / 2, workers, seed,
                        deterministic_limit=deterministic_limit)
    if first.evaluation is None:
        return first
    bound = p.score(first.evaluation) * 1.000001 + 1e-12
    if cutoff is not None:
        # Prove first that nothing beats the cutoff, usually at once. Without interleaving:
        # CP-SAT 9.15 aborts ("heuristics.fixed_search != nullptr") when an interleaved search
        # meets a model that the cutoff makes infeasible.
        probe = LayoutModel(space, step_bound=bound)
        probe.model.add(probe.objective.expr <= math.floor(cutoff * (1 + 1e-6) / probe.objective_unit) + 1)
        # half the budget: a probe that does not prove at once leaves the rest to the search itself
        probe_solver = solver_for(max(0.5, (deadline - time.perf_counter()) / 2), workers, seed, False,
                                  deterministic_limit)
        if STATUS[probe_solver.solve(probe.model)] == "INFEASIBLE":
            return LnCResult(space.lnc, "NO_BETTER", None, math.inf, math.inf, time.perf_counter() - start)
        if time.perf_counter() >= deadline:  # the probe took the budget: no time to look for the better layout
            return LnCResult(space.lnc, "UNKNOWN", None, math.inf, 0.0, time.perf_counter() - start)
    built = time.perf_counter()
    lm = LayoutModel(space, step_bound=bound)
    built = time.perf_counter() - built
    hint = greedy_layout(space)
    if hint is not None:
        lm.hint(hint)
    # the model's construction and the hint came out of this LNC's budget
    solver = solver_for(max(0.5, deadline - time.perf_counter()), workers, seed,
                        deterministic_limit=deterministic_limit)
    # CP-SAT 9.15's presolve wrongly proves the step x (1 / goodput) objective infeasible on
    # some models (found by the brute-force referee); this phase is bounded by the step-time
    # optimum, so it is solved without presolve
    solver.parameters.cp_model_presolve = False
    status = STATUS[solver.solve(lm.model)]
    if status not in ("OPTIMAL", "FEASIBLE"):
        if status == "UNKNOWN" and hint is not None and p.score(p.evaluate(hint)) < (cutoff or math.inf):
            e = p.evaluate(hint)
            return LnCResult(space.lnc, "FEASIBLE", e, p.score(e), solver.best_objective_bound * lm.objective_unit,
                             time.perf_counter() - start, build_seconds=built)
        return LnCResult(space.lnc, status, None, math.inf, math.inf, time.perf_counter() - start,
                         build_seconds=built)
    e = p.evaluate(lm.layout(solver))
    check_agreement(lm, solver, e)
    objective = p.score(e)
    scale = objective / solver.objective_value if solver.objective_value else 0.0
    result = LnCResult(space.lnc, status, e, objective, solver.best_objective_bound * scale,
                       time.perf_counter() - start, rounding=lm.objective.error(solver.value) * lm.objective_unit,
                       build_seconds=built)
    for _ in range(runners_up):
        if time.perf_counter() >= deadline:
            result.runners_up_cut = True
            break
        lm.forbid_degrees(result.runners_up[-1].layout if result.runners_up else e.layout)
        lm.model.clear_hints()
        # one worker on deterministic time: the same runner-ups on any machine, and clear of
        # the interleaved-search abort noted above
        sub = solver_for(max(0.1, deadline - time.perf_counter()), 1, seed,
                         deterministic_limit=RUNNER_UP_DETERMINISTIC_S)
        sub_status = STATUS[sub.solve(lm.model)]
        if sub_status == "INFEASIBLE":
            break
        if sub_status not in ("OPTIMAL", "FEASIBLE"):
            result.runners_up_cut = True
            break
        result.runners_up.append(p.evaluate(lm.layout(sub)))
    return result


def _solve_by_branches(space: Space, deadline: float, seed: int, runners_up: int, cutoff: float | None,
                       deterministic_limit: float | None) -> LnCResult:
    """The step-time optimum of one LNC's space by branch and bound over its degree tuples (search/branch.py)."""
    start = time.perf_counter()
    lm = LayoutModel(space)
    built = time.perf_counter() - start
    hint = greedy_layout(space)
    found = search([SpaceBounds(lm)], deadline, 1 + runners_up, math.inf if cutoff is None else cutoff, seed,
                   deterministic_limit, (hint,) if hint is not None else ())
    seconds = time.perf_counter() - start
    if not found.found:
        status = ("NO_BETTER" if cutoff is not None else "INFEASIBLE") if found.proven else "UNKNOWN"
        return LnCResult(space.lnc, status, None, math.inf, found.bound, seconds, build_seconds=built)
    (objective, best), *others = found.found
    return LnCResult(space.lnc, "OPTIMAL" if found.proven else "FEASIBLE", best, objective, found.bound, seconds,
                     [e for _, e in others], found.rounding, runners_up > 0 and not found.proven, built)


@dataclass
class _Found:
    """What a search of every LNC's space found: the layouts best first (the best, then runner-ups)."""

    evaluations: list[Evaluation]
    proven: bool          # the best is optimal over every LNC
    bound: float          # seconds: no layout is faster
    runners_up_cut: bool
    build_seconds: float  # the longest build of one LNC's model
    statuses: str         # per LNC, for the time-limit message
    infeasible: bool      # proven that no layout fits


def _by_branches(spaces: list[Space], deadline: float, seed: int, top: int,
                 deterministic_limit: float | None) -> _Found:
    """Step time: one branch and bound over every LNC's degree tuples (search/branch.py)."""
    models, build = [], 0.0
    for space in spaces:
        if models and deadline - time.perf_counter() <= 1 + 2 * build:  # no time to build and search another
            break
        started = time.perf_counter()
        models.append(LayoutModel(space))
        build = max(build, time.perf_counter() - started)
    known = tuple(h for h in (greedy_layout(lm.space) for lm in models) if h is not None)
    found = search([SpaceBounds(lm) for lm in models], deadline, 1 + top, math.inf, seed, deterministic_limit, known)
    evaluations = [e for _, e in found.found]
    # an LNC left unbuilt is unknown: nothing is proven and nothing bounds it
    proven, bound = (found.proven, found.bound) if len(models) == len(spaces) else (False, 0.0)
    status = "OPTIMAL" if proven else "FEASIBLE" if evaluations else "UNKNOWN"
    left_out = ", ".join(f"LNC={s.lnc}" for s in spaces[len(models):])
    return _Found(evaluations, proven, bound, top > 0 and not proven, build,
                  f"{status} after {found.solves} CP-SAT solves over {found.branches} degree tuples"
                  + (f"; {left_out} not searched" if left_out else ""), proven and not evaluations)


def _per_lnc(problem: Problem, spaces: list[Space], start: float, time_limit: float, workers: int, seed: int,
             top: int, deterministic_limit: float | None) -> _Found:
    """Goodput: each LNC's space in turn, the best so far a cutoff for the next (branch and bound across LNC)."""
    results = []
    for i, space in enumerate(spaces):
        left = time_limit - (time.perf_counter() - start)
        if left <= 1.0 and any(r.evaluation is not None for r in results):  # no time to build and solve another
            results.append(LnCResult(space.lnc, "UNKNOWN", None, math.inf, 0.0, 0.0))
            continue
        remaining = max(1.0, left / (len(spaces) - i))
        incumbent = min((r.objective for r in results if r.evaluation is not None), default=None)
        results.append(solve_space(space, remaining, workers, seed, runners_up=top, cutoff=incumbent,
                                   deterministic_limit=deterministic_limit))
    found = sorted((r for r in results if r.evaluation is not None), key=lambda r: r.objective)
    evaluations = []
    if found:
        best = found[0].evaluation
        evaluations = [best] + sorted((e for r in found for e in [r.evaluation, *r.runners_up] if e is not best),
                                      key=problem.score)
    bound = min((r.bound if r.evaluation else 0.0 for r in results if r.status not in ("INFEASIBLE", "NO_BETTER")),
                default=math.inf)
    proven = all(r.status in ("OPTIMAL", "INFEASIBLE", "NO_BETTER") for r in results)
    return _Found(evaluations, proven, bound, any(r.runners_up_cut for r in results),
                  max(r.build_seconds for r in results), ", ".join(f"LNC={r.lnc} {r.status}" for r in results),
                  all(r.status == "INFEASIBLE" for r in results))


def solve(problem: Problem, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
          seed: int = defaults.SEED, top: int = defaults.TOP, deterministic_limit: float | None = None,
          uncertainty: float = 0.0) -> SearchResult:
    """Solve every LNC's space within ``time_limit`` in all; raise InfeasibleError with the explanation."""
    from trnopt.optimizer.search.domains import explain_infeasible

    start = time.perf_counter()
    # the target's default LNC first: with goodput its optimum is then a cutoff for the others
    default = problem.target.chip.lnc_default
    spaces = [Space(problem, lnc) for lnc in sorted(problem.lnc_values, key=lambda v: v != default)]
    if problem.objective == "step-time":
        found = _by_branches(spaces, start + time_limit, seed, top, deterministic_limit)
    else:
        found = _per_lnc(problem, spaces, start, time_limit, workers, seed, top, deterministic_limit)
    if not found.evaluations:
        if found.infeasible:
            raise InfeasibleError(explain_infeasible(problem, workers, seed, deadline=start + time_limit))
        raise TimeLimitError(f"no layout found within {time_limit:g} s ({found.statuses}), and none is proven "
                             "impossible; raise --time-limit")
    searched = time.perf_counter() - start
    fastest = found.evaluations[0]
    score = problem.score(fastest)
    gap = 0.0 if found.proven else max(0.0, (score - found.bound) / score)
    # the robust choice builds one more model of the space: only when the limit leaves time to build and solve it
    remaining = time_limit - (time.perf_counter() - start)
    build = found.build_seconds
    robust_skipped = uncertainty > 0 and remaining <= 1 + 2 * build
    chosen = robust_choice(problem, fastest, uncertainty, seed, remaining - build) \
        if uncertainty > 0 and not robust_skipped else fastest
    runners = sorted((e for e in found.evaluations if e.layout != chosen.layout), key=problem.score)[:top]
    return SearchResult(problem, chosen, "OPTIMAL" if found.proven else "FEASIBLE", gap,
                        time.perf_counter() - start, sum(s.size() for s in spaces), runners,
                        alternatives(problem, chosen), runners_up_cut=found.runners_up_cut,
                        fastest=fastest, uncertainty=uncertainty, robust_skipped=robust_skipped,
                        search_seconds=searched)


def robust_choice(problem: Problem, fastest: Evaluation, uncertainty: float, seed: int,
                  time_limit: float = defaults.TIME_LIMIT_S) -> Evaluation:
    """Among layouts within ``uncertainty`` of the fastest (step time, same LNC), the one that leans
    least on slow links for TP, then with the most headroom (LayoutModel.prefer_robust); the
    fastest itself when nothing else qualifies or the budget ends first."""
    space = Space(replace(problem, objective="step-time"), fastest.layout.lnc)
    lm = LayoutModel(space)
    cap = fastest.step.total * (1 + uncertainty)
    # only the degree tuples whose floor (search/branch.py) lets them come within the cap:
    # the whole model's presolve, on tables of every tuple, took most of the command's time
    bounds = SpaceBounds(lm)
    candidates = []
    for branch in bounds.branches():
        if branch.floor <= cap * (1 + SLACK):
            bounds.refine(branch, cap * (1 + SLACK))
            if branch.plans:
                candidates.append(branch.degrees)
    lm.narrow_degrees(candidates)
    lm.prefer_robust(cap)
    lm.hint(fastest.layout)
    solver = solver_for(time_limit, 1, seed, deterministic_limit=RUNNER_UP_DETERMINISTIC_S)
    if STATUS[solver.solve(lm.model)] not in ("OPTIMAL", "FEASIBLE"):
        return fastest
    e = problem.evaluate(lm.layout(solver))
    return e if e.fits and problem.score(e) <= problem.score(fastest) * (1 + uncertainty) else fastest


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
        if zero != lay.zero:
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
        d = 100 * (p.score(e) / base - 1)
        if not e.fits:
            verdict = f"over memory: {e.memory.total / GIB:.1f} GiB/chip > {e.usable_bytes / GIB:.1f} usable"
        else:
            verdict = f"{'slower' if d >= 0 else 'faster'} by {abs(d):.2g}%"
        result.append(Alternative(name, e, verdict))
    return result


def score_layout(space: Space, layout: Layout, workers: int = 1) -> tuple[float, float]:
    """(objective, rounding) of one layout in the CP-SAT model, in the objective's seconds."""
    lm = LayoutModel(space, scoring=True)
    lm.fix(layout)
    solver = solver_for(30.0, workers, 0)
    if STATUS[solver.solve(lm.model)] != "OPTIMAL":
        raise SolverMismatch(f"the model rejects {layout.describe()} [{layout.placement_text()}]")
    return solver.objective_value * lm.objective_unit, lm.objective.error(solver.value) * lm.objective_unit
