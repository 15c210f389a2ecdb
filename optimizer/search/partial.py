"""The best layout on a partial machine: each candidate machine (model/partial.py) searched, the fastest kept.

A layout runs on one candidate machine (k instances per domain on the domains that still
have them), so the best layout of the partial machine is the best of the candidates' best
layouts; it is proven optimal when every candidate's search is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.model.partial import describe
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.search.clock import clock


@dataclass(frozen=True)
class Candidate:
    """One candidate machine's answer."""

    target: Target
    """The candidate: its domain axes are the shape kept, ``remaining`` where it sits."""
    score: float | None
    """The objective of the layout its search answers (seconds), None when no layout fits it."""
    status: str
    """Its search's status (OPTIMAL, FEASIBLE) or INFEASIBLE."""
    bound: float | None = None
    """Seconds no layout of it beats (its score less its gap); None when no layout fits it."""


def on_candidate(problem: Problem, target: Target) -> Problem:
    """The problem on one candidate machine: its target, and as many domains as it keeps."""
    return replace(problem, target=target, domains=len(target.remaining.domains) if target.remaining else problem.domains)


def solve_partial(problem: Problem, targets: list[Target], time_limit: float = defaults.TIME_LIMIT_S,
                  workers: int = defaults.WORKERS, seed: int = defaults.SEED, top: int = defaults.TOP,
                  deterministic_limit: float | None = None, uncertainty: float = 0.0):
    """(the SearchResult of the best candidate, every candidate's answer). The result's seconds, space
    size and what stopped a search are all the candidates' searches'. Candidates come largest first
    and a tie keeps the earlier. OPTIMAL only when every candidate's search proved its answer, else
    the gap is the best score's over the least of their bounds. InfeasibleError (the first
    candidate's) when none fits."""
    from trnopt.optimizer.search.driver import solve  # the search, imported when a command needs it

    best, answers, first_error, results = None, [], None, []
    deadline = clock() + time_limit  # one safety stop for every candidate's search
    for target in targets:
        sub = on_candidate(problem, target)
        try:
            result = solve(sub, max(1.0, deadline - clock()), workers, seed, top,
                           deterministic_limit=deterministic_limit, uncertainty=uncertainty)
        except InfeasibleError as exc:
            first_error = first_error or exc
            answers.append(Candidate(target, None, "INFEASIBLE"))
            continue
        # the layout each candidate answers (its robust choice), compared; the bound is its fastest's
        results.append(result)
        score = sub.score(result.best)
        floor = sub.score(result.fastest or result.best) * (1 - result.gap)
        answers.append(Candidate(target, score, result.status, floor))
        if best is None or score < best[0]:
            best = (score, result)
    if best is None:
        raise first_error
    stops = {r.stopped for r in results}
    result = replace(best[1], seconds=sum(r.seconds for r in results), space_size=sum(r.space_size for r in results),
                     search_seconds=sum(r.search_seconds for r in results),
                     stopped="time" if "time" in stops else "work" if "work" in stops else "")
    if not all(a.status in ("OPTIMAL", "INFEASIBLE") for a in answers):
        floor = min(a.bound for a in answers if a.bound is not None)
        result = replace(result, status="FEASIBLE", gap=max(0.0, (best[0] - floor) / best[0]))
    result.domains_note = note(answers, result.problem.target)
    return result, answers


def note(answers: list[Candidate], chosen: Target) -> str:
    """What was excluded, what the plan runs on, and what each other candidate gave."""
    others = [f"{len(a.target.remaining.domains)} domain(s) of {a.target.instances_per_domain} instance(s): "
              + ("nothing fits" if a.score is None else f"{a.score:.3f} s ({a.status})")
              for a in answers if a.target is not chosen]
    return describe(chosen) + (f"; other candidate machines: {'; '.join(others)}" if others else "")
