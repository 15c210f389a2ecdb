"""All-gather + matmul: the column-parallel linear with sequence-parallel input.

Y = all_gather(X shards along M) @ W_shard, computed as a ring: each rank multiplies the
shards in hand while the next ones move to it over the ring (double buffering), so the
all-gather hides behind the matmul. One channel runs the ring one way; two channels run
it both ways at once (both directions of a torus ring), a shard from each side per step,
so the ring takes about half the steps and pays half the hop latencies for the same bytes
per link; four channels (a group of a whole node: both directions of two rings) split
each direction's shard in halves (`ring.gather_steps`). The chunks in hand at a step fill
one stationary tile together (`tiling.pack_rows`), so small shards at large TP degree
still run the matmul at its full rate.

Kernels here (references in `trnopt.kernels.references`):
- `allgather_matmul`: the fused ring kernel.
- `allgather_ring`: the same ring without the matmul (the collective alone; a ring
  all-gather along M of the K-major shards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import allgather_matmul_reference, allgather_reference  # noqa: F401
from trnopt.kernels.ring import (gather_steps, hop_iterations, position_after, program_share, ring_outlasts_matmul,
                                ring_setup, ring_slabs, step_width)
from trnopt.kernels.tiling import (PMAX, PSUM_BANKS, SBUF_SHARE, SBUF_TRN2, STATIONARY_FMAX, MatmulPipeline,
                                   RowBlock, choose_tiling, loads_outlast_matmul, matmul_operands, unit_pieces)


@nki.jit
def allgather_matmul(x_t, w, groups, channels=1, pieces=None, sbuf_bytes=SBUF_TRN2, both_ways=None):
    """Y = all_gather(X shards along M) @ W_shard, the all-gather hidden in a ring.

    Dimensions:
        tp: ranks in this rank's rank-list (the TP group); M_shard rows of X per rank;
        M = tp * M_shard; K the contraction (hidden) size; N_shard the columns of W here.

    Args:
        x_t: [K, M_shard], this rank's sequence shard of X, K-major (X_shard transposed: the
            layout TensorE consumes, K on partitions), HBM, bfloat16 or float32.
        w: [K, N_shard], this rank's column shard of W, HBM, same dtype as x_t.
        groups: the replica groups, a sequence of disjoint rank-lists (ncc.ReplicaGroup
            semantics). The order of a rank-list is the ring order and the shard order:
            the shard of the rank at list position i is rows i*M_shard.. of X, as
            ncc.all_gather concatenates.
        channels: 1 (the ring one way), 2 (both ways: shards from predecessors arrive on
            channel 0, from successors on channel 1) or 4 (even channels forward, odd
            backward, each direction's two taking halves of a shard); `ring.gather_steps`.
        pieces: each ring step moves its chunk in up to this many K-row slabs (of whole
            128-row tiles), so the next step's matmul can start on the first slab while
            the rest still moves; every slab pays the hop latency, and a large slab takes
            the DMA bandwidth from the matmul's loads for long. None: `ring.ring_slabs`.
        sbuf_bytes: SBUF bytes per partition of the target chip (the tiling's budget).
        both_ways: with 2 or 4 channels, whole shards each way in about tp/2 steps (True)
            or every shard all the way round in halves (False); `ring.gather_steps`.
            None: `gather_plan` decides.

    Returns:
        Y: [M, N_shard] in w's dtype, shared HBM.

    Decomposition: step 0 multiplies the rank's own shard; step s multiplies the shards
    in hand after s hops (`ring.gather_steps`: with two or more channels the ring runs both
    ways, so a step brings two shards and the ring takes about tp/2 steps), whose rows
    start at position_after(pos, s) * M_shard (ring-position arithmetic, `trnopt.kernels.ring`),
    while collective_permute_implicit moves them on. When two or three steps' shards fit
    in SBUF beside the matmul's tiles (small shards, large TP degree) the ring runs on chip
    and the matmul reads the shards in place (`_sbuf_ring`); otherwise through two HBM ring
    buffers per channel, slab by slab (`_hbm_ring`; step 0 multiplies and sends x_t
    directly).

    Preconditions: x_t and w 2-D with equal K and equal dtype; channels in (1, 2, 4) and
    M_shard >= channels x programs; pieces >= 1; rank-lists of equal size; LNC 1 or 2 (at LNC 2
    each physical core takes half of every shard's rows, `ring.program_share`).
    """
    k, ms, n = matmul_operands(x_t, w)
    rg, tp, pos = ring_setup(groups, channels, "allgather_matmul")
    base, mine = program_share(ms, "allgather_matmul")
    assert mine >= channels, f"allgather_matmul: {mine} rows per program cannot be split over {channels} channels"
    assert pieces is None or pieces >= 1, f"pieces must be >= 1, got {pieces}"
    y = nl.ndarray((tp * ms, n), dtype=w.dtype, buffer=nl.shared_hbm, name="y")
    plan = gather_plan(k, base, mine, n, tp, channels, x_t.dtype.itemsize, w.dtype.itemsize, sbuf_bytes, both_ways)
    steps, calls, n_bufs = plan.steps, plan.calls, plan.n_bufs
    pipe = MatmulPipeline(k, n, x_t.dtype, w.dtype, plan.tiling, name="ag")
    if n_bufs:
        _sbuf_ring(x_t, w, y, rg, tp, pos, steps, pipe, n_bufs, calls)
    else:
        widest_chunk = max(ch.rows for st in steps[1:] for ch in st) if tp > 1 else mine
        parts = pieces if pieces is not None else ring_slabs(widest_chunk * k * x_t.dtype.itemsize,
                                                             step_width(steps[min(1, tp - 1)]), k, n, nl.num_programs())
        _hbm_ring(x_t, w, y, rg, tp, pos, steps, pipe, unit_pieces(k, PMAX, parts), calls)
    return y


@dataclass(frozen=True)
class GatherPlan:
    """How `allgather_matmul` runs its ring for one shape (`gather_plan`)."""

    steps: list  #: `ring.gather_steps`: the chunks in hand at each step
    calls: list  #: the steps each pipeline call multiplies (`ring_calls`)
    tiling: Any  #: the matmul's `tiling.MatmulTiling`
    n_bufs: int  #: on-chip ring buffers (3 or 2), or 0: the ring goes through HBM


def gather_plan(k: int, base: int, mine: int, n: int, tp: int, channels: int, itemsize: int, out_itemsize: int,
                sbuf_bytes: int, both_ways: bool | None = None, programs: int | None = None) -> GatherPlan:
    """The ring schedule, pipeline calls, tiling and ring buffers of `allgather_matmul` for a
    program holding rows ``base..base+mine`` of each [k, M_shard] shard and a [k, n] weight.

    The ring runs on chip when two or three calls' shards fit in SBUF beside the matmul's
    tiles (three: a transfer then waits only for the matmul two calls back), else through
    HBM. With ``both_ways`` None it runs whole shards both ways (half the hop latencies)
    when that ring fits on chip, else every shard all the way round in halves: through
    HBM each step's shards are loaded again and step 0 would send twice the bytes while
    loading x and w, where the DMA bandwidth, not the links, bounds the step. (Measured in
    the simulator on the Llama 3 70B/405B rows of benchmarks/kernel_overlap.py: on chip
    both ways hid as much or more in every row, 70B TP64 LNC 2 0.93 against 0.70. Through
    HBM, with each slab sent just ahead of its first read, both ways hid more in four of
    the seven rows tried, most at 405B TP32 LNC 2, 0.932 against 0.882, and less at 70B
    TP16 LNC 2, 0.943 against 0.958: the one below its goal of 0.95, so through HBM the
    rule stays halves until a test tells the rows apart.)

    At LNC 2 a call of one step may be bound by its loads and the ring's transfers (each
    core has half the rows); then a call multiplies two steps' shards, within one PSUM row
    group, or one step where two do not fit on chip. (Grouping steps at LNC 1 measured
    slower in the simulator, so it is kept to LNC 2.) ``programs``: the rank's programs (LNC);
    None: ``nl.num_programs()`` of the running kernel."""
    programs = nl.num_programs() if programs is None else programs
    ways = [True, False] if both_ways is None and channels > 1 else [bool(both_ways) and channels > 1]
    fallback = None  # through HBM: the last way tried (halves where there is a choice)
    for way in ways:
        steps = gather_steps(base, mine, tp, channels, way)
        widest = max(step_width(st) for st in steps)
        per_call = 1
        while per_call < programs and (per_call + 1) * widest <= STATIONARY_FMAX * PSUM_BANKS:
            rows = per_call * widest
            t = choose_tiling(rows, k, n, itemsize, out_itemsize, sbuf_bytes=sbuf_bytes)
            if not loads_outlast_matmul(rows, k, n, itemsize, t, rows * k * itemsize):
                break
            per_call += 1
        for group in range(per_call, 0, -1):
            calls = ring_calls(len(steps), group)
            call_rows = max(sum(step_width(steps[s]) for s in c) for c in calls)
            tiling = choose_tiling(call_rows, k, n, itemsize, out_itemsize, sbuf_bytes=sbuf_bytes)
            room = sbuf_bytes * SBUF_SHARE - tiling.sbuf_bytes(k, n, itemsize, out_itemsize)
            call_bytes = -(-k // PMAX) * call_rows * itemsize  # per partition
            n_bufs = max((b for b in (3, 2) if b * call_bytes <= room), default=0) \
                if tp > 1 and k % PMAX == 0 else 0
            if n_bufs:
                return GatherPlan(steps, calls, tiling, n_bufs)
            if group == per_call:
                fallback = GatherPlan(steps, calls, tiling, 0)
    return fallback


def _held(steps, s: int, ch):
    """``(chunk of step s that holds the rows of ch, first of them within it)``: the rows a
    channel forwards at step s + 1 are part of what it received at step s (own rows at 0)."""
    prev = steps[s][0] if s == 0 else next(p for p in steps[s] if p.channel == ch.channel)
    assert prev.offset <= ch.offset and ch.offset + ch.rows <= prev.offset + prev.rows, (
        f"allgather ring: channel {ch.channel} forwards rows {ch.offset}+{ch.rows} it does not hold at step {s}")
    return prev, ch.offset - prev.offset


def _blocks(y, tp, pos, s, step, ms, n, source):
    """The row blocks of ring step ``s``, in slot order. ``source(chunk)`` gives a chunk's
    rows (None where they come from SBUF); there, chunks from one ring side adjacent in
    both shard rows and slots share one block (one store to y per direction and step)."""
    spans: list[list] = []  # [chunk, rows]
    for ch in step:
        last = spans[-1] if spans else None
        if source(ch) is None and last and last[0].side == ch.side and \
                last[0].offset + last[1] == ch.offset and last[0].slot + last[1] == ch.slot:
            last[1] += ch.rows
        else:
            spans.append([ch, ch.rows])
    return [RowBlock(source(ch), y[row:row + h, 0:n]) for ch, h in spans
            for row in [position_after(pos, s, tp, ch.side) * ms + ch.offset]]


def ring_calls(n_steps: int, per_call: int) -> list[range]:
    """The ring steps each pipeline call multiplies: one step per call, or the first step
    alone and then ``per_call`` at a time ([0], [1, 2], [3, 4], ... for 2), so the first
    call starts on the rank's own shard and every later call's shards arrive during the
    call before it."""
    if per_call == 1:
        return [range(s, s + 1) for s in range(n_steps)]
    return [range(0, 1)] + [range(s, min(n_steps, s + per_call)) for s in range(1, n_steps, per_call)]


def _sbuf_ring(x_t, w, y, rg, tp, pos, steps, pipe, n_bufs, calls):
    """The ring on chip: shards move SBUF to SBUF in the matmul's K layout and the matmul
    reads them in place (no reload from HBM); one buffer per call ([128, K tiles, the
    call's rows], its steps side by side), ``n_bufs`` of them in turn. The transfers that
    deliver the next call's shards are issued before a call's matmul: each waits only for
    its data and for the successor to finish reading its buffer."""
    k, ms = x_t.shape
    n = w.shape[1]
    kt = len(pipe.k_tiles)
    width = max(sum(step_width(steps[s]) for s in c) for c in calls)
    bufs = [nl.ndarray((PMAX, kt, width), dtype=x_t.dtype, buffer=nl.sbuf, name=f"ring_sb{i}")
            for i in range(n_bufs)]
    first = {}  # step -> (call, first column of the step in the call's buffer)
    for i, c in enumerate(calls):
        col = 0
        for s in c:
            first[s] = (i, col)
            col += step_width(steps[s])

    def at(s, slot, rows, t0=0, t1=kt):
        i, c0 = first[s]
        return bufs[i % n_bufs][0:PMAX, t0:t1, c0 + slot:c0 + slot + rows]

    # The first transfer and the last two go in two K halves: the first half of step 1
    # leaves while the own shard's second half still loads, and each of the last two
    # steps' matmuls starts on its first half while the second still moves (one hop
    # latency more each: only the ring's fill and drain, where nothing else hides it; where
    # the ring is the critical path the step before last would otherwise wait for its
    # whole shard and run on behind the last transfer).
    halves = [(0, kt // 2), (kt // 2, kt)] if kt >= 2 else [(0, kt)]

    def send(s, t0, t1):  # deliver K tiles t0..t1 of step s's chunks
        srcs = []
        for ch in steps[s]:
            prev, lo = _held(steps, s - 1, ch)
            srcs.append([at(s - 1, prev.slot + lo, ch.rows, t0, t1)])
        ncc.collective_permute_implicit(
            srcs_by_channel=srcs, dsts_by_channel=[[at(s, ch.slot, ch.rows, t0, t1)] for ch in steps[s]],
            replica_group=rg, channel_ids=[ch.channel for ch in steps[s]], name=f"ag_step{s - 1}")

    def sends_of(i):  # (last K tile + 1, send) of the transfers that deliver call i + 1's shards
        return [(t1, lambda s=s, t0=t0, t1=t1: send(s, t0, t1)) for s in (calls[i + 1] if i + 1 < len(calls) else ())
                for t0, t1 in (halves if s in (1, len(steps) - 2, len(steps) - 1) else [(0, kt)])]

    # Where the matmul, not the ring, is the critical path, the own shard's K blocks load
    # each just ahead of the first call's iteration that reads it, and each first send
    # right after the loads it reads: in issue order the matmul's first weight loads would
    # otherwise wait for the whole shard and the sends' traffic. Where the ring is (it
    # outlasts a step's matmul), the shard loads and the first sends go first.
    # (One copy per K block: `k_major_copies` with K in whole tiles.)
    own = steps[0][0]
    ring_first = ring_outlasts_matmul(max(ch.rows for ch in steps[1]) * k * x_t.dtype.itemsize,
                                      step_width(steps[1]), k, n, nl.num_programs())
    lead: list[list] = [[lambda dst=dst, src=src: nisa.dma_copy(dst=dst, src=src, name="ag_ld_shard")]
                        for dst, src in pipe.k_major_copies(at(0, 0, own.rows),
                                                            x_t[0:k, own.offset:own.offset + own.rows])]
    ends = [t0 + len(tiles) for t0, tiles in pipe.k_blocks]
    assert len(ends) == len(lead), f"allgather ring: {len(lead)} shard loads for {len(ends)} K blocks"
    after: dict[int, list] = {}  # load index -> the sends issued right after it
    for t1, fn in sends_of(0):
        after.setdefault(next(j for j, e in enumerate(ends) if e >= t1), []).append(fn)
    lead = [fns + after.get(j, []) for j, fns in enumerate(lead)]
    if ring_first:
        for fns in lead:
            for fn in fns:
                fn()
        lead = []
    for i, c in enumerate(calls):
        for _, fn in (sends_of(i) if i else ()):
            fn()
        blocks = [b for s in c for b in _blocks(y, tp, pos, s, steps[s], ms, n, lambda ch: None)]
        rows = sum(step_width(steps[s]) for s in c)
        pipe(blocks, w, x_sbuf=bufs[i % n_bufs][0:PMAX, 0:kt, 0:rows],
             lead=[lambda fns=fns: [fn() for fn in fns] for fns in lead] if i == 0 else (),
             flush=i == len(calls) - 1)


def _hbm_ring(x_t, w, y, rg, tp, pos, steps, pipe, slabs, calls):
    """The ring through HBM buffers (shards too large for SBUF), slab by slab. Each slab
    is sent as late as it can be and still arrive in time: `_slab_sends` places the send
    that delivers slab j of a call's step a few K-block iterations ahead of the iteration
    that first reads it (and of the send that forwards it on, for a call of two steps), in
    that call or the tail of the one before. Sending a call's whole next shards during it
    instead loaded the DMA bandwidth of a call that has one step's rows (the first and
    last at LNC 2) with two steps' transfers on top of a full weight stream. Buffers per
    channel: the chunks of two calls (the one running and the next, arriving). The ring
    starts from x_t itself (`_hbm_buffers`)."""
    k, ms = x_t.shape
    n = w.shape[1]
    nb = 2 * max(len(c) for c in calls)
    bufs = _hbm_buffers(x_t, steps, nb)

    def send(s, k0, kl):
        ncc.collective_permute_implicit(
            srcs_by_channel=[[_hbm_src(x_t, steps, bufs, s, ch, k0, kl)] for ch in steps[s + 1]],
            dsts_by_channel=[[bufs[ch.channel][(s + 1) % nb][k0:k0 + kl, 0:ch.rows]] for ch in steps[s + 1]],
            replica_group=rg, channel_ids=[ch.channel for ch in steps[s + 1]], name=f"ag_step{s}")

    def source(s):
        if s == 0:
            return lambda ch: x_t[0:k, ch.offset:ch.offset + ch.rows]
        return lambda ch: bufs[ch.channel][s % nb][0:k, 0:ch.rows]

    rows = [sum(step_width(steps[s]) for s in c) for c in calls]
    chunk_rows = max(ch.rows for st in steps[1:] for ch in st) if tp > 1 else 0
    ahead = hop_iterations(chunk_rows * slabs[0][1] * x_t.dtype.itemsize, max(rows), pipe.t.k_block, n,
                           nl.num_programs())
    at = _slab_sends(calls, slabs, [pipe.iterations([r]) for r in rows], pipe.k_blocks, ahead,
                     lambda s, k0, kl: lambda: send(s - 1, k0, kl))
    for i, c in enumerate(calls):
        blocks = [b for s in c for b in _blocks(y, tp, pos, s, steps[s], ms, n, source(s))]
        pipe(blocks, w, at=at[i], flush=i == len(calls) - 1)


def _slab_sends(calls, slabs, iterations, k_blocks, ahead, make):
    """Per call, the (iteration, send) pairs of `MatmulPipeline`'s ``at``: the send
    ``make(s, k0, kl)`` delivering slab (k0, kl) of step s of call i goes ``ahead`` K-block
    iterations per remaining step of the call before the iteration that first reads the
    slab (the K block holding k0): the last step of a call ``ahead`` before, the one before
    it (whose slab that send forwards) 2 x ``ahead``. A negative position falls in the tail
    of call i - 1 (``iterations`` per call)."""
    first_read = [next(b for b, (t0, tiles) in enumerate(k_blocks) if k0 // PMAX < t0 + len(tiles))
                  for k0, _ in slabs]
    at: list[list] = [[] for _ in calls]
    for i, c in enumerate(calls[1:], 1):
        for idx, s in enumerate(c):
            for (k0, kl), b in zip(slabs, first_read):
                due = b - ahead * (len(c) - idx)
                at[i if due >= 0 else i - 1].append((due if due >= 0 else iterations[i - 1] + due, make(s, k0, kl)))
    return at


def _hbm_buffers(x_t, steps, nb):
    """The HBM ring's buffers: per channel ``nb`` private-HBM buffers [K, the channel's
    widest chunk]. The ring starts from x_t itself: the pages of
    "nki.collectives.collective_permute_implicit" put no LNC rule on where its srcs live
    (the private-HBM rule is all_gather's, all_reduce's and reduce_scatter's at LNC 1), so
    no copy of the own rows is made."""
    k = x_t.shape[0]
    chans = sorted({ch.channel for st in steps[1:] for ch in st})
    return {c: [nl.ndarray((k, max(ch.rows for st in steps[1:] for ch in st if ch.channel == c)),
                           dtype=x_t.dtype, buffer=nl.private_hbm, name=f"ring{c}_{i}") for i in range(nb)]
            for c in chans}


def _hbm_src(x_t, steps, bufs, s, ch, k0, kl):
    """K rows k0..k0+kl of the rows of chunk ``ch`` (of step s + 1) held at step s: in the
    channel's buffer of step s, or (s = 0) in x_t."""
    _, lo = _held(steps, s, ch)
    if s > 0:
        return bufs[ch.channel][s % len(bufs[ch.channel])][k0:k0 + kl, lo:lo + ch.rows]
    return x_t[k0:k0 + kl, ch.offset:ch.offset + ch.rows]


@nki.jit
def allgather_ring(x_t, groups, channels=1, n=None, sbuf_bytes=SBUF_TRN2, both_ways=None):
    """The collective alone: G = all_gather of the K-major shards along M, as a ring.

    Args:
        x_t: [K, M_shard], this rank's shard, HBM.
        groups, channels, sbuf_bytes, both_ways: as in `allgather_matmul`.
        n: the columns of the weight `allgather_matmul` multiplies the gathered X by; the
            ring schedule is the one it would run (`gather_plan`). None: the halves
            schedule (every shard all the way round) unless ``both_ways``.

    Returns:
        G: [K, tp * M_shard], shard of list position i in columns i*M_shard.., shared HBM.

    Decomposition: the ring schedule of `allgather_matmul` (`ring.gather_steps`, whole
    chunks: the fewest hop latencies) with the matmul replaced by a DMA of the chunks in
    hand into G. Preconditions as in `allgather_matmul`.
    """
    assert len(x_t.shape) == 2, f"x_t must be 2-D, got {tuple(x_t.shape)}"
    k, ms = x_t.shape
    rg, tp, pos = ring_setup(groups, channels, "allgather_ring")
    base, mine = program_share(ms, "allgather_ring")
    assert mine >= channels, f"allgather_ring: {mine} rows per program cannot be split over {channels} channels"
    if n is not None:
        steps = gather_plan(k, base, mine, n, tp, channels, x_t.dtype.itemsize, x_t.dtype.itemsize, sbuf_bytes,
                            both_ways).steps
    else:
        steps = gather_steps(base, mine, tp, channels, bool(both_ways))
    g_out = nl.ndarray((k, tp * ms), dtype=x_t.dtype, buffer=nl.shared_hbm, name="gathered")
    bufs = _hbm_buffers(x_t, steps, 2)
    for s, step in enumerate(steps):
        if s + 1 < len(steps):
            ncc.collective_permute_implicit(
                srcs_by_channel=[[_hbm_src(x_t, steps, bufs, s, ch, 0, k)] for ch in steps[s + 1]],
                dsts_by_channel=[[bufs[ch.channel][(s + 1) % 2][0:k, 0:ch.rows]] for ch in steps[s + 1]],
                replica_group=rg, channel_ids=[ch.channel for ch in steps[s + 1]], name=f"ag_step{s}")
        for ch in step:
            col = position_after(pos, s, tp, ch.side) * ms + ch.offset
            chunk = x_t[0:k, ch.offset:ch.offset + ch.rows] if s == 0 else bufs[ch.channel][s % 2][0:k, 0:ch.rows]
            nisa.dma_copy(dst=g_out[0:k, col:col + ch.rows], src=chunk, name="ag_place")
    return g_out


__all__ = ["allgather_matmul", "allgather_ring"]
