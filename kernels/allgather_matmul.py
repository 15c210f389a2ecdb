"""All-gather + matmul: the column-parallel linear with sequence-parallel input.

Y = all_gather(X shards along M) @ W_shard, computed as a ring: each rank multiplies the
shard in hand while the next shard moves to it over the ring (double buffering), so the
all-gather hides behind the matmul. One channel runs the ring one way; two channels split
every shard's rows in halves and run the ring both ways at once (both directions of a
torus ring), halving the bytes per link per step; four channels (a group of a whole
node: both directions of two rings) split them in quarters, a direction's two quarters
adjacent so each step still stores one span per direction. The parts in hand at a step
fill one stationary tile together (`tiling.pack_rows`), so small shards at large TP
degree still run the matmul at its full rate.

Kernels here (references in `trnopt.kernels.references`):
- `allgather_matmul`: the fused ring kernel.
- `allgather_ring`: the same ring without the matmul (the collective alone; a ring
  all-gather along M of the K-major shards).
"""

from __future__ import annotations

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import allgather_matmul_reference, allgather_reference  # noqa: F401
from trnopt.kernels.ring import SLAB_BYTES, channel_halves, position_after, program_share, ring_setup
from trnopt.kernels.tiling import (PMAX, PSUM_BANKS, SBUF_SHARE, SBUF_TRN2, STATIONARY_FMAX, MatmulPipeline,
                                   RowBlock, choose_tiling, loads_outlast_matmul, matmul_operands, unit_pieces)


@nki.jit
def allgather_matmul(x_t, w, groups, channels=1, pieces=None, sbuf_bytes=SBUF_TRN2):
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
        channels: 1 (ring one way), 2 (each shard's rows split in halves, the first half
            going forward around the ring on channel 0 and the second backward on channel 1)
            or up to 4 (even channels forward, odd backward; `ring.channel_halves`).
        pieces: each ring step moves its chunk in up to this many K-row slabs (of whole
            128-row tiles), so the next step's matmul can start on the first slab while
            the rest still moves; every slab pays the hop latency, and a large slab takes
            the DMA bandwidth from the matmul's loads for long. None: slabs of about
            `SLAB_BYTES` per channel.
        sbuf_bytes: SBUF bytes per partition of the target chip (the tiling's budget).

    Returns:
        Y: [M, N_shard] in w's dtype, shared HBM.

    Decomposition: step s = 0..tp-1 multiplies the shard (or half-shards) received s hops
    away, whose rows start at position_after(pos, s) * M_shard (ring-position arithmetic,
    `trnopt.kernels.ring`), while collective_permute_implicit moves it on to the successor.
    When two or three shards fit in SBUF beside the matmul's tiles (small shards, large TP
    degree) the ring runs on chip and the matmul reads the shard in place (`_sbuf_ring`);
    otherwise through two HBM ring buffers per channel, slab by slab (`_hbm_ring`; step 0
    multiplies x_t directly and at LNC 1 copies it into the ring, whose sources must be
    private HBM there).

    Preconditions: x_t and w 2-D with equal K and equal dtype; channels in (1, 2, 4) and
    M_shard >= channels x programs; pieces >= 1; rank-lists of equal size; LNC 1 or 2 (at LNC 2
    each physical core takes half of every shard's rows, `ring.program_share`).
    """
    k, ms, n = matmul_operands(x_t, w)
    rg, tp, pos = ring_setup(groups, channels, "allgather_matmul")
    base, mine = program_share(ms, "allgather_matmul")
    halves = [(base + off, h) for off, h in channel_halves(mine, channels, "allgather_matmul")]
    assert pieces is None or pieces >= 1, f"pieces must be >= 1, got {pieces}"
    y = nl.ndarray((tp * ms, n), dtype=w.dtype, buffer=nl.shared_hbm, name="y")
    # W streams through SBUF once per call and row group. At LNC 2 each core has half the
    # rows of a shard, so where a call of one shard is bound by its loads and the ring's
    # transfers, a call multiplies two steps' shards (the rows of one LNC 1 step), within
    # one PSUM row group. (Grouping shards the same way at LNC 1 measured slower in the
    # simulator, 405B at TP64 hiding 0.21 instead of 1.04, so it is kept to LNC 2.)
    per_call = 1
    while per_call < nl.num_programs() and (per_call + 1) * mine <= STATIONARY_FMAX * PSUM_BANKS:
        rows = per_call * mine
        t = choose_tiling(rows, k, n, x_t.dtype.itemsize, w.dtype.itemsize, sbuf_bytes=sbuf_bytes)
        if not loads_outlast_matmul(rows, k, n, x_t.dtype.itemsize, t, rows * k * x_t.dtype.itemsize):
            break
        per_call += 1
    calls = ring_calls(tp, per_call)
    tiling = choose_tiling(per_call * mine, k, n, x_t.dtype.itemsize, w.dtype.itemsize, sbuf_bytes=sbuf_bytes)
    pipe = MatmulPipeline(k, n, x_t.dtype, w.dtype, tiling, name="ag")
    # On-chip ring buffers of per_call shards each: three when they fit (a transfer then
    # waits only for the matmul two calls back), else two, else the ring goes through HBM.
    shard = len(pipe.k_tiles) * mine * x_t.dtype.itemsize  # this program's rows of a shard
    room = sbuf_bytes * SBUF_SHARE - tiling.sbuf_bytes(k, n, x_t.dtype.itemsize, w.dtype.itemsize)
    n_bufs = max((b for b in (3, 2) if b * per_call * shard <= room), default=0) \
        if tp > 1 and k % PMAX == 0 else 0
    if n_bufs:
        _sbuf_ring(x_t, w, y, rg, tp, pos, halves, pipe, n_bufs, calls)
    else:
        slab = halves[0][1] * x_t.dtype.itemsize * PMAX  # bytes of one 128-row tile of a half-shard
        parts = pieces if pieces is not None else -(-len(pipe.k_tiles) * slab // SLAB_BYTES)
        _hbm_ring(x_t, w, y, rg, tp, pos, halves, pipe, unit_pieces(k, PMAX, parts), calls)
    return y


def _blocks(y, tp, pos, s, halves, ms, n, chunk):
    """The row blocks of ring step ``s``, in row order: one per channel, or, where the rows
    come from SBUF (``chunk`` gives None), one per ring direction, its channels' rows being
    adjacent (`ring.channel_halves`): one store to y per direction and step."""
    on_chip = chunk(0, *halves[0]) is None
    spans: list[list[int]] = []  # [channel, offset, rows]
    for c, (off, h) in sorted(enumerate(halves), key=lambda e: e[1][0]):
        last = spans[-1] if spans else None
        if on_chip and last and last[0] % 2 == c % 2 and last[1] + last[2] == off:
            last[2] += h
        else:
            spans.append([c, off, h])
    return [RowBlock(chunk(c, off, h), y[row:row + h, 0:n]) for c, off, h in spans
            for row in [position_after(pos, s, tp, c) * ms + off]]


def ring_calls(tp: int, per_call: int) -> list[range]:
    """The ring steps each pipeline call multiplies: one step per call, or the first step
    alone and then ``per_call`` at a time ([0], [1, 2], [3, 4], ... for 2), so the first
    call starts on the rank's own shard and every later call's shards arrive during the
    call before it."""
    if per_call == 1:
        return [range(s, s + 1) for s in range(tp)]
    return [range(0, 1)] + [range(s, min(tp, s + per_call)) for s in range(1, tp, per_call)]


def _sbuf_ring(x_t, w, y, rg, tp, pos, halves, pipe, n_bufs, calls):
    """The ring on chip: shards move SBUF to SBUF in the matmul's K layout and the matmul
    reads them in place (no reload from HBM), both channel halves side by side; one
    buffer per call ([128, K tiles, the call's shards x this program's rows]), ``n_bufs``
    of them in turn. The transfers that deliver the next call's shards are issued before
    a call's matmul: each waits only for its data and for the successor to finish
    reading its buffer."""
    k, ms = x_t.shape
    n = w.shape[1]
    chans = list(range(len(halves)))
    kt = len(pipe.k_tiles)
    base = halves[0][0]  # the program's rows are columns base.. of the shard, 0.. of its slots
    mine = sum(h for _, h in halves)
    width = max(len(c) for c in calls) * mine
    bufs = [nl.ndarray((PMAX, kt, width), dtype=x_t.dtype, buffer=nl.sbuf, name=f"ring_sb{i}")
            for i in range(n_bufs)]
    where = {s: (i, j) for i, steps in enumerate(calls) for j, s in enumerate(steps)}

    def at(s, off, h):
        i, j = where[s]
        c0 = j * mine + off - base
        return bufs[i % n_bufs][0:PMAX, 0:kt, c0:c0 + h]

    for dst, src in pipe.k_major_copies(bufs[0][0:PMAX, 0:kt, 0:mine], x_t[0:k, base:base + mine]):
        nisa.dma_copy(dst=dst, src=src, name="ag_ld_shard")
    for i, steps in enumerate(calls):
        for s in (calls[i + 1] if i + 1 < len(calls) else ()):  # deliver the next call's shards
            ncc.collective_permute_implicit(
                srcs_by_channel=[[at(s - 1, off, h)] for off, h in halves],
                dsts_by_channel=[[at(s, off, h)] for off, h in halves],
                replica_group=rg, channel_ids=chans, name=f"ag_step{s - 1}")
        blocks = [b for s in steps for b in _blocks(y, tp, pos, s, halves, ms, n, lambda c, off, h: None)]
        pipe(blocks, w, x_sbuf=bufs[i % n_bufs][0:PMAX, 0:kt, 0:len(steps) * mine], flush=i == len(calls) - 1)


def _hbm_ring(x_t, w, y, rg, tp, pos, halves, pipe, slabs, calls):
    """The ring through HBM buffers (shards too large for SBUF), slab by slab: while a call
    multiplies its shards, the slabs that deliver the next call's shards go on to the
    successor, interleaved with its loads (side actions spread over the whole call), so
    each slab's share of the DMA bandwidth is small and arrives in K order for the next
    call. Buffers per channel: the shards of two calls (the one running and the next,
    arriving). At LNC 1 step 0 copies its slab of x_t into the ring buffer first (the
    sources of an LNC 1 collective are private HBM); at LNC 2 it sends from x_t."""
    k, ms = x_t.shape
    n = w.shape[1]
    chans = list(range(len(halves)))
    nb = 2 * max(len(c) for c in calls)
    bufs = [[nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.private_hbm, name=f"ring{c}_{i}") for i in range(nb)]
            for c, (_, h) in enumerate(halves)]

    # at LNC 1 collective srcs on HBM must be private_hbm ("nki.collectives.all_gather":
    # "When LNC degree is 1, the srcs must be on private_hbm"), so step 0 copies its slab of
    # x_t into the ring first; at LNC 2 the ring starts from x_t itself, a DMA fewer
    seed = nl.num_programs() == 1

    def src(s, c, k0, kl):
        off, h = halves[c]
        return x_t[k0:k0 + kl, off:off + h] if s == 0 and not seed else bufs[c][s % nb][k0:k0 + kl, 0:h]

    def send(s, k0, kl):
        if s == 0 and seed:
            for c, (off, h) in enumerate(halves):
                nisa.dma_copy(dst=bufs[c][0][k0:k0 + kl, 0:h], src=x_t[k0:k0 + kl, off:off + h], name="ag_seed")
        ncc.collective_permute_implicit(
            srcs_by_channel=[[src(s, c, k0, kl)] for c in chans],
            dsts_by_channel=[[bufs[c][(s + 1) % nb][k0:k0 + kl, 0:h]] for c, (_, h) in enumerate(halves)],
            replica_group=rg, channel_ids=chans, name=f"ag_step{s}")

    for i, steps in enumerate(calls):
        blocks = [b for s in steps for b in _blocks(
            y, tp, pos, s, halves, ms, n,
            (lambda c, off, h: x_t[0:k, off:off + h]) if s == 0 else (lambda c, off, h, s=s: bufs[c][s % nb]))]
        todo = [lambda s=s, k0=k0, kl=kl: send(s - 1, k0, kl)
                for s in (calls[i + 1] if i + 1 < len(calls) else ()) for k0, kl in slabs]
        half = (len(todo) + 1) // 2  # spread over the whole call: slab j is needed at block j of the next
        pipe(blocks, w, side=todo[:half], late=todo[half:], flush=i == len(calls) - 1)


@nki.jit
def allgather_ring(x_t, groups, channels=1):
    """The collective alone: G = all_gather of the K-major shards along M, as a ring.

    Args:
        x_t: [K, M_shard], this rank's shard, HBM.
        groups, channels: as in `allgather_matmul`.

    Returns:
        G: [K, tp * M_shard], shard of list position i in columns i*M_shard.., shared HBM.

    Decomposition: the ring schedule of `allgather_matmul` (whole chunks: the fewest hop
    latencies) with the matmul replaced by a DMA of the chunk in hand into G.
    Preconditions as in `allgather_matmul`.
    """
    assert len(x_t.shape) == 2, f"x_t must be 2-D, got {tuple(x_t.shape)}"
    k, ms = x_t.shape
    rg, tp, pos = ring_setup(groups, channels, "allgather_ring")
    base, mine = program_share(ms, "allgather_ring")
    halves = [(base + off, h) for off, h in channel_halves(mine, channels, "allgather_ring")]
    g_out = nl.ndarray((k, tp * ms), dtype=x_t.dtype, buffer=nl.shared_hbm, name="gathered")
    chans = list(range(channels))
    bufs = [[nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.private_hbm, name=f"ring{c}_{i}") for i in range(2)]
            for c, (_, h) in enumerate(halves)]
    if tp > 1:
        for c, (off, h) in enumerate(halves):
            nisa.dma_copy(dst=bufs[c][0], src=x_t[0:k, off:off + h], name="ring_seed")
    for s in range(tp):
        if s < tp - 1:
            ncc.collective_permute_implicit(
                srcs_by_channel=[[bufs[c][s % 2]] for c in chans],
                dsts_by_channel=[[bufs[c][(s + 1) % 2]] for c in chans],
                replica_group=rg, channel_ids=chans, name=f"ag_step{s}")
        for c, (off, h) in enumerate(halves):
            col = position_after(pos, s, tp, c) * ms + off
            chunk = x_t[0:k, off:off + h] if s == 0 else bufs[c][s % 2]
            nisa.dma_copy(dst=g_out[0:k, col:col + h], src=chunk, name="ag_place")
    return g_out


__all__ = ["allgather_matmul", "allgather_ring"]
