"""Matmul + reduce-scatter: the row-parallel linear with sequence-parallel output.

Z_shard = reduce_scatter(X @ W_shard) along M. Every rank holds a K-slice of X and the
matching rows of W; the partial products of a row chunk travel the ring, each rank adding
its own with collective_permute_implicit_reduce, and each step's matmul (the partial of
the next chunk) overlaps the previous step's transfer. With two or four channels the ring
runs both ways: on chip each chunk's sum comes to its owner half from each side, in about
tp/2 steps (`ring.scatter_steps`); through HBM every chunk goes all the way round, its rows
split in halves, one per direction.

Rank-dependent row offsets are ring-position arithmetic (`trnopt.kernels.ring`), valid
for the scalar register the rank id is on hardware.

Kernels here (references in `trnopt.kernels.references`):
- `matmul_reduce_scatter`: the fused ring kernel.
- `reduce_scatter_ring`: the same ring on precomputed partials (the collective alone).

`matmul_reduce_scatter` runs past 100 lines (50 of them its Dimensions/Args/Returns
docstring): one NKI program, as nki-library writes its kernels, so the ring's steps read in
the order the engines issue them; its set-up and buffers are the functions above it.
"""

from __future__ import annotations

from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import matmul_reduce_scatter_reference, reduce_scatter_reference  # noqa: F401
from trnopt.kernels.ring import (SLAB_BYTES, ScatterLayout, chunk_owner,
                                program_share, ring_setup, scatter_steps, step_width)
from trnopt.kernels.scatter_sbuf import sbuf_buffers, sbuf_ring, sbuf_ring_plan
from trnopt.kernels.tiling import (MOVING_FMAX, PMAX, SBUF_TRN2, MatmulPipeline, RowBlock, choose_tiling,
                                   matmul_operands, split_rows, tile_spans, unit_pieces)


def _ring_setup(groups: Sequence[Sequence[int]], m: int, channels: int, what: str):
    rg, tp, pos = ring_setup(groups, channels, what)
    assert m % tp == 0, f"{what}: M={m} rows must split evenly over the {tp} ranks of the ring"
    assert m // tp >= channels, f"{what}: {m // tp} rows per chunk cannot be split over {channels} channels"
    return rg, tp, pos, m // tp


def sum_dtype_for(dtype: Any, sum_dtype: Any = None) -> Any:
    """The dtype of the running sums that travel the ring: ``sum_dtype`` if given, else the
    input's dtype.

    Each rank adds in FP32 (the Tensor Engine accumulates in FP32, "nki.isa.nc_matmul";
    the Vector Engine computes in FP32 whatever its operands, "nki.isa.tensor_tensor") and
    rounds the sum once per hop to the dtype it sends. Sending the input's dtype moves the
    bytes a library reduce-scatter of that tensor moves (NCCL's ring reduce-scatter of
    BF16 data sends BF16 partial sums, one rounding per hop), which is also what the cost
    model's TP term counts, so the simulated overlap applies to the collective it times.
    The price is precision: a running sum is rounded once per hop, by up to 2^-9 of it,
    n - 1 times over a ring of n ranks one way, about n/2 times per side both ways
    (`ring.scatter_steps`, the on-chip ring's default). In the `trnopt kernels` check at TP128
    (2,097,152 outputs of random BF16 data; the tolerance is 2% of the element plus the
    scale of the result) the worst error against the scale was 3.8% one way, with one
    element outside the tolerance in the fused kernel and in the ring alone; both ways it
    is 2.4% in each, every element inside (at TP128 the margin is thin: before the ring
    alone added its two sides' sums in FP32, rounding once, one element was outside).
    Adversarial data (one large partial, then many small ones) loses more. Pass
    ``sum_dtype=nl.float32`` for FP32 sums (one rounding at the end) at twice the bytes on
    every link."""
    return dtype if sum_dtype is None else sum_dtype


def _hbm_buffers(ring: ScatterLayout, n: int, dt: Any, sdt: Any):
    """The ring's buffers through HBM: two send buffers of the widest step (``dt``), the
    landing buffer of step 0 (the partials as sent, exact in ``dt``) and two running-sum
    buffers (``sdt``), each of the last two with a region of ``ring.side_rows`` rows per
    side (`ScatterLayout.recv_row`)."""
    width = max(step_width(st) for st in ring.steps)
    sent = [nl.ndarray((width, n), dtype=dt, buffer=nl.private_hbm, name=f"part{i}") for i in range(2)]
    land = nl.ndarray((ring.sides * ring.side_rows, n), dtype=dt, buffer=nl.private_hbm, name="land")
    acc = [nl.ndarray((ring.sides * ring.side_rows, n), dtype=sdt, buffer=nl.private_hbm, name=f"acc{i}")
           for i in range(2)]
    return sent, land, acc


def _received(bufs, s: int) -> Any:
    """The sums received at step ``s``: the landing buffer at step 0, a running-sum buffer
    after."""
    _, land, acc = bufs
    return land if s == 0 else acc[s % 2]


def _hbm_send(rg, ring: ScatterLayout, bufs, s: int, c0: int, c1: int, piece: tuple[int, int] = (0, 1)) -> None:
    """Send columns c0..c1 of step ``s``'s partials on, on every channel of the step, rows
    of the ``piece[0]``-th of ``piece[1]`` row pieces of each chunk: a plain permute at
    s = 0 (the partials in their dtype, into the landing buffer), a permute-with-add after
    (partial + the sum received at s - 1, added in FP32 and sent in the running-sum
    dtype)."""
    sent = bufs[0][s % 2]
    i, k = piece
    chs, views = ring.steps[s], []
    for ch in chs:
        r0, rn = split_rows(ch.rows, min(k, ch.rows))[min(i, ch.rows - 1)]
        views.append((ch.slot + r0, ring.recv_row(ch) + r0, rn))
    mine = [[sent[a:a + rn, c0:c1]] for a, _, rn in views]
    dsts = [[_received(bufs, s)[b:b + rn, c0:c1]] for _, b, rn in views]
    chans = [ch.channel for ch in chs]
    if s == 0:
        ncc.collective_permute_implicit(srcs_by_channel=mine, dsts_by_channel=dsts, replica_group=rg,
                                        channel_ids=chans, name="rs_step0")
    else:
        ncc.collective_permute_implicit_reduce(
            srcs0_by_channel=mine, srcs1_by_channel=[[_received(bufs, s - 1)[b:b + rn, c0:c1]] for _, b, rn in views],
            dsts_by_channel=dsts, replica_group=rg, op=nl.add, channel_ids=chans, name=f"rs_step{s}")


@nki.jit
def matmul_reduce_scatter(x_t, w, groups, channels=1, pieces=None, sbuf_bytes=SBUF_TRN2, sum_dtype=None,
                          both_ways=None):
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
        both_ways: with 2 or 4 channels on the on-chip ring, each chunk's sum comes half
            from each side in about tp/2 steps (True) or goes all the way round in halves
            (False); `ring.scatter_steps`. None: `sbuf_ring_plan` decides. The HBM ring runs
            halves.

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
    Buffers are double (step s writes buffer s % 2). That is the schedule through HBM
    (`ring.scatter_steps` in halves, each step sent by `_hbm_send` as in the ring alone); on
    chip the steps are `ring.scatter_steps`' (both ways: two chunks a step, and the last
    step adds the sums from each side; `scatter_sbuf.sbuf_ring`).

    Preconditions: x_t, w 2-D with equal K_shard and dtype; M divisible by tp; M_shard >=
    channels x programs; channels in (1, 2, 4); pieces >= 1; equal rank-list sizes; LNC 1 or 2
    (at LNC 2 each physical core takes half of the columns, with its own ring,
    `ring.program_share`).
    """
    # ~110 lines, 60 of them docstring: the choice between the two rings and the HBM ring's
    # step loop, whose sender closes over the loop's buffers
    k, m, n_all = matmul_operands(x_t, w)
    rg, tp, pos, ms = _ring_setup(groups, m, channels, "matmul_reduce_scatter")
    z = nl.ndarray((ms, n_all), dtype=w.dtype, buffer=nl.shared_hbm, name="z")
    # this physical core's columns col0..col0+n, its own ring (LNC 2: the weight is the
    # larger operand, so each core loads only its half of it)
    col0, n = program_share(n_all, "matmul_reduce_scatter")
    w_mine = w[0:k, col0:col0 + n]
    sdt = sum_dtype_for(w.dtype, sum_dtype)
    assert pieces is None or pieces >= 1, f"pieces must be >= 1, got {pieces}"
    plan = sbuf_ring_plan(ms, k, n, tp, channels, w.dtype.itemsize, sdt.itemsize, sbuf_bytes, both_ways)
    assert not both_ways or plan is not None, (
        f"matmul_reduce_scatter: both_ways needs the on-chip ring, which M_shard={ms}, K={k}, N={n} do not take")
    if plan is not None:
        spans = unit_pieces(n, plan.cols, plan.blocks)
        bufs = sbuf_buffers(plan, k, max(nb for _, nb in spans), w.dtype, sdt)
        pending = []
        for i, (b0, nb) in enumerate(spans):
            pending = sbuf_ring(x_t, w_mine[0:k, b0:b0 + nb], z[0:ms, col0 + b0:col0 + b0 + nb], rg, tp, pos, ms,
                                 plan, bufs, pending, final=i == len(spans) - 1, phase=i * len(plan.steps))
        return z
    ring = ScatterLayout(scatter_steps(ms, tp, channels, False), 1, ms)  # halves through HBM
    bufs = _hbm_buffers(ring, n, w.dtype, sdt)
    tiling = choose_tiling(ms, k, n, x_t.dtype.itemsize, w.dtype.itemsize, addend=True,
                           addend_itemsize=sdt.itemsize, sbuf_bytes=sbuf_bytes)
    group_cols = tiling.n_tiles * MOVING_FMAX
    slabs = unit_pieces(n, group_cols, pieces if pieces is not None else -(-n // group_cols))
    pipe = MatmulPipeline(k, n, x_t.dtype, w.dtype, tiling, addend_dtype=sdt, name="rs")

    # a slab of more than about SLAB_BYTES per channel goes in row pieces
    chunk_rows = [ch.rows for ch in ring.steps[0]]  # per channel (the own chunk when tp = 1)
    slab_bytes = max(chunk_rows) * max(nl_ for _, nl_ in slabs) * sdt.itemsize
    row_pieces = max(1, min(min(chunk_rows), -(-slab_bytes // SLAB_BYTES)))

    def sender(s):
        # send each slab once the evacuation of its last column group is emitted
        todo = list(slabs)

        def on_evac(n0, ncols):
            while todo and todo[0][0] + todo[0][1] <= n0 + ncols:
                c0, cn = todo.pop(0)
                for i in range(row_pieces):
                    pipe.defer(lambda c0=c0, cn=cn, i=i: _hbm_send(rg, ring, bufs, s, c0, c0 + cn, (i, row_pieces)))
        return on_evac
    last_s = len(ring.steps) - 1
    for s, step in enumerate(ring.steps):
        blocks = []
        if s < last_s:
            for ch in step:
                col = chunk_owner(pos, ch, last_s - s, tp) * ms + ch.offset
                blocks.append(RowBlock(x_t[0:k, col:col + ch.rows], bufs[0][s % 2][ch.slot:ch.slot + ch.rows]))
        else:  # the own chunk, in the rows each channel's sums arrive in, added at evacuation
            for ch in (ring.steps[s - 1] if s else step):
                col, got = pos * ms + ch.offset, ring.recv_row(ch)
                blocks.append(RowBlock(x_t[0:k, col:col + ch.rows], z[ch.offset:ch.offset + ch.rows, col0:col0 + n],
                                       _received(bufs, s - 1)[got:got + ch.rows] if s else None))
        # Column groups run left to right (n_outer); a slab goes on as soon as its columns
        # are evacuated, the last one once the next step's first loads are out (MatmulPipeline).
        pipe(blocks, w_mine, n_outer=True, flush=s == last_s, on_evac=None if s == last_s else sender(s))
    return z


@nki.jit
def reduce_scatter_ring(partial, groups, channels=1, sum_dtype=None, k=None, sbuf_bytes=SBUF_TRN2, both_ways=None):
    """The collective alone: Z_shard = reduce_scatter(partial) along M over the ring.

    Args:
        partial: [M, N], this rank's partial sums, HBM.
        groups, channels, sum_dtype, sbuf_bytes: as in `matmul_reduce_scatter`.
        k: the contraction size of the fused kernel this ring stands for: with it and
            ``both_ways`` None the ring runs the schedule that kernel's plan takes
            (`sbuf_ring_plan`); without it, halves.
        both_ways: `ring.scatter_steps`; None: as above.

    Returns:
        Z_shard: [M / tp, N] in partial's dtype, shared HBM.

    Decomposition: the ring schedule of `matmul_reduce_scatter` with each step's matmul
    replaced by a DMA of the step's chunks from `partial` into the send buffer; the last
    step adds the sums arriving from each side to the own chunk in SBUF (128 x 512 tiles,
    in FP32, rounded once). Step 0 sends the chunks in partial's dtype, later steps the running sums in
    ``sum_dtype``, as the fused kernel does. Preconditions as there.
    """
    assert len(partial.shape) == 2, f"partial must be 2-D, got {tuple(partial.shape)}"
    m, n_all = partial.shape
    rg, tp, pos, ms = _ring_setup(groups, m, channels, "reduce_scatter_ring")
    dt = partial.dtype
    sdt = sum_dtype_for(dt, sum_dtype)
    z = nl.ndarray((ms, n_all), dtype=dt, buffer=nl.shared_hbm, name="z")
    col0, n = program_share(n_all, "reduce_scatter_ring")  # as the fused kernel splits the columns
    if both_ways is None:
        plan = sbuf_ring_plan(ms, k, n, tp, channels, dt.itemsize, sdt.itemsize, sbuf_bytes) if k else None
        both_ways = plan is not None and plan.sides == 2
    steps = scatter_steps(ms, tp, channels, bool(both_ways) and channels > 1)
    ring = ScatterLayout(steps, 2 if both_ways and channels > 1 else 1, ms)
    last_s = len(steps) - 1
    bufs = _hbm_buffers(ring, n, dt, sdt)
    sent, land = bufs[0], bufs[1]
    o_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=dt, buffer=nl.sbuf, name=f"rs_o{i}") for i in range(2)]
    if ring.zero_spans(ms):
        nisa.memset(o_t[1], 0.0, name="rs_zero")
    for r0, rn in ring.zero_spans(ms):  # as `ScatterLayout.zero_spans`, through HBM
        for t0, tn in tile_spans(rn, PMAX):
            for c0, cs in tile_spans(n, MOVING_FMAX):
                nisa.dma_copy(dst=land[r0 + t0:r0 + t0 + tn, c0:c0 + cs], src=o_t[1][0:tn, 0:cs], name="rs_zero")
    for s in range(last_s):
        for ch in steps[s]:
            row = chunk_owner(pos, ch, last_s - s, tp) * ms + ch.offset
            nisa.dma_copy(dst=sent[s % 2][ch.slot:ch.slot + ch.rows, 0:n],
                          src=partial[row:row + ch.rows, col0:col0 + n], name="rs_stage")
        _hbm_send(rg, ring, bufs, s, 0, n)
    mine = pos * ms
    sides = ring.sides if tp > 1 else 0
    a_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=dt, buffer=nl.sbuf, name=f"rs_a{i}") for i in range(2)]
    b_t = [[nl.ndarray((PMAX, MOVING_FMAX), dtype=sdt, buffer=nl.sbuf, name=f"rs_b{d}_{i}") for i in range(2)]
           for d in range(sides)]
    # both ways the first side's sum is added in FP32, so the result is rounded once
    s_t = [nl.ndarray((PMAX, MOVING_FMAX), dtype=nl.float32, buffer=nl.sbuf, name=f"rs_s{i}") for i in range(2)] \
        if sides > 1 else []
    i = 0
    for r0, rs in tile_spans(ms, PMAX):
        for c0, cs in tile_spans(n, MOVING_FMAX):
            a, o = a_t[i % 2], o_t[i % 2]
            nisa.dma_copy(dst=a[0:rs, 0:cs], src=partial[mine + r0:mine + r0 + rs, col0 + c0:col0 + c0 + cs],
                          name="rs_ld_own")
            src = a
            for d in range(sides):
                b, dst = b_t[d][i % 2], (o if d == sides - 1 else s_t[i % 2])
                got = _received(bufs, last_s - 1)
                nisa.dma_copy(dst=b[0:rs, 0:cs], src=got[d * ms + r0:d * ms + r0 + rs, c0:c0 + cs], name="rs_ld_acc")
                nisa.tensor_tensor(dst[0:rs, 0:cs], src[0:rs, 0:cs], b[0:rs, 0:cs], op=nl.add, name="rs_add")
                src = dst
            if not sides:
                nisa.tensor_copy(o[0:rs, 0:cs], a[0:rs, 0:cs], name="rs_copy")
            nisa.dma_copy(dst=z[r0:r0 + rs, col0 + c0:col0 + c0 + cs], src=o[0:rs, 0:cs], name="rs_st")
            i += 1
    return z


__all__ = ["matmul_reduce_scatter", "reduce_scatter_ring", "sum_dtype_for"]
