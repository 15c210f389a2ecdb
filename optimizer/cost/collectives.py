"""Collective times on the links a group spans (alpha-beta model).

Base formulas (Thakur et al., "Optimization of Collective Communication Operations in
MPICH", 2005; Patarasuk & Yuan, 2009 for the bandwidth-optimal ring), S = bytes per rank:

    ring all-reduce        2(n-1)/n * S / B + 2(n-1) * alpha
    ring reduce-scatter    (n-1)/n * S / B + (n-1) * alpha        (S = the unreduced input)
    ring all-gather        (n-1)/n * S / B + (n-1) * alpha        (S = the gathered output)
    point-to-point         S / B + alpha

A group spans factors of several physical axes. Its collective runs level by level,
innermost first (chip, then the scale-up domain, then scale-out), each level on the data
the inner levels left (S divided by the inner group sizes), the classic hierarchical
algorithm. Inside the domain the group's chips form one set of rings:
- axes of one kind (the two axes of a torus) carry traffic at once, so their bandwidths
  add: 16 chips in the trn2 4x4 torus get 512 + 512 = 1,024 GB/s, the seed's figure;
- a ring that crosses axes of different kinds (torus and UltraServer ring) runs at the
  slower kind's rate, the bottleneck: a TP group across the ring costs 4x its in-torus
  time, the seed's "classic silent slowdown";
- a group that takes only part of a torus or ring axis forms a line, whose embedded ring
  uses each link in one direction only: half the axis bandwidth.
All ranks on a chip run their groups' collectives at the same time, so a chip's link
bandwidth is shared by its ``ranks_per_chip`` ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnopt.optimizer.model.target import Axis

Span = tuple[tuple[Axis, int], ...]
LEVELS = ("chip", "domain", "scale_out")


def ring_allreduce_time(size: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """2(n-1)/n * S / B + 2(n-1) * alpha (Patarasuk & Yuan 2009). The seed's worked cases use alpha = 0."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


@dataclass(frozen=True)
class Level:
    """One step of a hierarchical collective: n members, per-rank bandwidth, hop latency."""

    name: str
    n: int
    bandwidth: float
    latency: float
    link_class: str
    longest_ring: int  # largest factor on one torus/ring axis (bisection of all-to-all)


def axis_bandwidth(axis: Axis, factor: int) -> float:
    """Per-chip bandwidth a group with ``factor`` chips on ``axis`` can use: all of it on a
    switch, a closed ring or the scale-out network; half on a line (part of a ring axis)."""
    if axis.kind in ("torus", "ring") and factor < axis.size:
        return axis.bandwidth / 2
    return axis.bandwidth


def levels(span: Span, ranks_per_chip: int) -> list[Level]:
    """The chip / domain / scale-out levels a group spans, innermost first."""
    out = []
    for level in LEVELS:
        part = [(a, f) for a, f in span if a.level == level]
        if not part:
            continue
        n = math.prod(f for _, f in part)
        by_kind: dict[str, float] = {}
        for a, f in part:
            by_kind[a.kind] = by_kind.get(a.kind, 0.0) + axis_bandwidth(a, f)
        slowest = min(by_kind, key=by_kind.get)
        chip_bw = by_kind[slowest]
        # ranks on one chip share its links; on-chip traffic is per rank already
        per_rank = chip_bw if level == "chip" else chip_bw / ranks_per_chip
        latency = max(a.latency for a, _ in part)
        ring = max((f for a, f in part if a.kind in ("torus", "ring")), default=1)
        out.append(Level(level, n, per_rank, latency, slowest, ring))
    return out


def coefficients(op: str, span: Span, ranks_per_chip: int = 1) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) of collective ``op`` on a group: time = S * a + b.

    Every collective here is linear in S, which lets the solver tabulate the two numbers
    per placement and scale them by the message size. ``op`` is one of:
    - ``all_reduce``: hierarchical, per level 2(n-1)/n / (inner * B) and 2(n-1) alpha;
    - ``all_gather`` (and ``reduce_scatter``): per level (n-1)/n / (inner * B), (n-1) alpha;
    - ``all_to_all``: per level (n_here - n_inner)/n_group / B, times k/4 on a torus or
      ring of k chips per axis where the bisection binds (Dally & Towles 2004, ch. 3),
      plus one alpha: the bytes leaving each inner block cross that level's links;
    - ``p2p``: a send to the neighbouring stage across the slowest axis spanned: one of
      the chip's two links on a torus or ring axis (half its bandwidth), all of it on a
      switch or the scale-out network.
    """
    lvs = levels(span, ranks_per_chip)
    per_byte = fixed = 0.0
    if op == "p2p":
        for a, _ in span:
            bw = a.bandwidth / 2 if a.kind in ("torus", "ring") else a.bandwidth
            bw = bw if a.kind == "core" else bw / ranks_per_chip
            if 1 / bw > per_byte:
                per_byte, fixed = 1 / bw, a.latency
        return per_byte, fixed
    group, inner = math.prod(lv.n for lv in lvs), 1
    for lv in lvs:
        if op == "all_reduce":
            per_byte += 2 * (lv.n - 1) / lv.n / (inner * lv.bandwidth)
            fixed += 2 * (lv.n - 1) * lv.latency
        elif op in ("all_gather", "reduce_scatter"):
            per_byte += (lv.n - 1) / lv.n / (inner * lv.bandwidth)
            fixed += (lv.n - 1) * lv.latency
        elif op == "all_to_all":
            bisection = max(1.0, lv.longest_ring / 4) if lv.link_class in ("torus", "ring") else 1.0
            per_byte += (inner * lv.n - inner) / group / lv.bandwidth * bisection
            fixed += lv.latency
        else:
            raise ValueError(f"unknown collective {op!r}")
        inner *= lv.n
    return per_byte, fixed


def collective_time(op: str, size: float, span: Span, ranks_per_chip: int = 1) -> float:
    """Seconds for ``op`` on ``size`` bytes per rank over the group ``span`` (see ``coefficients``);
    nothing to send costs nothing."""
    if not span or size <= 0:
        return 0.0
    per_byte, fixed = coefficients(op, span, ranks_per_chip)
    return size * per_byte + fixed


def link_class(span: Span) -> str:
    """The link class of a group's outermost level (core, torus, ring, switch, scale_out)."""
    lvs = levels(span, 1)
    if not lvs:
        return "none"
    return lvs[-1].link_class
