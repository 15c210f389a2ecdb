"""Ring helpers shared by the collective kernels: replica groups, channels and chunk offsets.

Semantics from the "nki.collectives" pages (NKI 0.7): a ReplicaGroup is a list of
disjoint rank-lists, the order of a rank-list is the ring order; on channel c of
``collective_permute_implicit`` every rank sends to its ring successor and receives from
its predecessor (the simulator runs even channels forward and odd channels backward, the
two directions of a torus ring); ``collective_permute_implicit_current_processing_rank_id``
names the rank whose data is in hand after i steps.

Offsets of rank-dependent chunks are formed from the ring position, never by indexing a
Python list with a rank id: on hardware the rank id is a scalar register, and the offset
of a chunk is register arithmetic (position * chunk size) fed to a dynamic access
pattern. `position_after` gives that arithmetic (it works on ints and on registers).
"""

from __future__ import annotations

from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nl
from trnopt.kernels.tiling import split_rows

# Ring transfers go in slabs of about this many bytes per channel: ~1.4 us of a core's
# 368 GB/s DMA bandwidth ("NKI Performance Guide"), short enough to interleave with the
# matmul's own loads; each slab pays one hop latency.
SLAB_BYTES = 512 * 1024


def replica_group(groups: Sequence[Sequence[int]], channels: int, what: str):
    """``(ReplicaGroup, ring size)`` for a ring kernel ``what``, asserting rank-lists of equal
    size and ``channels`` in (1, 2, 4)."""
    sizes = {len(g) for g in groups}
    assert len(sizes) == 1, f"{what}: replica groups must have equal sizes, got {[len(g) for g in groups]}"
    assert channels in (1, 2, 4), f"{what}: channels must be 1, 2 or 4, got {channels}"
    return ncc.ReplicaGroup([list(g) for g in groups]), sizes.pop()


def program_share(rows: int, what: str) -> tuple[int, int]:
    """``(first, count)`` of ``rows`` (rows or columns) that this program takes: all of them
    at LNC 1; at LNC 2 (a ``kernel[2]`` launch) program p takes the p-th of two halves.

    The two physical cores of an LNC 2 rank run separate instruction streams on shared HBM
    ("Using Logical NeuronCores (LNC) with NKI": the NEFF holds instructions for each PNC,
    ``nl.program_id(0)`` tells them apart), so a kernel splits its work between them. The
    kernels here give each core its own part of every chunk and of the output (rows, or
    columns where the weight is the larger operand): the two write disjoint elements of
    the shared output and exchange nothing, so no ``core_barrier`` is needed (the
    simulator's race check would refuse any shared element both touch). Each core runs
    its ring on channels 0.. (the API pages: channel ids are consecutive from 0) over the
    rank's links, which the two share (``CoreContext.link``)."""
    programs = nl.num_programs()
    assert programs in (1, 2), f"{what}: one or two programs per rank (LNC 1 or 2), got {programs}"
    assert rows >= programs, f"{what}: {rows} rows cannot be split over {programs} programs (LNC {programs})"
    return split_rows(rows, programs)[nl.program_id(0) if programs > 1 else 0]


def ring_setup(groups: Sequence[Sequence[int]], channels: int, what: str):
    """``(replica group, ring size, this rank's ring position)``; see `replica_group`.

    The position comes from the ring itself: after i steps on channel 0 a rank holds the
    data of the rank i places before it, so the position is found without indexing the
    rank-list by a rank id (`my_position`)."""
    rg, tp = replica_group(groups, channels, what)
    return rg, tp, my_position(groups, tp)


def my_position(groups: Sequence[Sequence[int]], tp: int) -> Any:
    """This rank's position in its rank-list, from ``ncc.rank_id()``.

    The position is the same in every rank-list that holds the rank; rank-lists are
    data the kernel was built with, so the lookup is one compare-and-add per entry
    (register ALU: ``sum((rank == r) * i)``), valid for ints and registers alike."""
    me = ncc.rank_id()
    pos = 0
    for g in groups:
        for i, r in enumerate(g):
            if i:
                pos = pos + (me == r) * i
    return pos


def position_after(pos: Any, steps: int, tp: int, channel: int) -> Any:
    """Ring position of the data in hand after ``steps`` hops on ``channel`` (even: from the
    predecessor, odd: from the successor), as ``(pos -/+ steps) mod tp``."""
    step = -steps if channel % 2 == 0 else steps
    return (pos + step % tp) % tp


def channel_halves(rows: int, channels: int, what: str) -> list[tuple[int, int]]:
    """Rows of a chunk per channel: ``[(offset, rows), ...]`` indexed by channel, in
    contiguous parts. The channels of one ring direction (even: forward, odd: backward)
    take adjacent parts, the forward ones first, so the rows that arrive from one ring
    neighbour at a step are one contiguous span (with four channels, channels 0 and 2
    hold the first half of the rows and 1 and 3 the second)."""
    assert rows >= channels, f"{what}: {rows} rows cannot be split over {channels} channels"
    parts = split_rows(rows, channels)
    order = list(range(0, channels, 2)) + list(range(1, channels, 2))
    return [parts[order.index(c)] for c in range(channels)]
