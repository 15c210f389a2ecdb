"""The robust choice against exhaustive search: among the layouts of the fastest's LNC within
the uncertainty, the least lean of TP on slow axes, then the least memory."""

import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.search.driver import robust_choice
from trnopt.optimizer.search.space import Space, prime_exponents

from test_solver import small_problems

SETTINGS = dict(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 15)), deadline=None,
                derandomize=not os.environ.get("TRNOPT_EXAMPLES"), suppress_health_check=[HealthCheck.too_slow])
UNCERTAINTY = 0.03


def lean(layout) -> int:
    """TP's prime factors on each axis, weighted by the axis's rank in speed order (cpsat.prefer_robust)."""
    return sum(j * sum(prime_exponents(f).values()) for j, f in enumerate(layout.placement[0]))


@settings(**SETTINGS)
@given(problem=small_problems())
def test_robust_choice_is_the_least_lean_then_least_memory_within_the_uncertainty(problem):
    problem = replace(problem, objective="step-time")
    fastest = brute_force(problem).best
    if fastest is None:
        return
    cap = fastest.step.total * (1 + UNCERTAINTY)
    chosen = robust_choice(problem, fastest, UNCERTAINTY, seed=0, time_limit=30)
    assert chosen.fits and chosen.layout.lnc == fastest.layout.lnc
    assert chosen.step.total <= cap * (1 + 1e-9), (chosen.step.total, cap)
    near = [e for e in map(problem.evaluate, Space(problem, fastest.layout.lnc).layouts())
            if e.fits and e.step.total <= cap * (1 - 1e-6)]  # clear of the integer model's rounding at the cap
    if not near:
        return
    least = min(lean(e.layout) for e in near)
    assert lean(chosen.layout) <= least, (chosen.layout.describe(), least)
    if lean(chosen.layout) == least:
        # memory in whole MiB, as the model minimises it, less its rounding
        best = min(e.memory.total for e in near if lean(e.layout) == least)
        assert chosen.memory.total <= best + 2 * 2**20, (chosen.memory.total, best)
