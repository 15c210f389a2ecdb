"""The rank-to-chip map of a layout, and what it says about where each TP group runs."""

from __future__ import annotations

from dataclasses import dataclass

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import Target


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


def tp_summary(layout: Layout, places: list[RankPlace]) -> TpSummary:
    tp_groups = groups(layout, places, "tp")
    g = tp_groups[0]
    return TpSummary(len(tp_groups), len(g), len({(p.domain, p.instance, p.chip) for p in g}),
                     max(len({(p.domain, p.instance) for p in grp}) for grp in tp_groups),
                     max(len({p.domain for p in grp}) for grp in tp_groups))


def instance_table(layout: Layout, places: list[RankPlace], limit: int = 8) -> list[str]:
    """Compact picture: which TP groups and pipeline stages sit in each instance (first ``limit``)."""
    tp_groups = groups(layout, places, "tp")
    group_of = {p.rank: i for i, grp in enumerate(tp_groups) for p in grp}
    lines, seen = [], {}
    for p in places:
        seen.setdefault((p.domain, p.instance), []).append(p)
    for (domain, inst), ranks in sorted(seen.items())[:limit]:
        tps = sorted({group_of[p.rank] for p in ranks})
        stages = sorted({p.coords["pp"] for p in ranks})
        lines.append(f"  domain {domain} instance {inst}: {len(ranks)} ranks {_rank_set([p.rank for p in ranks])}, "
                     f"TP groups {_ranges(tps)}, pipeline stages {_ranges(stages)}")
    if len(seen) > limit:
        lines.append(f"  ... {len(seen) - limit} more instances, same pattern")
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


def rank_map_rows(layout: Layout, target: Target) -> list[dict]:
    """JSON rows: rank, domain, instance, chip, core and the rank's coordinate per dimension."""
    return [{"rank": p.rank, "domain": p.domain, "instance": p.instance, "chip": p.chip, "core": p.core,
             **{d: p.coords[d] for d in DIMS}} for p in rank_map(layout, target)]
