"""Layouts built directly from placement rows, for the framework tests (no solve)."""

from __future__ import annotations

import math
import random

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import Target, load_target


def build(target: Target | str, domains: int, rows: dict[str, dict[str, int]], lnc: int = 2, **decisions) -> Layout:
    """A layout from ``dim -> {axis name: factor}``; the degrees follow from the rows (dp's row holds dp // ep)."""
    target = load_target(target) if isinstance(target, str) else target
    axes = target.axes(lnc, domains)
    placement = tuple(tuple(rows.get(d, {}).get(a.name, 1) for a in axes) for d in DIMS)
    deg = {d: math.prod(rows.get(d, {}).values()) for d in DIMS}
    decisions.setdefault("zero", 3)
    return Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"] * deg["ep"], ep=deg["ep"], cp=deg["cp"], axes=axes,
                  placement=placement, lnc=lnc, **decisions)


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def random_layout(target: Target, domains: int, rng: random.Random, lnc: int = 2, dims=DIMS) -> Layout:
    """Every prime factor of every axis given to a random dimension of ``dims``."""
    axes = target.axes(lnc, domains)
    rows = {d: {} for d in DIMS}
    for a in axes:
        for p in _primes(a.size):
            d = rng.choice(dims)
            rows[d][a.name] = rows[d].get(a.name, 1) * p
    return build(target, domains, rows, lnc)


# The three shapes the exports and launch files are tested on.
def llama405b_trn2u_x2() -> tuple[Target, Layout]:
    """TP4 inside each chip, FSDP over the torus and the ring, HSDP replicas across EFA."""
    t = load_target("trn2u")
    return t, build(t, 2, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4, "ring": 4, "efa": 2}}, recompute="full",
                    dp_replicate=2)


def deepseek_trn3_gen2() -> tuple[Target, Layout]:
    """TP4 in a chip, EP8 over two servers, DP2 beyond them, PP9 across the rest of the switch."""
    t = load_target("trn3-gen2")
    return t, build(t, 1, {"tp": {"core": 4}, "ep": {"switch": 8}, "dp": {"switch": 2}, "pp": {"switch": 9}},
                    recompute="op")


def llama8b_trn2() -> tuple[Target, Layout]:
    """TP4 on the torus x axis with DP over the cores: a placement that needs core binding."""
    t = load_target("trn2")
    return t, build(t, 1, {"tp": {"x": 4}, "dp": {"core": 4, "y": 4}}, recompute="op", micro_batch=1)
