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

import math
from dataclasses import dataclass
from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nl
from trnopt.kernels.tiling import PMAX, split_rows

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


def _hop_seconds(nbytes: int, programs: int) -> float:
    """One ring hop: ``nbytes`` over one direction of a Trn2 torus link (1,024 GB/s per
    chip over 2 axes x 2 directions), shared by the ``programs`` of an LNC 2 rank, plus
    the hop latency, at the Trainium2 pages' rates as the simulator has them
    (`trnopt.kernels.sim.rates`)."""
    from trnopt.kernels.sim.rates import DEFAULT_LINK
    return nbytes * programs / DEFAULT_LINK.bandwidth_Bps + DEFAULT_LINK.latency_s


def _matmul_seconds(rows: int, k_tiles: int, n: int) -> float:
    """ceil(rows/128) x k_tiles x n Tensor Engine cycles at 2.4 GHz (one moving column per
    cycle per stationary tile; Trainium2 architecture guide)."""
    from trnopt.kernels.sim.rates import TENSOR_ENGINE_HZ
    return -(-rows // PMAX) * k_tiles * n / TENSOR_ENGINE_HZ


def burst_bytes(rows: int, k_tiles: int, n: int, channels: int = 2) -> int:
    """Bytes per channel of a ring transfer that holds the core's DMA no longer than one
    K-block iteration of the matmul: T_iter * 368 GB/s / channels, with T_iter the matmul
    of ``rows`` x ``k_tiles`` K tiles x ``n`` columns (`_matmul_seconds`). Where the
    channels together run faster than the core's DMA (two directions at 256 GB/s against
    368 GB/s), a transfer takes all of it while it runs and the matmul's next loads wait
    for its end; the loads are issued one iteration ahead, so a burst of one iteration
    leaves them their turn."""
    from trnopt.kernels.sim.rates import DMA_BANDWIDTH_BPS
    return max(1, int(_matmul_seconds(rows, k_tiles, n) * DMA_BANDWIDTH_BPS / channels))


def ring_outlasts_matmul(chunk_bytes: int, rows: int, k: int, n: int, programs: int = 1) -> bool:
    """Whether a ring step's transfer outlasts the step's matmul: a channel's chunk of
    ``chunk_bytes`` over one hop (`_hop_seconds`) against the step's matmul
    (`_matmul_seconds` over ceil(k/128) K tiles). A kernel's choice of order, not a
    simulator call: where the ring outlasts the matmul it is the critical path and its
    first transfer goes before the matmul's first loads."""
    return _hop_seconds(chunk_bytes, programs) > _matmul_seconds(rows, -(-k // PMAX), n)


def ring_slabs(chunk_bytes: int, rows: int, k: int, n: int, programs: int = 1) -> int:
    """Slabs a ring step's transfer of ``chunk_bytes`` per channel goes in, at least 1:
    about `SLAB_BYTES` each, but no more than keep their hop latencies within half of what
    the step's matmul (`_matmul_seconds` over ``rows`` and ceil(k/128) K tiles) leaves
    beyond the bytes' hop time (the other half for the DMA the matmul's loads take from
    the ring): slabs = min(ceil(chunk_bytes / SLAB_BYTES), floor((T_mm - bytes x
    programs / B) / (2 x latency))). With one channel a shard's whole chunk takes one
    link, and 16 slabs of an 8 MiB chunk (70B, TP16 at LNC 1) pay 24 us of hop latency a
    step where the matmul leaves 21.8 (in the simulator 10 slabs hid the whole ring, 12
    hid 0.79, 16 hid 0.54; this rule takes 7). A kernel's choice, at the Trainium2 pages'
    rates."""
    from trnopt.kernels.sim.rates import DEFAULT_LINK
    by_size = -(-chunk_bytes // SLAB_BYTES)
    slack = _matmul_seconds(rows, -(-k // PMAX), n) - chunk_bytes * programs / DEFAULT_LINK.bandwidth_Bps
    return max(1, min(by_size, math.floor(slack / (2 * DEFAULT_LINK.latency_s))))


def hop_iterations(slab_bytes: int, rows: int, k_block: int, n: int, programs: int = 1) -> int:
    """K-block iterations of a pipeline call that one ring slab's hop spans, at least 1:
    ceil((`_hop_seconds` + a DMA's fixed cost) / one K block's `_matmul_seconds`), the
    fixed cost 1.9 us (descriptor generation plus semaphore to start, Trainium2
    architecture guide). A kernel's choice of how early to send, not a simulator call."""
    from trnopt.kernels.sim.rates import DMA_DESCRIPTOR_S, DMA_SEMAPHORE_TO_START_S
    hop = _hop_seconds(slab_bytes, programs) + DMA_DESCRIPTOR_S + DMA_SEMAPHORE_TO_START_S
    block = _matmul_seconds(rows, k_block, n)
    return max(1, math.ceil(hop / block)) if block > 0 else 1


@dataclass(frozen=True)
class Chunk:
    """Rows of a shard that arrive at one step of a gather ring.

    ``channel`` carries them (-1: the rank's own rows at step 0); ``side`` is the ring side
    they come from, as a channel parity (0: from predecessors, 1: from successors), which
    with the step gives their owner's position (`position_after`); ``offset``/``rows`` are
    rows of the shard (of every rank's shard: all have the same size) and ``slot`` the
    first of them in the step's buffer, in which a step's chunks lie in slot order."""

    channel: int
    side: int
    offset: int
    rows: int
    slot: int


def gather_steps(base: int, rows: int, tp: int, channels: int, both_ways: bool = True) -> list[list[Chunk]]:
    """The steps of a gather ring: for each step, the chunks that are in hand.

    A rank holds rows ``base..base+rows`` of every shard. Step 0 is its own rows. With one
    channel the ring runs one way, tp - 1 steps of whole shards. With 2 or 4 channels it
    runs both ways (even channels forward, odd backward), in one of two schedules:

    - ``both_ways=False`` (halves): every shard goes all the way round, split over the
      channels (`channel_halves`); tp - 1 steps, each bringing part of the shard s places
      before on the forward channels and part of the one s places after on the backward.
    - ``both_ways=True``: at step s (1 <= s < tp/2) the whole shard of the rank s places
      before arrives on the forward channels and the one s places after on the backward
      ones, each direction's channels taking adjacent parts of it; when tp is even the
      shard opposite (tp/2 away, the last) comes half each way, each channel forwarding
      the half of its part that it holds. Each link carries the same (tp - 1)/2 shards as
      with halves, in about tp/2 steps instead of tp - 1: half the hop latencies, for a
      step 0 that sends twice the bytes (the bidirectional variant of the decomposition in
      Wang et al., "Overlap Communication with Dependent Computation via Decomposition in
      Large Deep Learning Models", ASPLOS 2023).

    Each step's chunk on channel c is part of the rows channel c received at the step
    before (own rows at step 0), so the ring forwards what it received."""
    assert channels in (1, 2, 4), f"gather ring: channels must be 1, 2 or 4, got {channels}"
    assert rows >= channels, f"gather ring: {rows} rows cannot be split over {channels} channels"
    steps = [[Chunk(-1, 0, base, rows, 0)]]
    if channels == 1 or not both_ways:
        parts = channel_halves(rows, channels, "gather ring")
        for _ in range(1, tp):
            steps.append(sorted((Chunk(c, c % 2, base + off, h, off) for c, (off, h) in enumerate(parts)),
                                key=lambda ch: ch.slot))
        return steps
    per_side = [list(range(d, channels, 2)) for d in range(2)]
    full: dict[int, tuple[int, int]] = {}  # channel -> (offset, rows) of its part of a whole shard
    for chans in per_side:
        for c, (off, h) in zip(chans, split_rows(rows, len(chans))):
            full[c] = (base + off, h)
    for _ in range((tp - 1) // 2):  # whole shards each way
        steps.append([Chunk(c, d, full[c][0], full[c][1], d * rows + full[c][0] - base)
                      for d, chans in enumerate(per_side) for c in chans])
    if tp % 2 == 0:  # the opposite shard, half each way
        half = []
        for d, chans in enumerate(per_side):
            for c in chans:
                off, h = full[c]
                first = h - h // 2  # the forward channels take the first half of their parts
                o, n = (off, first) if d == 0 else (off + first, h - first)
                half.append(Chunk(c, 0, o, n, o - base))
        steps.append(sorted((ch for ch in half if ch.rows), key=lambda ch: ch.slot))
    return steps


def step_width(step: Sequence[Chunk]) -> int:
    """Rows a ring step has in hand: its chunks' span in the step's buffer."""
    return max(ch.slot + ch.rows for ch in step)


def scatter_steps(rows: int, tp: int, channels: int, both_ways: bool) -> list[list[Chunk]]:
    """The steps of the reduce-scatter ring: per step, the chunks whose partials the rank
    computes and sends on (the last step: its own chunk, channel -1).

    A reduce-scatter is the all-gather run backward (the two are duals: Chan et al.,
    "Collective communication: theory, practice, and experience", 2007), so the steps are
    `ring.gather_steps` in reverse order, mirrored: where the gather brings at step t,
    on channel c, rows of the shard of the rank t places away, the scatter sends at step
    T - 1 - t, on channel c, those rows of the partial of the chunk whose owner is t hops
    ahead in c's direction (`chunk_owner`). With ``both_ways`` each chunk's sum comes to
    its owner half from each side in about tp/2 steps: half the hop latencies, and half
    the roundings of the running sums, for the same bytes per link; when tp is even the
    first step sends the opposite chunk half each way. Otherwise (halves) every chunk's
    rows go all the way round, split over the channels, in tp - 1 steps."""
    return gather_steps(0, rows, tp, channels, both_ways)[::-1]


def chunk_owner(pos: Any, ch: Chunk, hops: int, tp: int) -> Any:
    """Ring position of the owner of chunk ``ch`` sent on with ``hops`` hops to go: ``hops``
    places ahead in the direction of ``ch.channel`` (even: forward), the rank itself for
    its own chunk (channel -1)."""
    return pos if ch.channel < 0 else position_after(pos, hops, tp, ch.channel + 1)


@dataclass(frozen=True)
class ScatterLayout:
    """A reduce-scatter ring's schedule and where its received sums lie."""

    steps: list  #: `scatter_steps`: per step the chunks computed and sent on, the last the own chunk
    sides: int  #: ring sides the sums arrive from: 2 both ways (each in its own rows), else 1
    side_rows: int  #: rows between the sides' regions of a received-sum buffer

    def recv_row(self, ch: Chunk) -> int:
        """First row of chunk ``ch``'s sums in a received-sum buffer: its side's region (the
        channel's parity when both ways) plus its rows' offset in the chunk, so the rows a
        channel receives at one step lie where it sends on from at the next."""
        return (ch.channel % 2) * self.side_rows * (self.sides - 1) + ch.offset

    def zero_spans(self, ms: int) -> list[tuple[int, int]]:
        """Rows of the first step's received-sum buffer that no sum arrives in but that the
        next step sends on (or the last adds): each side's rows of the chunk that the
        first step's chunks on that side's channels leave out. Both ways with tp even the
        opposite chunk comes half from each side, so these rows hold zeros (exact in any
        dtype) and every later step is one permute with reduction per channel."""
        spans = []
        for d in range(self.sides):
            got = sorted((ch.offset, ch.rows) for ch in self.steps[0] if ch.channel % 2 == d or self.sides == 1)
            row = 0
            for off, h in got + [(ms, 0)]:
                if off > row:
                    spans.append((d * self.side_rows + row, off - row))
                row = max(row, off + h)
        return spans
