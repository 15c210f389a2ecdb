"""The rank-to-chip map of a layout, and what it says about where each TP group runs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.partial import physical
from trnopt.optimizer.model.target import Axis, Target


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: domain, instance within the domain, chip within the instance, logical core."""

    rank: int
    domain: int
    instance: int
    chip: int
    core: int
    coords: dict[str, int]  # coordinate per parallel dimension


def rank_map(layout: Layout, target: Target) -> list[RankPlace]:
    """Every rank's place. Domain axes are numbered fastest first (x + 4y + 16 ring on trn2u)."""
    out = []
    domain_axes = layout.axes[1:-1]
    for rank in range(layout.ranks):
        dims, axis_coord = layout.rank_coordinates(rank)
        chip_in_domain, stride = 0, 1
        for axis, c in zip(domain_axes, axis_coord[1:-1]):
            chip_in_domain += c * stride
            stride *= axis.size
        out.append(RankPlace(rank, axis_coord[-1], chip_in_domain // target.chips_per_instance,
                             chip_in_domain % target.chips_per_instance, axis_coord[0], dims))
    return out


def groups(layout: Layout, places: list[RankPlace], dim: str) -> list[list[RankPlace]]:
    """The groups of one dimension: ranks that share every other coordinate."""
    by_key: dict[tuple, list[RankPlace]] = {}
    for p in places:
        key = tuple(v for d, v in p.coords.items() if d != dim)
        by_key.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: p.coords[dim]) for g in by_key.values()]


def expert_groups(layout: Layout, places: list[RankPlace]) -> list[list[RankPlace]]:
    """The expert-parallel groups: ranks that share every coordinate but ep's, and tp's too when
    expert TP 1 folds EP over the TP ranks (Layout.ep_fold; tp digits fastest, as Megatron-Core's
    expert rank order etp, ep, edp, pp puts them)."""
    folded = ("tp", "ep") if layout.ep_fold > 1 else ("ep",)
    by_key: dict[tuple, list[RankPlace]] = {}
    for p in places:
        by_key.setdefault(tuple(v for d, v in p.coords.items() if d not in folded), []).append(p)
    return [sorted(g, key=lambda p: (p.coords["ep"], p.coords["tp"])) for g in by_key.values()]


# -- one rank at a time: the map without a list of every rank ---------------------------------------
def rank_of(layout: Layout, axis_coord: tuple[int, ...]) -> int:
    """The rank at a coordinate per axis: the inverse of ``Layout.rank_coordinates``."""
    n = len(DIMS)
    coord, stride = [0] * n, [1] * n
    for j, c in enumerate(axis_coord):
        for i in range(n):
            f = layout.placement[i][j]
            digit, c = c % f, c // f
            coord[i] += digit * stride[i]
            stride[i] *= f
    rank, scale = 0, 1
    for i in range(n):
        rank += coord[i] * scale
        scale *= stride[i]
    return rank


def place_of(layout: Layout, target: Target, rank: int) -> RankPlace:
    """Where one rank runs (as ``rank_map`` gives it, without building the others)."""
    dims, axis_coord = layout.rank_coordinates(rank)
    chip_in_domain, stride = 0, 1
    for axis, c in zip(layout.axes[1:-1], axis_coord[1:-1]):
        chip_in_domain += c * stride
        stride *= axis.size
    return RankPlace(rank, axis_coord[-1], chip_in_domain // target.chips_per_instance,
                     chip_in_domain % target.chips_per_instance, axis_coord[0], dims)


def chip_coordinates(layout: Layout, chip: int) -> tuple[int, ...]:
    """A chip's coordinates on the domain's axes (those between the core axis and the scale-out
    axis), from its index in the domain, the first axis fastest."""
    coords = []
    for axis in layout.axes[1:-1]:
        coords.append(chip % axis.size)
        chip //= axis.size
    return tuple(coords)


def instance_ranks(layout: Layout, target: Target, domain: int, instance: int) -> list[int]:
    """The ranks on one instance, by chip and core (chips * cores of one instance: bounded by the target)."""
    out = []
    for chip in range(instance * target.chips_per_instance, (instance + 1) * target.chips_per_instance):
        coords = chip_coordinates(layout, chip)
        out += [rank_of(layout, (core, *coords, domain)) for core in range(layout.ranks_per_chip)]
    return out


def tp_group(rank: int, layout: Layout) -> int:
    """TP group index of a rank: groups are numbered in rank order, and tp is the fastest coordinate."""
    return rank // layout.tp


def stage(rank: int, layout: Layout) -> int:
    """Pipeline stage of a rank: pp is the slowest coordinate."""
    return rank // (layout.ranks // layout.pp)


@dataclass(frozen=True)
class TpSummary:
    groups: int
    size: int
    chips_per_group: int
    instances_per_group: int
    domains_per_group: int

    def check_line(self, layout: Layout) -> str:
        crosses = [a.name for a, f in layout.span("tp") if a.kind in ("ring", "scale_out")]
        if self.instances_per_group <= 1 and self.domains_per_group <= 1:
            return (f"check: every TP group stays inside one instance "
                    f"({self.groups} groups of {self.size} ranks on {self.chips_per_group} chip(s) each); "
                    "none crosses the UltraServer ring or EFA")
        return (f"check: TP groups span {self.instances_per_group} instances over {', '.join(crosses) or 'the switch'}"
                " - chosen on purpose by the search (its cost is in the TP term above)")


def tp_summary(layout: Layout, target: Target) -> TpSummary:
    """How far one TP group reaches, computed from the placement without a list of ranks.

    tp is the innermost digit on every axis, so a group occupies on axis j the positions
    ``d + f_j * o_j`` (d < f_j, the group's factor; o_j fixed by its other coordinates): it
    has prod(f_j) chips over the domain axes and f_out domains. Instances per group is the
    largest over the offsets o of one domain (at most the chips of a domain to visit).
    """
    rows = layout.placement[DIMS.index("tp")]
    domain_axes = layout.axes[1:-1]
    f = rows[1:-1]
    strides, s = [], 1
    for a in domain_axes:
        strides.append(s)
        s *= a.size
    inside = [sum(c) for c in itertools.product(*([d * st for d in range(fj)] for fj, st in zip(f, strides)))]
    most = 0
    for offset in itertools.product(*(range(a.size // fj) for a, fj in zip(domain_axes, f))):
        base = sum(o * fj * st for o, fj, st in zip(offset, f, strides))
        most = max(most, len({(base + c) // target.chips_per_instance for c in inside}))
    return TpSummary(layout.ranks // layout.tp, layout.tp, math.prod(rows[1:]), most * rows[-1], rows[-1])


def instance_table(layout: Layout, target: Target, limit: int = 8) -> list[str]:
    """Compact picture: which TP groups and pipeline stages sit in each instance (first ``limit``)."""
    lines = []
    per_domain = target.instances_per_domain
    total = layout.domains * per_domain
    for k in range(min(limit, total)):
        domain, inst = divmod(k, per_domain)
        ranks = sorted(instance_ranks(layout, target, domain, inst))
        tps = sorted({tp_group(r, layout) for r in ranks})
        stages = sorted({stage(r, layout) for r in ranks})
        whole = physical(target, domain, inst)
        lines.append(f"  domain {whole[0]} instance {whole[1]}: {len(ranks)} ranks {_rank_set(ranks)}, "
                     f"TP groups {_ranges(tps)}, pipeline stages {_ranges(stages)}")
    if total > limit:
        lines.append(f"  ... {total - limit} more instances, same pattern")
    return lines


def _rank_set(ranks: list[int]) -> str:
    """'0..63' when contiguous, '0..252 step 4' when evenly spaced, else the ranges."""
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    if len(steps) == 1 and steps != {1}:
        return f"{ranks[0]}..{ranks[-1]} step {steps.pop()}"
    return _ranges(ranks).replace("-", "..")


def _ranges(values: list[int]) -> str:
    if not values:
        return "-"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def rank_map_summary(layout: Layout, target: Target, limit: int = 8) -> dict:
    """The rank map in a few lines of JSON: the rule, the TP reach and the first instances' ranks."""
    per_domain = target.instances_per_domain
    first = []
    for k in range(min(limit, layout.domains * per_domain)):
        domain, inst = divmod(k, per_domain)
        whole = physical(target, domain, inst)
        first.append({"domain": whole[0], "instance": whole[1],
                      "ranks": _rank_set(sorted(instance_ranks(layout, target, domain, inst)))})
    tp = tp_summary(layout, target)
    return {"rule": "rank order tp, cp, ep, dp, pp (tp fastest); on each axis the dimensions nest in that "
                    "order; chip number in a domain = x + size_x * (y + size_y * ...) over the domain axes",
            "ranks": layout.ranks, "ranks_per_chip": layout.ranks_per_chip,
            "instances": layout.domains * per_domain, "first_instances": first,
            "tp_groups": {"count": tp.groups, "size": tp.size, "chips_per_group": tp.chips_per_group,
                          "instances_per_group": tp.instances_per_group, "domains_per_group": tp.domains_per_group},
            "full_map": "--rank-map FILE writes one row per rank (CSV, as check-map reads it)"}


@dataclass(frozen=True)
class PlannedMap:
    """Every rank's place as four integer lists indexed by rank (a few bytes per rank, no object per rank)."""

    domain: list[int]
    instance: list[int]
    chip: list[int]
    core: list[int]


def place_columns(layout: Layout, target: Target, start: int = 0, stop: int | None = None):
    """(domain, instance, chip, core) of ranks start..stop-1 as NumPy integer arrays (``rank_map`` without objects)."""
    import numpy as np

    stop = layout.ranks if stop is None else stop
    rest = np.arange(start, stop, dtype=np.int64)
    coords = [np.zeros(stop - start, dtype=np.int64) for _ in layout.axes]
    strides = [1] * len(layout.axes)
    for i, d in enumerate(DIMS):
        n = layout.placement_degree(d)
        value, rest = rest % n, rest // n
        for j in range(len(layout.axes)):
            f = layout.placement[i][j]
            coords[j] += (value % f) * strides[j]
            value = value // f
            strides[j] *= f
    chip_in_domain, stride = np.zeros(stop - start, dtype=np.int64), 1
    for axis, c in zip(layout.axes[1:-1], coords[1:-1]):
        chip_in_domain += c * stride
        stride *= axis.size
    per = target.chips_per_instance
    return coords[-1], chip_in_domain // per, chip_in_domain % per, coords[0]


def whole_machine(target: Target, domain, instance, chip, core):
    """(domain, instance, chip, core) columns with a partial machine's domains and instances renumbered
    as the whole machine's (``Target.remaining``); unchanged on a whole machine. Chips keep their
    number: a partial machine keeps whole instances."""
    rem = target.remaining
    if rem is None:
        return domain, instance, chip, core
    import numpy as np

    return np.asarray(rem.domains)[domain], np.asarray(rem.instances)[domain, instance], chip, core


def planned_map(layout: Layout, target: Target) -> PlannedMap:
    """``rank_map`` as integer columns, computed with NumPy (the rank map file of a job is this long)."""
    return PlannedMap(*(column.tolist() for column in place_columns(layout, target)))


MAX_CSV_RANKS = 2**24  # rows of a written rank map: 16 M ranks, ~0.5 GB of CSV


def rank_map_csv(layout: Layout, target: Target, chunk: int = 2**16) -> Iterator[str]:
    """The planned rank map as CSV in the format check-map reads (rank,instance,chip,core[,ultraserver],lnc).

    Instance ids are ``d<domain>i<instance>`` and UltraServer ids ``d<domain>`` (on targets
    whose domain has several instances), so that check-map of this file against its layout passes.
    On a partial machine they are the whole machine's ids (``whole_machine``): the hole's ids are absent.
    """
    multi = target.instances_per_domain > 1 or target.remaining is not None
    yield "rank,instance,chip,core" + (",ultraserver" if multi else "") + ",lnc\n"
    for start in range(0, layout.ranks, chunk):
        stop = min(layout.ranks, start + chunk)
        domain, instance, chip, core = (c.tolist() for c in whole_machine(target, *place_columns(layout, target,
                                                                                                  start, stop)))
        yield "".join(f"{r},d{d}i{i},{c},{k}" + (f",d{d}" if multi else "") + f",{layout.lnc}\n"
                      for r, d, i, c, k in zip(range(start, stop), domain, instance, chip, core))


def instance_prefix(axes: tuple[Axis, ...], chips_per_instance: int) -> list[int]:
    """Per axis, how many of its first positions one instance holds: all of the core axis,
    none of the scale-out axis, a prefix of a domain axis (instances are the fastest chips)."""
    out, below = [], 1
    for axis in axes:
        if axis.kind == "core":
            out.append(axis.size)
        elif axis.kind == "scale_out":
            out.append(1)
        else:
            per = chips_per_instance // below if chips_per_instance % below == 0 else 1
            out.append(math.gcd(per, axis.size) if below <= chips_per_instance else 1)
            below *= axis.size
    return out
