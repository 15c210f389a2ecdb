"""Matmul + reduce-scatter: the row-parallel linear with sequence-parallel output.

Z_shard = reduce_scatter(X @ W_shard) along M. Every rank holds a K-slice of X and the
matching rows of W; the partial products of a row chunk travel the ring, each rank adding
its own with collective_permute_implicit_reduce, and each step's matmul (the partial of
the next chunk) overlaps the previous step's transfer. With two or four channels the ring
runs both ways: on chip each chunk's sum comes to its owner half from each side, in about
tp/2 steps (`scatter_steps`); through HBM every chunk goes all the way round, its rows
split in halves, one per direction.

Rank-dependent row offsets are ring-position arithmetic (`trnopt.kernels.ring`), valid
for the scalar register the rank id is on hardware.

Kernels here (references in `trnopt.kernels.references`):
- `matmul_reduce_scatter`: the fused ring kernel.
- `reduce_scatter_ring`: the same ring on precomputed partials (the collective alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import matmul_reduce_scatter_reference, reduce_scatter_reference  # noqa: F401
from trnopt.kernels.ring import (SLAB_BYTES, Chunk, channel_halves, gather_steps, position_after, program_share,
                                ring_setup, step_width)
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
    The price is precision: a running sum is rounded once per hop, by up to 2^-9 of it,
    n - 1 times over a ring of n ranks one way, about n/2 times per side both ways
    (`scatter_steps`, the on-chip ring's default). In the `trnopt kernels` check at TP128
    (2,097,152 outputs of random BF16 data; the tolerance is 2% of the element plus the
    scale of the result) the worst error against the scale was 3.8% one way, with one
    element outside the tolerance in the fused kernel and in the ring alone; both ways it
    is 2.4% in each, every element inside (at TP128 the margin is thin: before the ring
    alone added its two sides' sums in FP32, rounding once, one element was outside).
    Adversarial data (one large partial, then many small ones) loses more. Pass
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


def _fits_tiles(row: int, rows: int) -> bool:
    """Whether rows ``row..row+rows`` of a [128, tiles, n] SBUF buffer are one view: within
    one 128-row tile, or whole tiles."""
    return row // PMAX == (row + rows - 1) // PMAX or (row % PMAX == 0 and rows % PMAX == 0)


def _tile_view(t: Any, row: int, rows: int, c0: int, c1: int) -> Any:
    """Rows ``row..row+rows`` (`_fits_tiles`), columns c0..c1 of a [128, tiles, n] SBUF buffer."""
    r, p0 = divmod(row, PMAX)
    return t[p0:p0 + rows, r, c0:c1] if p0 + rows <= PMAX else t[0:PMAX, r:r + rows // PMAX, c0:c1]


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


@dataclass(frozen=True)
class ScatterRing(ScatterLayout):
    """The on-chip reduce-scatter ring of one program (`sbuf_ring_plan`); its sides' regions
    start on whole 128-row tiles."""

    blocks: int  #: column blocks of the weight, each running the whole ring in turn
    cols: int  #: columns per matmul group (at most four PSUM banks with the widest step's row tiles)


def sbuf_ring_plan(ms: int, k: int, n: int, tp: int, channels: int, in_itemsize: int, sum_itemsize: int,
                   sbuf_bytes: int, both_ways: bool | None = None) -> ScatterRing | None:
    """The on-chip ring (`_sbuf_ring`) for a program's [ms rows, n columns] chunk and
    [k, n] weight, or None when it does not apply.

    It applies with K in whole 128-row tiles, when every chunk of the schedule and every
    received span is one SBUF view (`_fits_tiles`), a step spans at most four 128-row
    tiles, and within ``SBUF_SHARE`` of ``sbuf_bytes`` per partition fit a column block's
    resident weight ([128, K/128, N/blocks] in w's dtype), two x buffers and two partial
    buffers of the widest step and two received-sum buffers of a region per side (the
    sums in the sum dtype). The fewest column blocks that fit (each runs the whole ring
    in turn, so a block holds only its share of the weight and of the sums). A matmul
    group spans at most four PSUM banks (two groups double-buffer in the eight).

    ``both_ways`` None: both ways (`scatter_steps`) where that fits in as few column blocks
    as halves, else halves; with one channel the ring runs one way. A step both ways holds
    two chunks, so its buffers are twice as large, and each column block runs the whole
    ring: twice the blocks spend the hops both ways saves again, and each block adds a
    fill and a drain. (Measured in the simulator on the on-chip reduce-scatter rows of
    benchmarks/kernel_overlap.py, both ways against halves: with as many blocks, where
    the ring bounds the kernel both ways was faster, 70B TP64 LNC 2 197.1 us against
    235.8, TP32 LNC 2 299.1 against 317.6, and where the matmul does it was within 4 us
    either way in the other five rows; with twice the blocks, 70B TP32 LNC 1, it was 7.9
    us slower.)"""
    if both_ways is None:
        plans = [sbuf_ring_plan(ms, k, n, tp, channels, in_itemsize, sum_itemsize, sbuf_bytes, way)
                 for way in (True, False)]
        return min((p for p in plans if p is not None), key=lambda p: p.blocks, default=None)
    if k % PMAX or tp < 2:
        return None
    kt = k // PMAX
    way = bool(both_ways) and channels > 1
    steps = scatter_steps(ms, tp, channels, way)
    tms = -(-ms // PMAX)
    probe = ScatterLayout(steps, 2 if way else 1, tms * PMAX)
    views = [(ch.slot, ch.rows) for st in steps for ch in st]
    views += [(probe.recv_row(ch), ch.rows) for st in steps[:-1] for ch in st]
    views += [(d * probe.side_rows + r0, rn) for d in range(probe.sides) for r0, rn in tile_spans(ms, PMAX)]
    views += probe.zero_spans(ms)
    width = max(step_width(st) for st in steps)
    rows = -(-width // PMAX)
    if rows > 4 or not all(_fits_tiles(r, h) for r, h in views):
        return None
    for blocks in (1, 2, 4):
        nb = -(-n // blocks)
        fixed = (kt * nb + 2 * kt * width) * in_itemsize
        if fixed + 2 * (rows + probe.sides * tms) * nb * sum_itemsize <= sbuf_bytes * SBUF_SHARE:
            return ScatterRing(steps, probe.sides, probe.side_rows, blocks, min(4 * MOVING_FMAX // rows, nb))
    return None


def _sbuf_buffers(plan: ScatterRing, k: int, nb: int, dt, sdt):
    """The on-chip ring's SBUF tiles, shared by its column blocks: the weight block, two x
    buffers and two partial buffers of the widest step, two received-sum buffers (a region
    per side) and the PSUM banks."""
    kt = k // PMAX
    width = max(step_width(st) for st in plan.steps)
    rows, recv_rows = -(-width // PMAX), plan.sides * plan.side_rows // PMAX
    return (nl.ndarray((PMAX, kt, nb), dtype=dt, buffer=nl.sbuf, name="rs_w"),
            [nl.ndarray((PMAX, kt, width), dtype=dt, buffer=nl.sbuf, name=f"rs_x{i}") for i in range(2)],
            [nl.ndarray((PMAX, rows, nb), dtype=sdt, buffer=nl.sbuf, name=f"rs_sum{i}") for i in range(2)],
            [nl.ndarray((PMAX, recv_rows, nb), dtype=sdt, buffer=nl.sbuf, name=f"rs_sum{2 + i}") for i in range(2)],
            [nl.ndarray((PMAX, MOVING_FMAX), dtype=nl.float32, buffer=nl.psum, name=f"rs_ps{i}")
             for i in range(PSUM_BANKS)])


def _sbuf_ring(x_t, w, z, rg, tp: int, pos, ms: int, plan: ScatterRing, bufs, pending=(), final=True, phase=0):
    """The ring on chip for one column block of the weight: the running sums never touch HBM.

    The weight stays in SBUF. At step s the partials of the step's chunks (`scatter_steps`)
    go from PSUM into the partial buffer ``part[(phase + s) % 2]`` (a plain copy, rounded
    to the sum dtype), and one collective_permute_implicit_reduce per step sends partial +
    the sums received at step s - 1 to the next rank's ``recv[(phase + s) % 2]`` (step 0
    sends the partials alone, with collective_permute_implicit, into rows zeroed where a
    chunk arrives only in part, `ScatterLayout.zero_spans`; SBUF to SBUF, the collectives
    pages' all-on-SBUF case). The collective adds, so a step's matmuls and evacuations
    wait for no transfer: the chain from one hop to the next is the transfer alone, and
    the matmuls of step s + 1 run while step s's sums cross (``part`` is double-buffered).
    The last step adds the sums arriving from each side to its own chunk's partial (the
    Vector Engine adds in FP32, rounding each sum to the sum dtype) and stores them to z,
    the DMA converting the sum dtype to z's on the way where they differ
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
    steps, last_s = plan.steps, len(plan.steps) - 1
    w_sb, x_sb, part, recv, psum = bufs

    def load_x(s: int) -> None:
        # partition p, slot j holds contraction row p * kt + j, as for the weight (k_interleaved)
        for ch in steps[s]:
            col = chunk_owner(pos, ch, last_s - s, tp) * ms + ch.offset
            nisa.dma_copy(dst=x_sb[s % 2][0:PMAX, 0:kt, ch.slot:ch.slot + ch.rows],
                          src=k_interleaved(x_t[0:k, col:col + ch.rows], kt), name="rs_ld_x")

    def send(s: int, c0: int, c1: int) -> None:  # columns c0..c1 of step s's sums to the next rank
        chs = steps[s]
        dsts = [[_tile_view(recv[(phase + s) % 2], plan.recv_row(ch), ch.rows, c0, c1)] for ch in chs]
        mine = [[_tile_view(part[(phase + s) % 2], ch.slot, ch.rows, c0, c1)] for ch in chs]
        chans = [ch.channel for ch in chs]
        if s == 0:
            for r0, rn in plan.zero_spans(ms):
                nisa.memset(_tile_view(recv[phase % 2], r0, rn, 0, n), 0.0, engine=nisa.gpsimd_engine,
                            name="rs_zero")
            ncc.collective_permute_implicit(srcs_by_channel=mine, dsts_by_channel=dsts, replica_group=rg,
                                            channel_ids=chans, name="rs_step0")
        else:
            got = [[_tile_view(recv[(phase + s - 1) % 2], plan.recv_row(ch), ch.rows, c0, c1)] for ch in chs]
            ncc.collective_permute_implicit_reduce(
                srcs0_by_channel=mine, srcs1_by_channel=got, dsts_by_channel=dsts, replica_group=rg, op=nl.add,
                channel_ids=chans, name=f"rs_step{s}")
    load_x(0)
    for c0, cn in tile_spans(n, plan.cols):  # group by group: the first matmul waits for one group's weight
        nisa.dma_copy(dst=w_sb[0:PMAX, 0:kt, c0:c0 + cn], src=k_interleaved(w[0:k, c0:c0 + cn], kt), name="rs_ld_w")
    q = 0  # matmul groups so far: PSUM banks alternate between the two halves of the eight
    finish = []
    side_tiles = plan.side_rows // PMAX
    for s in range(len(steps)):
        if s < last_s:
            load_x(s + 1)
        last = s == last_s
        out = part[(phase + s) % 2]
        # the sums received at step s - 1, per side: (buffer, first tile of the side's region)
        gots = [(recv[(phase + s - 1) % 2], d * side_tiles) for d in range(plan.sides)]
        rows = tile_spans(step_width(steps[s]), PMAX)
        groups = tile_spans(n, plan.cols)
        # The last send goes in two column pieces, the first once its groups are evacuated:
        # the final step's first groups add what has arrived while the rest crosses (the
        # drain is then half a step's transfer). Not at step 0, which the previous block's
        # last additions (`pending`, emitted after it) must read before it is overwritten.
        split_after = len(groups) // 2 - 1 if 0 < s == last_s - 1 and len(groups) > 1 else -1
        sent = 0
        for gi, (g0, gn) in enumerate(groups):
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
                        buf, t0 = gots[0]
                        nisa.tensor_tensor(d, src, buf[0:rn, t0 + r, g0 + b0:g0 + b0 + bn], op=nl.add,
                                           engine=_add_engine(r, b), name="rs_evac_add")
                    else:
                        eng = nisa.vector_engine if (r + b) % 2 == 0 else nisa.scalar_engine
                        nisa.tensor_copy(d, src, engine=eng, name="rs_evac")
            if last:
                emit = partial(_finish_group, z, out, gots[1:] if final else gots, rows, g0, gn, banks)
                if final:
                    emit()
                else:
                    finish.append(emit)
            if gi == split_after:
                send(s, 0, g0 + gn)
                sent = g0 + gn
        if s == 0:
            for fn in pending:
                fn()
        if not last:
            send(s, sent, n)
    return finish


def _add_engine(r: int, b: int):
    """The engine of the last step's additions: Vector and GpSimd in turn (Scalar has no
    tensor_tensor)."""
    return nisa.vector_engine if (r + b) % 2 == 0 else nisa.gpsimd_engine


def _finish_group(z, out, addends, rows, g0: int, gn: int, banks) -> None:
    """The end of the on-chip ring for columns g0..g0+gn: ``out`` += each of ``addends``
    (received sums not already added at evacuation, as (buffer, first tile of the region)),
    then ``out`` to z."""
    for r, (r0, rn) in enumerate(rows):
        for buf, t0 in addends:
            for b, (b0, bn) in enumerate(banks):
                d = out[0:rn, r, g0 + b0:g0 + b0 + bn]
                nisa.tensor_tensor(d, d, buf[0:rn, t0 + r, g0 + b0:g0 + b0 + bn], op=nl.add,
                                   engine=_add_engine(r, b), name="rs_evac_add")
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
            (False); `scatter_steps`. None: `sbuf_ring_plan` decides. The HBM ring runs
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
    plan = sbuf_ring_plan(ms, k, n, tp, channels, w.dtype.itemsize, sdt.itemsize, sbuf_bytes, both_ways)
    assert not both_ways or plan is not None, (
        f"matmul_reduce_scatter: both_ways needs the on-chip ring, which M_shard={ms}, K={k}, N={n} do not take")
    if plan is not None:
        spans = unit_pieces(n, plan.cols, plan.blocks)
        bufs = _sbuf_buffers(plan, k, max(nb for _, nb in spans), w.dtype, sdt)
        pending = []
        for i, (b0, nb) in enumerate(spans):
            pending = _sbuf_ring(x_t, w_mine[0:k, b0:b0 + nb], z[0:ms, col0 + b0:col0 + b0 + nb], rg, tp, pos, ms,
                                 plan, bufs, pending, final=i == len(spans) - 1, phase=i * len(plan.steps))
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
def reduce_scatter_ring(partial, groups, channels=1, sum_dtype=None, k=None, sbuf_bytes=SBUF_TRN2, both_ways=None):
    """The collective alone: Z_shard = reduce_scatter(partial) along M over the ring.

    Args:
        partial: [M, N], this rank's partial sums, HBM.
        groups, channels, sum_dtype, sbuf_bytes: as in `matmul_reduce_scatter`.
        k: the contraction size of the fused kernel this ring stands for: with it and
            ``both_ways`` None the ring runs the schedule that kernel's plan takes
            (`sbuf_ring_plan`); without it, halves.
        both_ways: `scatter_steps`; None: as above.

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
    rg, tp, pos, ms, _ = _ring_setup(groups, m, channels, "reduce_scatter_ring")
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
    width = max(step_width(st) for st in steps)
    sent = [nl.ndarray((width, n), dtype=dt, buffer=nl.private_hbm, name=f"part{i}") for i in range(2)]
    # step 0's sums arrive in partial's dtype, later ones in the sum dtype; a region per side
    land = nl.ndarray((ring.sides * ms, n), dtype=dt, buffer=nl.private_hbm, name="land")
    acc = [nl.ndarray((ring.sides * ms, n), dtype=sdt, buffer=nl.private_hbm, name=f"acc{i}") for i in range(2)]

    def got(s: int) -> Any:  # the sums received at step s
        return land if s == 0 else acc[s % 2]
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
        mine = [[sent[s % 2][ch.slot:ch.slot + ch.rows, 0:n]] for ch in steps[s]]
        dsts = [[got(s)[ring.recv_row(ch):ring.recv_row(ch) + ch.rows, 0:n]] for ch in steps[s]]
        chans = [ch.channel for ch in steps[s]]
        if s == 0:
            ncc.collective_permute_implicit(srcs_by_channel=mine, dsts_by_channel=dsts, replica_group=rg,
                                            channel_ids=chans, name="rs_step0")
        else:
            ncc.collective_permute_implicit_reduce(
                srcs0_by_channel=mine,
                srcs1_by_channel=[[got(s - 1)[ring.recv_row(ch):ring.recv_row(ch) + ch.rows, 0:n]] for ch in steps[s]],
                dsts_by_channel=dsts, replica_group=rg, op=nl.add, channel_ids=chans, name=f"rs_step{s}")
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
                nisa.dma_copy(dst=b[0:rs, 0:cs], src=got(last_s - 1)[d * ms + r0:d * ms + r0 + rs, c0:c0 + cs],
                              name="rs_ld_acc")
                nisa.tensor_tensor(dst[0:rs, 0:cs], src[0:rs, 0:cs], b[0:rs, 0:cs], op=nl.add, name="rs_add")
                src = dst
            if not sides:
                nisa.tensor_copy(o[0:rs, 0:cs], a[0:rs, 0:cs], name="rs_copy")
            nisa.dma_copy(dst=z[r0:r0 + rs, col0 + c0:col0 + c0 + cs], src=o[0:rs, 0:cs], name="rs_st")
            i += 1
    return z


__all__ = ["matmul_reduce_scatter", "reduce_scatter_ring", "scatter_steps", "sum_dtype_for"]
