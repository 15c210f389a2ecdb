"""Matmul + reduce-scatter: the row-parallel linear with sequence-parallel output.

Z_shard = reduce_scatter(X @ W_shard) along M. Every rank holds a K-slice of X and the
matching rows of W; the partial products of a row chunk travel the ring, each rank adding
its own with collective_permute_implicit_reduce, and each step's matmul (the partial of
the next chunk) overlaps the previous step's transfer. Two channels split every chunk's
rows in halves running the ring both ways.

Rank-dependent row offsets are ring-position arithmetic (`trnopt.kernels.ring`), valid
for the scalar register the rank id is on hardware.

Kernels here (references in `trnopt.kernels.references`):
- `matmul_reduce_scatter`: the fused ring kernel.
- `reduce_scatter_ring`: the same ring on precomputed partials (the collective alone).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import matmul_reduce_scatter_reference, reduce_scatter_reference  # noqa: F401
from trnopt.kernels.ring import SLAB_BYTES, channel_halves, position_after, program_share, ring_setup
from trnopt.kernels.tiling import (MOVING_FMAX, PMAX, PSUM_BANKS, SBUF_SHARE, SBUF_TRN2, MatmulPipeline, RowBlock,
                                   choose_tiling, k_interleaved,
                                   matmul_operands, split_rows, tile_spans, unit_pieces)


def _ring_setup(groups: Sequence[Sequence[int]], m: int, channels: int, what: str):
    rg, tp, pos = ring_setup(groups, channels, what)
    assert m % tp == 0, f"{what}: M={m} rows must split evenly over the {tp} ranks of the ring"
    halves = channel_halves(m // tp, channels, what)
    return rg, tp, pos, m // tp, halves


def sum_dtype_for(dtype: Any, sum_dtype: Any = None) -> Any:
    """The dtype of the running sums that travel the ring: ``sum_dtype`` if given, else the
    input's dtype.

    Each rank adds in FP32 (the Tensor Engine accumulates in FP32, "nki.isa.nc_matmul";
    the Vector Engine computes in FP32 whatever its operands, "nki.isa.tensor_tensor") and
    rounds the sum once per hop to the dtype it sends. Sending the input's dtype moves the
    bytes a library reduce-scatter of that tensor moves (NCCL's ring reduce-scatter of
    BF16 data sends BF16 partial sums, one rounding per hop), which is also what the cost
    model's TP term counts, so the measured overlap applies to the collective it times.
    The price is precision: over a ring of n ranks the sum is rounded n - 1 times, about
    2^-9 of it each time; on random BF16 data the worst error measured against the scale
    of the result is about 1.4% at n = 64 and 1.8% at n = 128 (the BF16 tolerance is 2%),
    the tail of a larger tensor reaches further (`trnopt kernels` at TP128, 2M outputs:
    3.8%, and 1 element outside the tolerance, as for the ring alone), and adversarial
    data (one large partial, then many small ones) loses more. Pass
    ``sum_dtype=nl.float32`` for FP32 sums (one rounding at the end) at twice the bytes on
    every link."""
    return dtype if sum_dtype is None else sum_dtype


def _ring_buffers(halves, n: int, dt: Any, sdt: Any):
    """Per channel: two send buffers ``part`` (dtype ``dt``), the landing buffer ``land`` of
    step 0 (the predecessor's own partial, exact in ``dt``) and two running-sum buffers
    ``acc`` (dtype ``sdt``)."""
    part = [[nl.ndarray((h, n), dtype=dt, buffer=nl.private_hbm, name=f"part{c}_{i}") for i in range(2)]
            for c, (_, h) in enumerate(halves)]
    land = [nl.ndarray((h, n), dtype=dt, buffer=nl.private_hbm, name=f"land{c}") for c, (_, h) in enumerate(halves)]
    acc = [[nl.ndarray((h, n), dtype=sdt, buffer=nl.private_hbm, name=f"acc{c}_{i}") for i in range(2)]
           for c, (_, h) in enumerate(halves)]
    return part, land, acc


SUM_BUFFERS = 4  # on-chip ring: two partial buffers and two received-sum buffers, each [128, rows, columns]


def sbuf_ring_plan(ms: int, k: int, n: int, halves, in_itemsize: int, sum_itemsize: int,
                   sbuf_bytes: int) -> tuple[int, int] | None:
    """``(column blocks, columns per matmul group)`` of the on-chip ring (`_sbuf_ring`), or
    None when it does not apply.

    It applies with K in whole 128-row tiles and each channel half either within one
    128-row tile or made of whole tiles, when within ``SBUF_SHARE`` of ``sbuf_bytes`` per
    partition fit a column block's resident weight ([128, K/128, N/blocks] in w's dtype),
    two x chunks and ``SUM_BUFFERS`` sum buffers of the block (in the sum dtype). The
    fewest column blocks that fit (each runs the whole ring in turn, so a block holds only
    its share of the weight and of the sums). A matmul group spans at most four PSUM banks
    (two groups double-buffer in the eight)."""
    if k % PMAX or not all(off // PMAX == (off + h - 1) // PMAX or (off % PMAX == 0 and h % PMAX == 0)
                           for off, h in halves):
        return None
    rows = -(-ms // PMAX)
    if rows > 4:
        return None
    kt = k // PMAX
    for blocks in (1, 2, 4):
        nb = -(-n // blocks)
        fixed = (kt * nb + 2 * kt * ms) * in_itemsize
        if fixed + SUM_BUFFERS * rows * nb * sum_itemsize <= sbuf_bytes * SBUF_SHARE:
            return blocks, min(4 * MOVING_FMAX // rows, nb)
    return None


def _sbuf_buffers(ms: int, k: int, nb: int, dt, sdt):
    """The on-chip ring's SBUF tiles, shared by its column blocks: the weight block, two x
    chunks, two partial and two received-sum buffers, and the PSUM banks."""
    kt, rows = k // PMAX, -(-ms // PMAX)
    sums = [nl.ndarray((PMAX, rows, nb), dtype=sdt, buffer=nl.sbuf, name=f"rs_sum{i}") for i in range(SUM_BUFFERS)]
    return (nl.ndarray((PMAX, kt, nb), dtype=dt, buffer=nl.sbuf, name="rs_w"),
            [nl.ndarray((PMAX, kt, ms), dtype=dt, buffer=nl.sbuf, name=f"rs_x{i}") for i in range(2)],
            sums[:2], sums[2:],
            [nl.ndarray((PMAX, MOVING_FMAX), dtype=nl.float32, buffer=nl.psum, name=f"rs_ps{i}")
             for i in range(PSUM_BANKS)])


def _sbuf_ring(x_t, w, z, rg, tp: int, pos, ms: int, halves, cols: int, bufs, pending=(), final=True, phase=0):
    """The ring on chip for one column block of the weight: the running sums never touch HBM.

    The weight stays in SBUF. At step s < tp - 1 the chunk's partial goes from PSUM into
    the partial buffer ``part[(phase + s) % 2]`` (a plain copy, rounded to the sum dtype),
    and one collective_permute_implicit_reduce per step sends partial + the sum received
    at step s - 1 to the successor's ``recv[(phase + s) % 2]`` (step 0 sends the partial
    alone, with collective_permute_implicit; SBUF to SBUF, the collectives pages'
    all-on-SBUF case). The collective adds, so a step's matmuls and evacuations wait for
    no transfer: the chain from one hop to the next is the transfer alone, and the matmuls
    of step s + 1 run while step s's sums cross (``part`` is double-buffered). The last
    step adds the arriving sums to its own partial (the Vector Engine adds in FP32) and
    stores them to z, the DMA converting the sum dtype to z's on the way where they differ
    ("nki.isa.dma_copy": a DMA converts dtypes). Per step the core's DMA moves only the
    sums it sends (the HBM ring also stores each partial and reads it back), which is what
    bounds the ring at large TP degrees.

    Column blocks run one after the other on the same tiles (``bufs``, `_sbuf_buffers`);
    ``phase``, the ring steps of the blocks before, keeps the buffers alternating across
    them. The ``final`` block adds at evacuation, from PSUM. Any other evacuates its last
    step like the others and returns the additions and stores as callables, which the next
    block emits (``pending``) after its first step's evacuations: emitted in place, they
    wait for the last sums to arrive and hold the PSUM banks, so the next block's matmuls
    would wait for the ring's last hop too (12 us a block at 70B TP16 LNC 1 on one
    channel)."""
    # ~100 lines, 30 of them docstring: one loop nest whose loads, matmuls, evacuations and
    # sends share the buffer arithmetic; split, each piece would take all of it as arguments
    k, n = w.shape
    kt = k // PMAX
    rows = tile_spans(ms, PMAX)
    chans = list(range(len(halves)))
    w_sb, x_sb, part, recv, psum = bufs

    def half(t, c: int):  # channel c's rows of a [128, row tiles, n] tile
        off, h = halves[c]
        r, p0 = divmod(off, PMAX)
        return t[p0:p0 + h, r, 0:n] if p0 + h <= PMAX else t[0:PMAX, r:r + h // PMAX, 0:n]

    def load_x(s: int) -> None:
        # partition p, slot j holds contraction row p * kt + j, as for the weight (k_interleaved)
        for c, (off, h) in enumerate(halves):
            col = position_after(pos, s + 1, tp, c) * ms + off
            nisa.dma_copy(dst=x_sb[s % 2][0:PMAX, 0:kt, off:off + h], src=k_interleaved(x_t[0:k, col:col + h], kt),
                          name="rs_ld_x")

    def send(s: int) -> None:  # one permute per step: each step pays one hop latency, as the ring alone does
        dsts = [[half(recv[(phase + s) % 2], c)] for c in chans]
        mine = [[half(part[(phase + s) % 2], c)] for c in chans]
        if s == 0:
            ncc.collective_permute_implicit(srcs_by_channel=mine, dsts_by_channel=dsts, replica_group=rg,
                                            channel_ids=chans, name="rs_step0")
        else:
            ncc.collective_permute_implicit_reduce(
                srcs0_by_channel=mine, srcs1_by_channel=[[half(recv[(phase + s - 1) % 2], c)] for c in chans],
                dsts_by_channel=dsts, replica_group=rg, op=nl.add, channel_ids=chans, name=f"rs_step{s}")
    load_x(0)
    for c0, cn in tile_spans(n, cols):  # group by group: the first matmul waits for one group's weight
        nisa.dma_copy(dst=w_sb[0:PMAX, 0:kt, c0:c0 + cn], src=k_interleaved(w[0:k, c0:c0 + cn], kt), name="rs_ld_w")
    q = 0  # matmul groups so far: PSUM banks alternate between the two halves of the eight
    finish = []
    for s in range(tp):
        if s + 1 < tp:
            load_x(s + 1)
        last = s == tp - 1
        out, got = part[(phase + s) % 2], recv[(phase + s - 1) % 2]  # got: the sums received at step s - 1
        for g0, gn in tile_spans(n, cols):
            banks = tile_spans(gn, MOVING_FMAX)
            ps = [[psum[(q % 2) * (PSUM_BANKS // 2) + r * len(banks) + b] for b in range(len(banks))]
                  for r in range(len(rows))]
            q += 1
            for j in range(kt):
                for r, (r0, rn) in enumerate(rows):
                    for b, (b0, bn) in enumerate(banks):
                        nisa.nc_matmul(ps[r][b][0:rn, 0:bn], x_sb[s % 2][0:PMAX, j, r0:r0 + rn],
                                       w_sb[0:PMAX, j, g0 + b0:g0 + b0 + bn], accumulate=j > 0, name="rs_mm")
            for r, (r0, rn) in enumerate(rows):
                for b, (b0, bn) in enumerate(banks):
                    d, src = out[0:rn, r, g0 + b0:g0 + b0 + bn], ps[r][b][0:rn, 0:bn]
                    if last and final:  # the plan is for rings of two or more
                        nisa.tensor_tensor(d, src, got[0:rn, r, g0 + b0:g0 + b0 + bn], op=nl.add,
                                           engine=_add_engine(r, b), name="rs_evac_add")
                    else:
                        eng = nisa.vector_engine if (r + b) % 2 == 0 else nisa.scalar_engine
                        nisa.tensor_copy(d, src, engine=eng, name="rs_evac")
            if last:
                emit = partial(_finish_group, z, out, got, rows, g0, gn, banks, not final)
                if final:
                    emit()
                else:
                    finish.append(emit)
        if s == 0:
            for fn in pending:
                fn()
        if not last:
            send(s)
    return finish


def _add_engine(r: int, b: int):
    """The engine of the last step's additions: Vector and GpSimd in turn (Scalar has no
    tensor_tensor)."""
    return nisa.vector_engine if (r + b) % 2 == 0 else nisa.gpsimd_engine


def _finish_group(z, out, got, rows, g0: int, gn: int, banks, add: bool) -> None:
    """The end of the on-chip ring for columns g0..g0+gn: ``out`` += ``got`` (the sums
    received) where ``add`` (not already added at evacuation), then ``out`` to z."""
    for r, (r0, rn) in enumerate(rows):
        if add:
            for b, (b0, bn) in enumerate(banks):
                d = out[0:rn, r, g0 + b0:g0 + b0 + bn]
                nisa.tensor_tensor(d, d, got[0:rn, r, g0 + b0:g0 + b0 + bn], op=nl.add, engine=_add_engine(r, b),
                                   name="rs_evac_add")
        nisa.dma_copy(dst=z[r0:r0 + rn, g0:g0 + gn], src=out[0:rn, r, g0:g0 + gn], name="rs_st")


def _received(land: list, acc: list, c: int, s: int) -> Any:
    """The sum received at step ``s`` on channel ``c``: the landing buffer after step 0,
    the running-sum buffer of step s after that."""
    return land[c] if s == 0 else acc[c][s % 2]


def _ring_step(rg, s: int, part: list, land: list, acc: list, chans: list[int], n0: int, nl_: int,
               piece: tuple[int, int] = (0, 1)) -> None:
    """Send columns n0:n0+nl_ of step s's partials on, rows of the ``piece[0]``-th of
    ``piece[1]`` row pieces of each channel: plain permute at s = 0 (the own partial, in
    its dtype, into ``land``), permute-with-add after (partial + received sum, added in
    FP32 and sent in the running-sum dtype)."""
    i, k = piece

    def v(t):
        r0, rn = split_rows(t.shape[0], min(k, t.shape[0]))[min(i, t.shape[0] - 1)]
        return t[r0:r0 + rn, n0:n0 + nl_]
    if s == 0:
        ncc.collective_permute_implicit(
            srcs_by_channel=[[v(part[c][0])] for c in chans], dsts_by_channel=[[v(land[c])] for c in chans],
            replica_group=rg, channel_ids=chans, name="rs_step0")
    else:
        ncc.collective_permute_implicit_reduce(
            srcs0_by_channel=[[v(part[c][s % 2])] for c in chans],
            srcs1_by_channel=[[v(_received(land, acc, c, s - 1))] for c in chans],
            dsts_by_channel=[[v(acc[c][s % 2])] for c in chans],
            replica_group=rg, op=nl.add, channel_ids=chans, name=f"rs_step{s}")


@nki.jit
def matmul_reduce_scatter(x_t, w, groups, channels=1, pieces=None, sbuf_bytes=SBUF_TRN2, sum_dtype=None):
    """Z_shard = reduce_scatter(X @ W_shard) along M, the reduce-scatter hidden in a ring.

    Dimensions:
        tp: ranks in this rank's rank-list; M rows of X (all sequence positions), M_shard =
        M / tp; K_shard this rank's slice of the contraction; N output columns.

    Args:
        x_t: [K_shard, M], this rank's K-slice of X, transposed (K-major), HBM, bfloat16 or
            float32.
        w: [K_shard, N], the matching rows of W, HBM, same dtype as x_t.
        groups: replica groups (disjoint rank-lists); list order is the ring order and the
            shard order: list position i receives rows i*M_shard.. of the sum, as
            ncc.reduce_scatter splits.
        channels: 1, 2 (each chunk's rows split in halves, the first half reduced around
            the ring forward on channel 0, the second backward on channel 1) or 4 (even
            channels forward, odd backward; `ring.channel_halves`).
        pieces: each step's partial travels in up to this many column slabs (aligned to the
            matmul's column groups, which run left to right), each sent as soon as its
            columns are evacuated; the last step adds each slab as it arrives. None: one
            slab per column group.
        sbuf_bytes: SBUF bytes per partition of the target chip (the tiling's budget).
        sum_dtype: dtype of the running sums on the ring (`sum_dtype_for`: default w's
            dtype, as a library reduce-scatter sends; FP32 for one rounding at the end).

    Returns:
        Z_shard: [M_shard, N] in w's dtype, shared HBM: sum over the ring of X_r @ W_r for
        this rank's rows.

    Decomposition: at step s = 0..tp-1 the rank computes its partial for the chunk owned by
    position_after(pos, s + 1) (the chunk that reaches its owner after tp - 1 - s more
    hops) into an HBM buffer; at s = 0 it is sent on with
    collective_permute_implicit, at 0 < s < tp - 1 collective_permute_implicit_reduce sends
    partial + the sum received at s - 1. The last step computes the rank's own chunk and
    adds the arriving sum while evacuating PSUM. Each rank's partial is rounded once to w's
    dtype (step 0 sends it as is); the running sums are added in FP32 and travel in
    ``sum_dtype`` (by default w's dtype: one rounding per hop, as a library reduce-scatter).
    Buffers are double (step s writes buffer s % 2).

    Preconditions: x_t, w 2-D with equal K_shard and dtype; M divisible by tp; M_shard >=
    channels x programs; channels in (1, 2, 4); pieces >= 1; equal rank-list sizes; LNC 1 or 2
    (at LNC 2 each physical core takes half of the columns, with its own ring,
    `ring.program_share`).
    """
    k, m, n_all = matmul_operands(x_t, w)
    rg, tp, pos, ms, halves = _ring_setup(groups, m, channels, "matmul_reduce_scatter")
    z = nl.ndarray((ms, n_all), dtype=w.dtype, buffer=nl.shared_hbm, name="z")
    # this physical core's columns col0..col0+n, its own ring (LNC 2: the weight is the
    # larger operand, so each core loads only its half of it)
    col0, n = program_share(n_all, "matmul_reduce_scatter")
    w_mine = w[0:k, col0:col0 + n]
    chans = list(range(channels))
    sdt = sum_dtype_for(w.dtype, sum_dtype)
    assert pieces is None or pieces >= 1, f"pieces must be >= 1, got {pieces}"
    plan = sbuf_ring_plan(ms, k, n, halves, w.dtype.itemsize, sdt.itemsize, sbuf_bytes) if tp > 1 else None
    if plan is not None:
        blocks, cols = plan
        spans = unit_pieces(n, cols, blocks)
        bufs = _sbuf_buffers(ms, k, max(nb for _, nb in spans), w.dtype, sdt)
        pending = []
        for i, (b0, nb) in enumerate(spans):
            pending = _sbuf_ring(x_t, w_mine[0:k, b0:b0 + nb], z[0:ms, col0 + b0:col0 + b0 + nb], rg, tp, pos, ms,
                                 halves, cols, bufs, pending, final=i == len(spans) - 1, phase=i * tp)
        return z
    part, land, acc = _ring_buffers(halves, n, w.dtype, sdt)
    tiling = choose_tiling(ms, k, n, x_t.dtype.itemsize, w.dtype.itemsize, addend=True,
                           addend_itemsize=sdt.itemsize, sbuf_bytes=sbuf_bytes)
    group_cols = tiling.n_tiles * MOVING_FMAX
    slabs = unit_pieces(n, group_cols, pieces if pieces is not None else -(-n // group_cols))
    pipe = MatmulPipeline(k, n, x_t.dtype, w.dtype, tiling, addend_dtype=sdt, name="rs")

    # a slab of more than about SLAB_BYTES per channel goes in row pieces
    slab_bytes = halves[0][1] * max(nl_ for _, nl_ in slabs) * sdt.itemsize
    row_pieces = max(1, min(halves[-1][1], -(-slab_bytes // SLAB_BYTES)))

    def sender(s):
        # send each slab once the evacuation of its last column group is emitted
        todo = list(slabs)

        def on_evac(n0, ncols):
            while todo and todo[0][0] + todo[0][1] <= n0 + ncols:
                cols = todo.pop(0)
                for i in range(row_pieces):
                    pipe.defer(lambda cols=cols, i=i: _ring_step(rg, s, part, land, acc, chans, *cols,
                                                                 piece=(i, row_pieces)))
        return on_evac
    for s in range(tp):
        last = s == tp - 1
        blocks = []
        for c, (off, h) in enumerate(halves):
            col = position_after(pos, s + 1, tp, c) * ms + off
            if last:
                addend = _received(land, acc, c, s - 1) if tp > 1 else None
                blocks.append(RowBlock(x_t[0:k, col:col + h], z[off:off + h, col0:col0 + n], addend))
            else:
                blocks.append(RowBlock(x_t[0:k, col:col + h], part[c][s % 2]))
        # Column groups run left to right (n_outer); a slab goes on as soon as its columns
        # are evacuated, the last one once the next step's first loads are out (MatmulPipeline).
        pipe(blocks, w_mine, n_outer=True, flush=last, on_evac=None if last else sender(s))
    return z


@nki.jit
def reduce_scatter_ring(partial, groups, channels=1, sum_dtype=None):
    """The collective alone: Z_shard = reduce_scatter(partial) along M over the ring.

    Args:
        partial: [M, N], this rank's partial sums, HBM.
        groups, channels, sum_dtype: as in `matmul_reduce_scatter`.

    Returns:
        Z_shard: [M / tp, N] in partial's dtype, shared HBM.

    Decomposition: the ring schedule of `matmul_reduce_scatter` with each step's matmul
    replaced by a DMA of the chunk from `partial` into the send buffer; the last step adds
    the arriving sum to the own chunk in SBUF (128 x 512 tiles, in FP32). Step 0 sends the
    chunk in partial's dtype, later steps the running sum in ``sum_dtype``, as the fused
    kernel does. Preconditions as there.
    """
    assert len(partial.shape) == 2, f"partial must be 2-D, got {tuple(partial.shape)}"
    m, n_all = partial.shape
    rg, tp, pos, ms, halves = _ring_setup(groups, m, channels, "reduce_scatter_ring")
    dt = partial.dtype
    sdt = sum_dtype_for(dt, sum_dtype)
    z = nl.ndarray((ms, n_all), dtype=dt, buffer=nl.shared_hbm, name="z")
    col0, n = program_share(n_all, "reduce_scatter_ring")  # as the fused kernel splits the columns
    chans = list(range(channels))
    part, land, acc = _ring_buffers(halves, n, dt, sdt)
    for s in range(tp - 1):
        for c, (off, h) in enumerate(halves):
            row = position_after(pos, s + 1, tp, c) * ms + off
            nisa.dma_copy(dst=part[c][s % 2], src=partial[row:row + h, col0:col0 + n], name="rs_stage")
        _ring_step(rg, s, part, land, acc, chans, 0, n)
    mine = pos * ms
    a_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=dt, buffer=nl.sbuf, name=f"rs_a{i}") for i in range(2)]
    b_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=sdt, buffer=nl.sbuf, name=f"rs_b{i}") for i in range(2)]
    o_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=dt, buffer=nl.sbuf, name=f"rs_o{i}") for i in range(2)]
    i = 0
    for c, (off, h) in enumerate(halves):
        for r0, rs in tile_spans(h, PMAX):
            for c0, cs in tile_spans(n, MOVING_FMAX):
                a, b, o = a_t[i % 2], b_t[i % 2], o_t[i % 2]
                i += 1
                row = mine + off + r0
                nisa.dma_copy(dst=a[0:rs, 0:cs], src=partial[row:row + rs, col0 + c0:col0 + c0 + cs],
                              name="rs_ld_own")
                if tp > 1:
                    got = _received(land, acc, c, tp - 2)
                    nisa.dma_copy(dst=b[0:rs, 0:cs], src=got[r0:r0 + rs, c0:c0 + cs], name="rs_ld_acc")
                    nisa.tensor_tensor(o[0:rs, 0:cs], a[0:rs, 0:cs], b[0:rs, 0:cs], op=nl.add, name="rs_add")
                else:
                    nisa.tensor_copy(o[0:rs, 0:cs], a[0:rs, 0:cs], name="rs_copy")
                nisa.dma_copy(dst=z[off + r0:off + r0 + rs, col0 + c0:col0 + c0 + cs], src=o[0:rs, 0:cs],
                              name="rs_st")
    return z


__all__ = ["matmul_reduce_scatter", "reduce_scatter_ring", "sum_dtype_for"]
