"""How many domains a problem needs, and why nothing fits when nothing does.

Both ask CP-SAT about memory only (the layout model with memory as its objective, or as
its only constraint): the least memory any layout of a space needs, and whether any
layout fits the HBM less the headroom.

Determinism: each question is bounded by CP-SAT's deterministic time on one worker (a
count of its work: defaults.FITS_DETERMINISTIC_S, defaults.MEMORY_DETERMINISTIC_S), so
the domain count chosen and the memory quoted are functions of the inputs alone. A
question the budget leaves undecided counts as "not shown to fit" on every machine. The
wall clock (search/clock.py) is only the command's safety stop: when it ends a question,
TimeLimitError says so instead of an answer that could differ on another machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.memory import sharded_state_per_chip, usable_hbm
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import TimeLimitError
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.target import GIB
from trnopt.optimizer.search.clock import clock
from trnopt.optimizer.search.space import Space

MAX_DOMAINS = 64


@dataclass(frozen=True)
class LeastMemory:
    """The least memory per chip the search found on one problem's machine."""

    floor: float
    """Bytes per chip no layout beats: CP-SAT's proven bound, or the training state sharded over every chip."""
    found: Evaluation | None
    """The least-memory layout CP-SAT found, scored by the cost model (None: none within the time limit)."""
    proven: bool
    """Whether CP-SAT proved ``found`` the least."""

    def text(self) -> str:
        """The layout and its cost-model memory (the number an explanation quotes), else the floor."""
        if self.found is None:
            return (f"no layout's memory was found within the time limit; the training state alone, sharded "
                    f"over every chip, needs {self.floor / GIB:.1f} GiB per chip")
        lay = self.found.layout
        return (f"the least-memory layout{'' if self.proven else ' found'}, {lay.describe()} "
                f"[{lay.placement_text() or 'one rank'}], needs {self.found.memory.total / GIB:.1f} GiB per chip")


def minimum_memory(space: Space, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
                   seed: int = defaults.SEED) -> tuple[float, Layout | None, bool] | None:
    """(CP-SAT's proven floor on the memory per chip every layout of the space needs, HBM limit
    ignored; the least-memory layout found; whether it is proven the least), None when no layout
    was found within the work budget (defaults.MEMORY_DETERMINISTIC_S on one worker: the same
    answer on any machine). ``time_limit`` is the safety stop: TimeLimitError when it binds.
    ``workers`` is kept for the callers' signature; one worker is what makes the budget deterministic."""
    from trnopt.optimizer.search.cpsat import LayoutModel  # OR-Tools, imported when a command needs it
    lm = LayoutModel(space, memory_objective=True)
    status, solver = _decide(lm, time_limit, seed, defaults.MEMORY_DETERMINISTIC_S, "the least memory")
    if status not in ("OPTIMAL", "FEASIBLE"):
        return None
    return solver.best_objective_bound, lm.layout(solver), status == "OPTIMAL"


def fits(space: Space, time_limit: float = defaults.TIME_LIMIT_S, workers: int = defaults.WORKERS,
         seed: int = defaults.SEED) -> bool | None:
    """Whether some layout of the space fits the HBM limit (None: undecided within the work budget,
    defaults.FITS_DETERMINISTIC_S on one worker: the same on any machine). ``time_limit`` is
    the safety stop: TimeLimitError when it binds. ``workers``: as minimum_memory."""
    from trnopt.optimizer.search.cpsat import LayoutModel  # OR-Tools, imported when a command needs it
    lm = LayoutModel(space, memory_objective=True)
    lm.model.add(lm.memory.expr <= int(space.problem.target.chip.hbm_bytes * (1 - space.problem.headroom)))
    lm.model.clear_objective()
    status, _ = _decide(lm, time_limit, seed, defaults.FITS_DETERMINISTIC_S, "whether a layout fits")
    return {"OPTIMAL": True, "FEASIBLE": True, "INFEASIBLE": False}.get(status)


def _decide(lm, time_limit: float, seed: int, budget: float, what: str):
    """(status, solver) of one memory question on one worker within ``budget`` deterministic
    seconds; TimeLimitError when the wall-clock safety stop ``time_limit`` ended it instead."""
    from trnopt.optimizer.search.solver import STATUS, solver_for
    # one worker, no interleaving: deterministic for a seed, and clear of CP-SAT 9.15's abort on
    # interleaved searches of infeasible models (driver._solve_space)
    solver = solver_for(time_limit, 1, seed, interleave=False, deterministic_limit=budget)
    status = STATUS[solver.solve(lm.model)]
    if solver.wall_stopped:
        raise TimeLimitError(f"the time limit passed while deciding {what} on {lm.space.problem.domains} "
                             f"{lm.space.problem.target.name} domain(s); raise --time-limit")
    return status, solver


def _left(deadline: float | None) -> float:
    """Seconds left of the command's safety stop (on search/clock.py's clock); TimeLimitError when none are."""
    if deadline is None:
        return defaults.TIME_LIMIT_S
    left = deadline - clock()
    if left <= 0:
        raise TimeLimitError("the time limit passed while sizing the machine; give --ultraservers/--instances "
                             "or raise --time-limit")
    return left


def least_memory_found(problem: Problem, workers: int = defaults.WORKERS, seed: int = defaults.SEED,
                       deadline: float | None = None) -> LeastMemory:
    """The least-memory layout CP-SAT finds on this problem's machine (every LNC), scored by the
    cost model, and a floor no layout beats: CP-SAT's bound, else the training state sharded
    over every chip plus the runtime reserve. ``deadline`` (on search/clock.py's clock): the safety stop."""
    t, w = problem.target, problem.workload
    floor = (sharded_state_per_chip(w.model.total_params(), problem.domains * t.chips_per_domain,
                                    w.training.state_bytes_per_param) + t.runtime_reserve_bytes)
    bounds, best, proven = [], None, True
    for lnc in problem.lnc_values:
        try:
            got = minimum_memory(Space(problem, lnc), time_limit=_left(deadline), workers=workers, seed=seed)
        except TimeLimitError:  # the safety stop: the text then says the memory was not found in time
            got = None
        if got is None:
            proven = False
            continue
        bounds.append(got[0])
        e = problem.evaluate(got[1])
        proven = proven and got[2]
        if best is None or e.memory.total < best.memory.total:
            best = e
    if len(bounds) == len(problem.lnc_values):
        floor = max(floor, min(bounds))
    return LeastMemory(floor, best, proven and best is not None)


def least_memory(problem: Problem, workers: int = defaults.WORKERS, seed: int = defaults.SEED,
                 deadline: float | None = None) -> float:
    """A floor on the memory per chip (bytes) every layout needs on this problem's machine (``LeastMemory.floor``)."""
    return least_memory_found(problem, workers, seed, deadline).floor


def explain_infeasible(problem: Problem, workers: int = defaults.WORKERS, seed: int = defaults.SEED,
                       deadline: float | None = None) -> str:
    """What the least memory any layout needs is, against what the target has, and what would fit."""
    least = least_memory_found(problem, workers, seed, deadline)
    have = usable_hbm(problem.target, problem.headroom)
    t = problem.target
    where = (f"{problem.domains} {t.name} domain(s)" if t.remaining is None else
             f"{problem.domains} {t.name} domain(s) of {t.instances_per_domain} instance(s) left")
    lines = [f"no layout fits {have / GIB:.1f} GiB usable ({t.chip.hbm_bytes / GIB:.0f} GiB HBM less "
             f"{problem.headroom:.0%} headroom) on {where}: {least.text()}"]
    if t.remaining is not None:
        # more domains of a partial machine's shape are not a machine the user has: name what would change
        lines.append("what would fit: more healthy instances (fewer --exclude names, or a larger machine)")
        return "; ".join(lines)
    try:
        fits_on = fewest_domains(problem, start=problem.domains + 1, workers=workers, seed=seed, deadline=deadline)
    except TimeLimitError:
        fits_on = -1
    if fits_on == -1:
        lines.append("what would fit: not searched further within the time limit (raise --time-limit)")
    elif fits_on is not None:
        lines.append(f"what would fit: {fits_on} domains ({fits_on * t.chips_per_domain} chips) - "
                     f"{domain_flag(t, fits_on)}")
    else:
        lines.append(f"what would fit: nothing up to {MAX_DOMAINS} domains; a smaller global batch or sequence, "
                     "or a smaller headroom (--headroom)")
    return "; ".join(lines)


def fewest_domains(problem: Problem, start: int = 1, workers: int = defaults.WORKERS, seed: int = defaults.SEED,
                   deadline: float | None = None) -> int | None:
    """The fewest domains (from ``start``) on which some layout is shown to fit with the headroom,
    each count decided within a work budget (``fits``), so the count is a function of the
    inputs alone; ``deadline`` (on search/clock.py's clock) is the safety stop, whose binding
    raises TimeLimitError rather than move on to a larger count."""
    have = usable_hbm(problem.target, problem.headroom)
    t, w = problem.target, problem.workload
    state = sharded_state_per_chip(w.model.total_params(), 1, w.training.state_bytes_per_param)
    for domains in range(start, MAX_DOMAINS + 1):
        # the training state sharded over every chip, plus the reserve, is a floor no layout beats
        if state / (domains * t.chips_per_domain) + t.runtime_reserve_bytes > have:
            continue
        bigger = replace(problem, domains=domains)
        for lnc in bigger.lnc_values:
            try:
                left = _left(deadline)
            except TimeLimitError:
                raise TimeLimitError(f"the time limit passed while finding the fewest {t.name} domains that fit "
                                     f"(decided up to {domains - 1}); give --ultraservers/--instances or raise "
                                     "--time-limit") from None
            if fits(Space(bigger, lnc), time_limit=left, workers=workers, seed=seed):
                return domains
    return None


def domain_flag(target, domains: int) -> str:
    if target.instances_per_domain > 1:
        return f"--ultraservers {domains}"
    return f"--instances {domains}"
