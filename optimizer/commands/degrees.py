"""Whether any parallel degrees fit a machine at all: a proof for exit 3 before any search.

A layout needs tp * cp * dp * pp = ranks, with tp dividing the attention heads (and
dividing or being a multiple of the KV heads), cp dividing the sequence and at most
search.space.CP_MAX (only from search.space.CP_MIN_SEQ on; else 1), pp at most the layers and dp dividing the global
batch (micro-batch 1 is always allowed; ep is carved out of dp and 1 always works). When
no such product equals the rank count, no layout exists, whatever the memory: that is
proven here by enumerating the few candidates (divisors of the heads, of the sequence and
of the batch), and the message says what would fit instead.
"""

from __future__ import annotations

import math

from trnopt.optimizer.cost.memory import usable_hbm
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload
from trnopt.optimizer.search.space import CP_MAX, CP_MIN_SEQ, divisors
from trnopt.optimizer.search.domains import LeastMemory


class Degrees:
    """The candidate degrees of one workload, and whether they can multiply to a rank count."""

    def __init__(self, workload: Workload):
        m, t = workload.model, workload.training
        self.tp = [d for d in divisors(m.heads) if m.kv_heads % d == 0 or d % m.kv_heads == 0]
        self.cp = [d for d in divisors(t.seq) if d <= CP_MAX] if t.seq >= CP_MIN_SEQ else [1]
        self.dp = list(divisors(t.global_batch))
        self.layers = m.layers

    def fit(self, ranks: int) -> bool:
        for tp in self.tp:
            if ranks % tp:
                continue
            for cp in self.cp:
                if (ranks // tp) % cp:
                    continue
                rest = ranks // (tp * cp)
                if any(rest % dp == 0 and rest // dp <= self.layers for dp in self.dp):
                    return True
        return False

    def largest(self) -> int:
        return max(self.tp) * max(self.cp) * max(self.dp) * self.layers

    def most_domains(self, per_domain: int, top: int) -> int:
        """The largest domain count <= ``top`` whose ranks (``per_domain`` each) the degrees tile, or 0.

        For each product x = tp*cp*dp, pp must make x*pp a multiple of per_domain: a multiple
        of per_domain / gcd(x, per_domain), at most the layers and at most top*per_domain / x.
        """
        best = 0
        for x in {tp * cp * dp for tp in self.tp for cp in self.cp for dp in self.dp}:
            step = per_domain // math.gcd(x, per_domain)
            pp = min(self.layers, top * per_domain // x) // step * step
            if pp:
                best = max(best, x * pp // per_domain)
        return best


def tiles(degrees: Degrees, target: Target, lnc_values: tuple[int, ...], domains: int) -> bool:
    return any(degrees.fit(target.ranks(lnc, domains)) for lnc in lnc_values)


def check_degrees(workload: Workload, target: Target, lnc_values: tuple[int, ...], domains: int | None,
                  most: int = 64) -> int:
    """Raise InfeasibleError, with the proof and what would tile, when no degrees tile the machine.

    ``domains`` None: the search will try 1..``most`` domains; refused when none tiles, else
    the largest that tiles is returned. Otherwise ``domains`` is returned when it tiles.
    """
    degrees = Degrees(workload)
    m, t = workload.model, workload.training
    rule = (f"the ranks must be tp*cp*dp*pp with tp dividing the {m.heads} heads (tp <= {max(degrees.tp)}), "
            + (f"cp dividing the sequence {t.seq} (cp <= {max(degrees.cp)})" if t.seq >= CP_MIN_SEQ
               else f"cp 1 (sequence under {CP_MIN_SEQ})")
            + f", dp dividing the global batch {t.global_batch:,} and pp <= {m.layers} layers")
    if domains is None:
        largest = next((d for d in range(most, 0, -1) if tiles(degrees, target, lnc_values, d)), None)
        if largest is not None:
            return largest
        raise InfeasibleError(f"no layout of {m.name} exists on 1 to {most} {target.name} domains, whatever the "
                              f"memory: {rule}, and no such product equals their rank counts (the largest is "
                              f"{degrees.largest():,}); what would tile: a global batch (--global-batch) or "
                              "model with more divisors")
    if tiles(degrees, target, lnc_values, domains):
        return domains
    ranks = ", ".join(f"{target.ranks(lnc, domains):,} ranks at LNC={lnc}" for lnc in lnc_values)
    why = (f"no layout of {m.name} exists on {domains:,} x {target.name} ({ranks}), whatever the memory: "
           f"{rule}, and no such product equals it (the largest is {degrees.largest():,})")
    smaller = max(degrees.most_domains(target.ranks(lnc, 1), domains - 1) for lnc in lnc_values)
    if smaller:
        size = f"--ultraservers {smaller}" if target.instances_per_domain > 1 else f"--instances {smaller}"
        fix = (f"what would tile: {smaller:,} domains ({size}; whether a layout fits its memory is the "
               "search's to say), or a global batch with more divisors")
    else:
        fix = "what would tile: fewer domains, or a global batch (--global-batch) with more divisors"
    raise InfeasibleError(f"{why}; {fix}")


def fits_on_no_count(workload: Workload, target: Target, headroom: float, most: int, tiled: int,
                     need: float | LeastMemory) -> str:
    """Why no domain count up to ``most`` fits, with the least-memory layout on ``tiled`` domains (the most
    that tile) and its cost-model memory (``LeastMemory``), or a bare floor in bytes."""
    m = workload.model
    if isinstance(need, LeastMemory):
        floor = f"on {tiled} domains {need.text()}"
    elif math.isfinite(need):
        floor = f"on {tiled} domains the least memory any layout needs is at least {need / 2**30:.1f} GiB per chip"
    else:
        floor = f"on {tiled} domains no layout's memory could be bounded within the search's limits"
    return (f"{m.name} fits on no count of {target.name} domains up to {most} with {headroom:.0%} headroom: {floor}, "
            f"against {usable_hbm(target, headroom) / 2**30:.1f} GiB usable; what would fit: more domains (--ultraservers/--instances), a smaller global batch or sequence, "
            "or a smaller --headroom")
