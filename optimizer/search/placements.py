"""The placements of a degree tuple: every way to give each parallel family a factor of each
physical axis (a row), the rows of one family built axis by axis under the instance-block rule,
and the symmetry rule that leaves out the mirror images of identical axes (the rule
LayoutModel._constraints puts on the CP-SAT model, so both searches see the same placements).
"""

from __future__ import annotations

import functools
import itertools
import math

from trnopt.optimizer.search.space import block_step, divisors

PLACED = ("tp", "cp", "ep", "edp", "pp")  # the variable family of each Layout placement row, in DIMS order
MAX_PLACEMENTS = 20_000  # placements scored in one branch before it is left to CP-SAT whole (spacebounds)


def interchangeable(axes) -> list[int]:
    """Each j whose axes j and j + 1 are identical (kind, size, bandwidth, latency, closed or a line)."""
    return [j for j in range(len(axes) - 1)
            if (axes[j].kind, axes[j].size, axes[j].bandwidth, axes[j].latency, axes[j].closed)
            == (axes[j + 1].kind, axes[j + 1].size, axes[j + 1].bandwidth, axes[j + 1].latency, axes[j + 1].closed)]


def axis_key(active: list[str], axis_divisors: list, j: int, factor_index) -> int:
    """The ``active`` families' factors on axis j as one mixed-radix number, the first family most
    significant; ``factor_index(family, j)`` is a factor's position in the axis's divisors."""
    base = len(axis_divisors[j])
    return sum(base ** (len(active) - 1 - i) * factor_index(d, j) for i, d in enumerate(active))


def canonical(axes, active: list[str], axis_divisors: list, rows: dict[str, tuple[int, ...]],
              pairs: list[int] | None = None) -> bool:
    """Whether a placement (family -> row) keeps the symmetry rule of LayoutModel._constraints:
    of identical axes, the earlier holds the larger factors (mirrors of a placement are left out).
    ``pairs``: ``interchangeable(axes)``, if the caller has it."""
    def index(d, j):
        return axis_divisors[j].index(rows[d][j])
    return all(axis_key(active, axis_divisors, j, index) >= axis_key(active, axis_divisors, j + 1, index)
               for j in (interchangeable(axes) if pairs is None else pairs))


def placements(axes: tuple, active: tuple[str, ...], inside: tuple[int, ...] | None, degrees: dict[str, int]):
    """SpaceBounds.placements on ``axes`` with the ``active`` families; ``inside``: each axis's
    share inside an instance (placement.instance_prefix) where instance blocks are asked, else None."""
    ones, axis_divisors = (1,) * len(axes), [divisors(a.size) for a in axes]
    families, pairs = [d for d in PLACED if degrees[d] > 1], interchangeable(axes)

    def extend(i: int, left: tuple[int, ...], chosen: list, blocks):
        if i == len(families):
            rows = dict(zip(families, chosen))
            if pairs and not canonical(axes, list(active), axis_divisors, {d: rows.get(d, ones) for d in active},
                                       pairs):
                return  # the mirror of another placement (identical axes), which the model excludes
            ep, edp = rows.get("ep", ones), rows.get("edp", ones)
            yield {"span.tp": rows.get("tp", ones), "span.cp": rows.get("cp", ones), "span.ep": ep,
                   "span.edp": edp, "span.pp": rows.get("pp", ones),
                   "span.dp": tuple(a * b for a, b in zip(ep, edp))}
            return
        if i == len(families) - 1:  # the last family takes what is left, which must be its degree
            after = block_step(inside, blocks, left) if inside is not None else None
            if math.prod(left) != degrees[families[i]] or (inside is not None and after is None):
                return
            rows = ((left, after),)
        else:
            rows = rows_within(left, degrees[families[i]], inside, blocks)
        for row, after in rows:
            yield from extend(i + 1, tuple(n // r for n, r in zip(left, row)), chosen + [row], after)

    yield from extend(0, tuple(a.size for a in axes), [], ((1,) * len(axes), False))


@functools.lru_cache(maxsize=4096)
def first_placements(axes: tuple, active: tuple[str, ...], inside: tuple[int, ...] | None,
                      degrees: tuple[tuple[str, int], ...]) -> tuple[dict, ...]:
    """The first MAX_PLACEMENTS + 1 placements of ``placements`` (shared: read, never changed)."""
    return tuple(itertools.islice(placements(axes, active, inside, dict(degrees)), MAX_PLACEMENTS + 1))


@functools.lru_cache(maxsize=65536)
def rows_within(left: tuple[int, ...], degree: int, inside: tuple[int, ...] | None = None,
                 blocks=None) -> tuple[tuple[tuple[int, ...], object], ...]:
    """Every row (a factor per axis) dividing ``left`` axis by axis whose product is ``degree``,
    each with the instance-block state after it; with ``inside`` (placement.instance_prefix), only
    the rows that keep the rule after state ``blocks`` (space.block_step), checked axis by axis as
    the row grows, so a row that breaks it is cut at its first axis (most rows break it: at 64
    UltraServers, 20 placements out of 5,000 rows for three degree tuples), in the same order."""
    rest = [math.prod(left[j:]) for j in range(len(left) + 1)]
    out: list = []

    def grow(j: int, need: int, row: tuple, outside: bool):
        if j == len(left):
            out.append((row, None if inside is None else (tuple(c * f for c, f in zip(blocks[0], row)), outside)))
            return
        for factor in divisors(math.gcd(left[j], need)):
            if rest[j + 1] % (need // factor):
                continue
            now = outside
            if inside is not None and factor > 1:  # block_step's test of axis j
                before, k = blocks[0][j], inside[j]
                is_in, is_out = k % (before * factor) == 0, before % k == 0
                if not (is_in or is_out or (k % before == 0 and (before * factor) % k == 0)):
                    continue
                if not is_out and outside:
                    continue
                now = outside or not is_in
            grow(j + 1, need // factor, row + (factor,), now)

    grow(0, degree, (), False if blocks is None else blocks[1])
    return tuple(out)
