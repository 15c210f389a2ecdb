"""The reduce-scatter's ring on chip: the weight resident in SBUF, the running sums moving
SBUF to SBUF, never through HBM (`matmul_reduce_scatter` takes it where it fits: small
chunks at large TP degrees).

- `sbuf_ring_plan`: whether it applies, its schedule (`ring.scatter_steps`, both ways or
  halves), column blocks and matmul groups.
- `sbuf_buffers`, `sbuf_ring`: its tiles and one column block's loop.

`sbuf_ring` runs past 100 lines: one NKI program, as nki-library writes its kernels, so
the ring's steps read in the order the engines issue them; its plan and buffers are the
functions above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from trnopt.kernels.nki_api import ncc, nisa, nl
from trnopt.kernels.ring import ScatterLayout, chunk_owner, scatter_steps, step_width
from trnopt.kernels.tiling import MOVING_FMAX, PMAX, PSUM_BANKS, SBUF_SHARE, k_interleaved, tile_spans


def _fits_tiles(row: int, rows: int) -> bool:
    """Whether rows ``row..row+rows`` of a [128, tiles, n] SBUF buffer are one view: within
    one 128-row tile, or whole tiles."""
    return row // PMAX == (row + rows - 1) // PMAX or (row % PMAX == 0 and rows % PMAX == 0)


def _tile_view(t: Any, row: int, rows: int, c0: int, c1: int) -> Any:
    """Rows ``row..row+rows`` (`_fits_tiles`), columns c0..c1 of a [128, tiles, n] SBUF buffer."""
    r, p0 = divmod(row, PMAX)
    return t[p0:p0 + rows, r, c0:c1] if p0 + rows <= PMAX else t[0:PMAX, r:r + rows // PMAX, c0:c1]


@dataclass(frozen=True)
class ScatterRing(ScatterLayout):
    """The on-chip reduce-scatter ring of one program (`sbuf_ring_plan`); its sides' regions
    start on whole 128-row tiles."""

    blocks: int  #: column blocks of the weight, each running the whole ring in turn
    cols: int  #: columns per matmul group (at most four PSUM banks with the widest step's row tiles)


def sbuf_ring_plan(ms: int, k: int, n: int, tp: int, channels: int, in_itemsize: int, sum_itemsize: int,
                   sbuf_bytes: int, both_ways: bool | None = None) -> ScatterRing | None:
    """The on-chip ring (`sbuf_ring`) for a program's [ms rows, n columns] chunk and
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


def sbuf_buffers(plan: ScatterRing, k: int, nb: int, dt, sdt):
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


def sbuf_ring(x_t, w, z, rg, tp: int, pos, ms: int, plan: ScatterRing, bufs, pending=(), final=True, phase=0):
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

    Column blocks run one after the other on the same tiles (``bufs``, `sbuf_buffers`);
    ``phase``, the ring steps of the blocks before, keeps the buffers alternating across
    them. The ``final`` block adds at evacuation, from PSUM. Any other evacuates its last
    step like the others and returns the additions and stores as callables, which the next
    block emits (``pending``) after its first step's evacuations: emitted in place, they
    wait for the last sums to arrive and hold the PSUM banks, so the next block's matmuls
    would wait for the ring's last hop too (12 us a block at 70B TP16 LNC 1 on one
    channel)."""
    # ~115 lines, 30 of them docstring: one loop nest whose loads, matmuls, evacuations and
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
