"""The whole search a user asks for: every LNC, the fewest domains that fit, runner-ups, and
an answer (not a traceback) when nothing fits."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.cost.evaluate import Evaluation, evaluate, objective_value
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.cost.memory import sharded_state_per_chip, usable_hbm
from trnopt.optimizer.defaults import WORKERS as DEFAULT_WORKERS
from trnopt.optimizer.search.cpsat import fits, greedy_layout, minimum_memory, solve_space
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.model.target import GIB

MAX_DOMAINS = 64


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


def solve(problem: Problem, time_limit: float = 60.0, workers: int = DEFAULT_WORKERS, seed: int = 0, top: int = 3) -> SearchResult:
    """Solve every LNC's space within ``time_limit`` in all; raise InfeasibleError with the explanation."""
    start = time.perf_counter()
    results = []
    # the target's default LNC first; its optimum is then a cutoff for the others, which
    # usually proves them no better at once (branch and bound across LNC values)
    default = problem.target.chip.lnc_default
    spaces = [Space(problem, lnc) for lnc in sorted(problem.lnc_values, key=lambda v: v != default)]
    for i, space in enumerate(spaces):
        remaining = max(1.0, (time_limit - (time.perf_counter() - start)) / (len(spaces) - i))
        incumbent = min((r.objective for r in results if r.evaluation is not None), default=None)
        results.append(solve_space(space, remaining, workers, seed, runners_up=top, cutoff=incumbent))
    found = [r for r in results if r.evaluation is not None]
    if not found:
        if all(r.status == "INFEASIBLE" for r in results):
            raise InfeasibleError(explain_infeasible(problem, workers, seed))
        raise InfeasibleError(f"no layout found within {time_limit:g} s (statuses: "
                              f"{', '.join(f'LNC={r.lnc} {r.status}' for r in results)}); raise --time-limit")
    best = min(found, key=lambda r: r.objective)
    bound = min(r.bound if r.evaluation else 0.0 for r in results if r.status not in ("INFEASIBLE", "NO_BETTER"))
    proven = all(r.status in ("OPTIMAL", "INFEASIBLE", "NO_BETTER") for r in results)
    gap = 0.0 if proven else max(0.0, (best.objective - bound) / best.objective)
    runners = sorted((e for r in found for e in [r.evaluation, *r.runners_up] if e is not best.evaluation),
                     key=lambda e: objective_value(e, problem.objective))[:top]
    return SearchResult(problem, best.evaluation, "OPTIMAL" if proven else "FEASIBLE", gap,
                        time.perf_counter() - start, sum(s.size() for s in spaces), runners,
                        alternatives(problem, best.evaluation))


def alternatives(problem: Problem, best: Evaluation) -> list[Alternative]:
    """The obvious other choices, scored by the same cost model, and why each lost."""
    lay, p = best.layout, problem
    out: list[tuple[str, Layout]] = []
    greedy = greedy_layout(Space(p, lay.lnc))
    if greedy is not None:
        out.append(("greedy: TP of 8 (or the nearest degree) on the fastest links, the rest DP", greedy))
    degrees = {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp // lay.ep, "pp": lay.pp}
    try:
        out.append(("same degrees, TP innermost placement", replace(lay, placement=default_placement(lay.axes, degrees))))
    except Exception:  # these degrees may not tile the axes in the default order
        pass
    for zero in range(4):
        if zero != lay.zero:
            out.append((f"ZeRO-{zero} instead of ZeRO-{lay.zero}", replace(lay, zero=zero)))
    for rc in ("none", "selective", "full"):
        if rc != lay.recompute:
            out.append((f"{rc} recompute instead of {lay.recompute}", replace(lay, recompute=rc)))
    result, seen = [], {lay}
    base = objective_value(best, p.objective)
    for name, alt in out:
        if alt in seen or alt.workload_problems(p.workload):
            continue
        seen.add(alt)
        e = p.evaluate(alt)
        if not e.fits:
            verdict = f"over memory: {e.memory.total / GIB:.1f} GiB/chip > {e.usable_bytes / GIB:.1f} usable"
        else:
            verdict = f"slower by {100 * (objective_value(e, p.objective) / base - 1):.2g}%"
        result.append(Alternative(name, e, verdict))
    return result


def least_memory(problem: Problem, workers: int = DEFAULT_WORKERS, seed: int = 0) -> float:
    """A floor on the memory per chip (bytes) every layout needs on this problem's machine."""
    values = [minimum_memory(Space(problem, lnc), workers=workers, seed=seed) for lnc in problem.lnc_values]
    return min((v for v in values if v is not None), default=math.inf)


def explain_infeasible(problem: Problem, workers: int = DEFAULT_WORKERS, seed: int = 0) -> str:
    """What the least memory any layout needs is, against what the target has, and what would fit."""
    need = least_memory(problem, workers, seed)
    have = usable_hbm(problem.target, problem.headroom)
    t = problem.target
    lines = [f"no layout fits: the least memory any layout needs is at least {need / GIB:.1f} GiB per chip "
             f"(already with the best ZeRO stage and recomputation), against {have / GIB:.1f} GiB usable "
             f"({t.chip.hbm_bytes / GIB:.0f} GiB HBM less {problem.headroom:.0%} headroom)"]
    fits = fewest_domains(problem, start=problem.domains + 1, workers=workers, seed=seed)
    if fits is not None:
        lines.append(f"what would fit: {fits} domains ({fits * t.chips_per_domain} chips) - "
                     f"{domain_flag(t, fits)}")
    else:
        lines.append(f"what would fit: nothing up to {MAX_DOMAINS} domains; a smaller global batch or sequence, "
                     "or a smaller headroom (--headroom)")
    return "; ".join(lines)


def fewest_domains(problem: Problem, start: int = 1, workers: int = DEFAULT_WORKERS, seed: int = 0) -> int | None:
    """The fewest domains (from ``start``) on which some layout fits with the headroom."""
    have = usable_hbm(problem.target, problem.headroom)
    t, w = problem.target, problem.workload
    state = sharded_state_per_chip(w.model.total_params(), 1, w.training.state_bytes_per_param)
    for domains in range(start, MAX_DOMAINS + 1):
        # the training state sharded over every chip, plus the reserve, is a floor no layout beats
        if state / (domains * t.chips_per_domain) + t.runtime_reserve_bytes > have:
            continue
        bigger = replace(problem, domains=domains)
        if any(fits(Space(bigger, lnc), workers=workers, seed=seed) for lnc in bigger.lnc_values):
            return domains
    return None


def domain_flag(target, domains: int) -> str:
    if target.instances_per_domain > 1:
        return f"--ultraservers {domains}"
    return f"--instances {domains}"
