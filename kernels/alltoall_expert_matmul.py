"""Expert-parallel MoE layer body: all-to-all dispatch, grouped matmul per expert, all-to-all combine.

The tokens a rank routes to the experts of the EP group arrive packed in capacity slots
(`pack_dispatch`): for every destination rank and each of its local experts, C slots of
tokens (K-major: hidden on the partition axis, as TensorE consumes them), cut along C into
S sub-chunks. The kernel pipelines over the sub-chunks: the dispatch all-to-all of
sub-chunk s + 1 (issued one ahead) and the combine all-to-all of sub-chunk s - 1 run while
the experts multiply sub-chunk s. The exchanges run on ncc.all_to_all (`_AllToAll`) or on
the two directions of the EP group's ring (`_Ring`, `trnopt.kernels.ring_alltoall`).

Kernels here (references in `trnopt.kernels.references`, the router side in
`trnopt.kernels.routing`):
- `alltoall_expert_matmul`: the fused pipelined kernel.
- `expert_alltoall`: dispatch and combine all-to-alls of the same sizes, no matmul (the
  collective alone).
- `grouped_expert_matmul`: the grouped matmul alone on local data (the undecomposed matmul).

`alltoall_expert_matmul` runs past 100 lines (48 of them its Dimensions/Args/Returns
docstring): one NKI program, as nki-library writes its kernels, so the schedule reads in the
order the engines issue it; its checks, tiling and call plans are the functions above it.
"""

from __future__ import annotations

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.references import alltoall_expert_matmul_reference, alltoall_reference  # noqa: F401
from trnopt.kernels.ring import SLAB_BYTES, burst_bytes, program_share, replica_group, ring_setup
from trnopt.kernels.ring_alltoall import RingExchange, destination, pieces, ring_all_to_all, steps
from trnopt.kernels.routing import pack_dispatch, unpack_combine  # noqa: F401
from trnopt.kernels.tiling import (MOVING_FMAX, PMAX, SBUF_TRN2, STATIONARY_FMAX, MatmulPipeline, RowBlock,
                                   choose_tiling, unit_pieces)


def _check_shapes(x_disp, w, groups) -> tuple:
    assert len(x_disp.shape) == 5, (
        f"x_disp must be [S, ep, E_local, H, C], got shape {tuple(x_disp.shape)}")
    assert len(w.shape) == 3, f"w must be [E_local, H, F], got shape {tuple(w.shape)}"
    s, ep, el, h, c = x_disp.shape
    el2, h2, f = w.shape
    assert (el, h) == (el2, h2), (
        f"x_disp is [S={s}, ep={ep}, E_local={el}, H={h}, C={c}] but w is [E_local={el2}, H={h2}, F={f}]")
    assert x_disp.dtype == w.dtype, f"x_disp dtype {x_disp.dtype} != w dtype {w.dtype}"
    sizes = {len(g) for g in groups}
    assert sizes == {ep}, f"every rank-list must hold ep={ep} ranks, got sizes {[len(g) for g in groups]}"
    return s, ep, el, h, c, f


def expert_tiling(ep: int, c: int, h: int, f: int, dt, sbuf_bytes: int):
    """``(tiling, blocks per call)``: the per-expert matmul over ep blocks of C rows goes in
    calls of one PSUM row group (up to m_tiles x 128 rows) each, so that a call's x stays in
    SBUF (``resident_x``) and the weight streams once per call: with several row groups
    per call x would be re-read for every column group and W for every row group, DMA
    traffic that competes with the all-to-alls for the core's DMA bandwidth."""
    m_t = choose_tiling(ep * c, h, f, dt.itemsize, dt.itemsize, sbuf_bytes=sbuf_bytes).m_tiles
    per_call = max(1, min(ep, m_t * STATIONARY_FMAX // c))
    return choose_tiling(per_call * c, h, f, dt.itemsize, dt.itemsize, sbuf_bytes=sbuf_bytes), per_call


def _calls(ep: int, per_call: int) -> list[range]:
    return [range(j0, min(ep, j0 + per_call)) for j0 in range(0, ep, per_call)]


def _row_calls(blocks: list, rows: int) -> list[list]:
    """Consecutive blocks in calls of at most ``rows`` rows (a block alone if larger)."""
    calls: list[list] = []
    for b in blocks:
        if calls and sum(x.rows for x in calls[-1]) + b.rows <= rows:
            calls[-1].append(b)
        else:
            calls.append([b])
    return calls


class _AllToAll:
    """The exchanges on ``ncc.all_to_all`` (collective_dim 0): whole blocks by list position.

    x_disp is an HBM input: all_to_all may read it in place (its page asks only for HBM
    tensors, all srcs alike); only kernel outputs stay out of collectives, so the combine
    lands in a buffer and is copied into y."""

    def __init__(self, x_disp, y, groups, c0, c, dt, pipe, call_rows):
        s_n, ep, el, h, _ = x_disp.shape
        f = y.shape[4]
        self.x_disp, self.y, self.c0, self.c, self.defer, self.ep, self.el = x_disp, y, c0, c, pipe.defer, ep, el
        self.rg, _ = replica_group(groups, 1, "alltoall_expert_matmul")
        self.recv = nl.ndarray((s_n, ep, el, h, c), dtype=dt, buffer=nl.private_hbm, name="a2a_recv")
        self.res = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.private_hbm, name="a2a_res")
        self.back = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.private_hbm, name="a2a_back")
        self.copies = ep  # copies into y per combine
        self.own_first = False  # every block, the own one too, comes through the all-to-all

    def dispatch(self, s: int, k0: int, kl: int) -> None:
        ep, el, c0, c = self.ep, self.el, self.c0, self.c
        ncc.all_to_all(srcs=[self.x_disp[s][0:ep, 0:el, k0:k0 + kl, c0:c0 + c]],
                       dsts=[self.recv[s][0:ep, 0:el, k0:k0 + kl, 0:c]], replica_group=self.rg, collective_dim=0,
                       name=f"dispatch{s}")

    def blocks(self, s: int, e: int) -> list:
        return [RowBlock(self.recv[s, j, e], self.res[s, j, e]) for j in range(self.ep)]

    def combine(self, s: int, e: int, n0: int, nc: int) -> None:
        c0, c = self.c0, self.c
        ncc.all_to_all(srcs=[self.res[s][0:self.ep, e:e + 1, 0:c, n0:n0 + nc]],
                       dsts=[self.back[s][0:self.ep, e:e + 1, 0:c, n0:n0 + nc]],
                       replica_group=self.rg, collective_dim=0, name=f"combine{s}")
        for j in range(self.ep):
            self.defer(lambda j=j: nisa.dma_copy(dst=self.y[s, j, e][c0:c0 + c, n0:n0 + nc],
                                                 src=self.back[s, j, e][0:c, n0:n0 + nc], name="a2a_out"))


class _Ring:
    """The exchanges on the ring's two directions (`ring_alltoall`): pieces of half a
    block's C slots, store and forward.

    The own block never moves: the matmul reads it from x_disp and writes y. The others
    arrive in the dispatch's step buffers, where the matmul reads them in place, and its
    results go straight into the combine's stage, which returns each piece the way it
    came (`RingExchange` with lists (1, 0)); only the stage of the dispatch and the
    combine's arrivals are copied, from and to the positions the ring position names."""

    def __init__(self, x_disp, y, groups, c0, c, dt, pipe, call_rows):
        s_n, ep, el, h, _ = x_disp.shape
        f = y.shape[4]
        self.x_disp, self.y, self.c0, self.c, self.defer, self.ep, self.el = x_disp, y, c0, c, pipe.defer, ep, el
        self.burst = burst_bytes(call_rows, pipe.t.k_block, pipe.ncols)  # per channel, per combine step piece
        rg, _, self.pos = ring_setup(groups, 2, "alltoall_expert_matmul")
        assert c % 2 == 0, (
            f"alltoall_expert_matmul: channels=2 sends half of each block's C slots each way; expected an even "
            f"number of slots per core, got {c}")
        self.disp = RingExchange(ep, rg, s_n, (el, h, c), 2, dt, "disp")
        self.comb = RingExchange(ep, rg, s_n, (el, c, f), 1, dt, "comb", lists=(1, 0))
        self.copies = 2 * steps(ep)  # copies into y per combine: a block's two halves in one
        self.own_first = True  # the first call is the own block, read in place

    def dispatch(self, s: int, k0: int, kl: int) -> None:
        box = (None, slice(k0, k0 + kl), None)
        for d in range(2):
            for i, p in enumerate(pieces(self.ep, d)):
                j = destination(self.pos, self.ep, d, p.distance)
                src = self.disp.cut(lambda cut, j=j: self.x_disp[s, j][0:self.el, k0:k0 + kl,
                                                                       self.c0 + cut.start:self.c0 + cut.stop], p)
                nisa.dma_copy(dst=self.disp.stage(d, s, i, box), src=src, name="ring_stage")
        self.disp.run(s, box, f"dispatch{s}")

    def blocks(self, s: int, e: int) -> list:
        whole = (None, None, None)
        c0, c, pos = self.c0, self.c, self.pos
        h, f = self.x_disp.shape[3], self.y.shape[4]
        out = [RowBlock(self.x_disp[s, pos, e][0:h, c0:c0 + c], self.y[s, pos, e][c0:c0 + c, 0:f])]
        arrived = sorted(((t, d, p, view) for d in range(2) for t, p, view in self.disp.arrivals(d, s, whole)),
                         key=lambda a: a[:2])  # by step, then direction; stable within a direction
        for t, d, p, view in arrived:
            out.append(RowBlock(view[e], self.comb.stage(d, s, pieces(self.ep, d).index(p), whole)[e]))
        return out

    def combine(self, s: int, e: int, n0: int, nc: int) -> None:
        box = (slice(e, e + 1), None, slice(n0, n0 + nc))
        for t in range(1, steps(self.ep) + 1):
            per_col = self.comb.bufs[0][t].shape[1] * (self.c // 2) * self.y.dtype.itemsize  # bytes per column
            wide = max(1, self.burst // per_col)
            for a in range(n0, n0 + nc, wide):
                sub = (box[0], None, slice(a, min(n0 + nc, a + wide)))
                self.defer(lambda t=t, sub=sub: self.comb.step(s, sub, t, f"combine{s}"))
        hc = self.c // 2
        for d in range(2):
            for t in range(1, steps(self.ep) + 1):
                ps, view = self.comb.landed(d, s, t, (e, None, slice(n0, n0 + nc)))
                j = destination(self.pos, self.ep, d, t)  # where the dispatch sent these pieces
                a = self.c0 + ps[0].half * hc
                dst = self.y[s, j, e][a:a + len(ps) * hc, n0:n0 + nc].reshape_dim(0, (len(ps), hc))
                self.defer(lambda dst=dst, view=view: nisa.dma_copy(dst=dst, src=view, name="ring_out"))


@nki.jit
def alltoall_expert_matmul(x_disp, w, groups, channels=1, sbuf_bytes=SBUF_TRN2):
    """Dispatch tokens to their experts' ranks, multiply per local expert, combine back.

    Dimensions:
        ep: ranks in the rank-list (the EP group); E_local experts per rank (expert g lives
        on list position g // E_local as local expert g % E_local); H hidden size; F expert
        output size; C capacity slots per (destination rank, expert) per sub-chunk; S
        sub-chunks of the pipeline.

    Args:
        x_disp: [S, ep, E_local, H, C], this rank's tokens in dispatch order:
            x_disp[s, j, e, :, c] is slot c of sub-chunk s for local expert e of list
            position j (K-major: H first), HBM, bfloat16 or float32.
        w: [E_local, H, F], this rank's experts, HBM, same dtype.
        groups: replica groups (disjoint rank-lists of ep ranks each); list order is the
            all-to-all order.
        channels: 1: the exchanges on ncc.all_to_all (it has no channel: the runtime
            drives the links); 2: on the ring's two directions, channels 0 and 1 of
            collective_permute_implicit (`trnopt.kernels.ring_alltoall`), for an EP group
            laid along a ring; each block's C slots per core must then be even (half goes
            each way to the rank opposite).
        sbuf_bytes: SBUF bytes per partition of the target chip (the tiling's budget).

    Returns:
        y: [S, ep, E_local, C, F] in w's dtype, shared HBM: y[s, j, e] is the expert output
        of this rank's slots x_disp[s, j, e], computed on list position j.

    Decomposition: all_to_all (collective_dim 0) of sub-chunk s moves x_disp[s, j] to list
    position j; the receiver runs, per local expert e, one `MatmulPipeline` over the ep
    source blocks recv[s, :, e] ([H, C] each) against w[e]; all_to_all of the results
    returns them. The dispatch of sub-chunk s + 1 goes slab by slab over the first half of
    the matmul of s (sub-chunk 0's K block by K block ahead of its first loads); the
    combine of (s, e) goes in column slabs as the matmul evacuates them, and each slab's
    copy into y (a kernel output stays out of collectives) follows it: the collective
    engine never waits on the matmul it should overlap, and no collective holds the DMA
    bandwidth for long.

    With channels=2 the own block is not exchanged (the matmul reads it in x_disp and writes
    y), the others arrive in halves, step by step, in the ring's buffers where the matmul
    reads them, and their results go straight into the combine's stage. The very first call
    is the own block alone, beside sub-chunk 0's dispatch (sub-chunk 1's beside the next
    call). Each combine step goes in column pieces of `ring.burst_bytes` per channel, one
    per K-block iteration: the two directions together outrun the core's DMA (2 x 256
    against 368 GB/s), and a longer step would hold the weight loads back.

    Preconditions: shapes as above with matching E_local, H and dtype; every rank-list of
    size ep; LNC 1 or 2 (at LNC 2 each physical core takes half of every block's C slots,
    dispatching, multiplying and combining them on its own: `ring.program_share`).
    """
    # ~120 lines with the docstring, ~65 of schedule: one pipeline whose dispatch, matmul and
    # combine interleave step by step (the exchanges themselves are `_AllToAll` / `_Ring`);
    # split, each piece would take the whole state as arguments
    s_n, ep, el, h, c_all, f = _check_shapes(x_disp, w, groups)
    c0, c = program_share(c_all, "alltoall_expert_matmul")  # this physical core's slots c0..c0+c
    assert channels in (1, 2), (
        f"alltoall_expert_matmul: channels must be 1 (ncc.all_to_all) or 2 (the ring's two directions), "
        f"got {channels}")
    dt = w.dtype
    y = nl.ndarray((s_n, ep, el, c_all, f), dtype=dt, buffer=nl.shared_hbm, name="y")
    tiling, per_call = expert_tiling(ep, c, h, f, dt, sbuf_bytes)
    pipe = MatmulPipeline(h, f, dt, dt, tiling, name="moe")
    ex = (_AllToAll if channels == 1 else _Ring)(x_disp, y, groups, c0, c, dt, pipe, per_call * c)
    # The dispatch goes in slabs of about SLAB_BYTES per rank (H rows), each a side action of
    # a matmul call: a large collective would take the shared DMA bandwidth from the
    # matmul's loads for long. The first sub-chunk's dispatch goes one K block of the
    # pipeline at a time, each just ahead of the loads that read it, so the first matmul
    # waits for one slab, not for the whole sub-chunk.
    k_slabs = unit_pieces(h, PMAX, -(-ep * el * h * c * dt.itemsize // (8 * SLAB_BYTES)))
    k_first = [(tiles[0][0], sum(ks for _, ks in tiles)) for _, tiles in pipe.k_blocks]
    # The combine goes per expert in column slabs (F) of whole column groups, each sent as
    # soon as the expert's last call has evacuated those columns of every row (column
    # groups run left to right, n_outer): the last sub-chunk's combine overlaps its own
    # matmul.
    # A slab's exchange and its copies into y are deferred one per K-block iteration
    # (`MatmulPipeline.defer`): a burst of copies would hold back the weight loads of the
    # next K block (double-buffered, so their slack is one K block of matmul). A slab spans
    # enough column groups that its copies and the exchange's first item fit the iterations
    # the groups give (the ring's later combine pieces run on into the next groups').
    group_cols = tiling.n_tiles * MOVING_FMAX
    slots = max(1, len(pipe.k_blocks) - 1)  # deferred items per column group (one per iteration after the first)
    groups = -(-f // group_cols)
    per_slab = max(-(-(ex.copies + 1) // slots), -(-groups // max(1, -(-ep * c * f * dt.itemsize // (8 * SLAB_BYTES)))))
    f_slabs = unit_pieces(f, group_cols, -(-groups // per_slab))

    def combiner(s: int, e: int):
        todo = list(f_slabs)

        def on_evac(n0: int, ncols: int) -> None:
            while todo and todo[0][0] + todo[0][1] <= n0 + ncols:
                sl = todo.pop(0)
                pipe.defer(lambda sl=sl: ex.combine(s, e, *sl))
        return on_evac

    def dispatches(s: int) -> list:
        return [lambda s=s, k0=k0, kl=kl: ex.dispatch(s, k0, kl) for k0, kl in k_slabs] if s < s_n else []

    for s in range(s_n):
        for e in range(el):
            blocks = ex.blocks(s, e)
            # the ring's first call is its own block alone (read in place, it needs no dispatch)
            calls = [blocks[:1]] + _row_calls(blocks[1:], per_call * c) if ex.own_first and s == e == 0 else \
                _row_calls(blocks, per_call * c)
            for i, blocks in enumerate(calls):
                first, last = i == 0, i == len(calls) - 1
                # the next sub-chunk's dispatch over the first half of this one's first call
                side = dispatches(s + 1) if e == 0 and first else []
                lead = []
                if s == 0 and e == 0 and i < 2 and ex.own_first:
                    # the ring's first call is the own block alone: sub-chunk 0's dispatch rides
                    # beside it, and sub-chunk 1's beside the next call
                    side = dispatches(i)
                elif s == 0 and e == 0 and first:
                    lead = [lambda k0=k0, kl=kl: ex.dispatch(0, k0, kl) for k0, kl in k_first]
                pipe(blocks, w[e], side=side, lead=lead, w_key=e, n_outer=True, flush=False,
                     on_evac=combiner(s, e) if last else None)
    pipe.flush()
    return y


@nki.jit
def expert_alltoall(x_disp, y_local, groups, channels=1):
    """The collectives alone: the dispatch all-to-all of x_disp and the combine of y_local.

    Args:
        x_disp: [S, ep, E_local, H, C] as in `alltoall_expert_matmul`.
        y_local: [S, ep, E_local, C, F], expert outputs to return to their source ranks.
        groups: replica groups (rank-lists of ep ranks).
        channels: as in `alltoall_expert_matmul`.

    Returns:
        (recv_x, recv_y): x_disp and y_local after one all_to_all each (collective_dim 0):
        recv_x[s, j] is list position j's x_disp[s, me], likewise recv_y. Shared HBM.
    """
    assert len(x_disp.shape) == 5 and len(y_local.shape) == 5, (
        f"x_disp and y_local must be 5-D, got {tuple(x_disp.shape)} and {tuple(y_local.shape)}")
    s_n, ep = x_disp.shape[0], x_disp.shape[1]
    assert tuple(y_local.shape[:3]) == tuple(x_disp.shape[:3]), (
        f"y_local {tuple(y_local.shape)} and x_disp {tuple(x_disp.shape)} disagree on [S, ep, E_local]")
    assert {len(g) for g in groups} == {ep}, f"every rank-list must hold ep={ep} ranks"
    assert channels in (1, 2), f"expert_alltoall: channels must be 1 or 2, got {channels}"
    c0, c = program_share(x_disp.shape[4], "expert_alltoall")  # as the fused kernel splits the slots
    outs = []
    for src, tag, axis in ((x_disp, "x", 4), (y_local, "y", 3)):
        shape = tuple(c if i == axis else d for i, d in enumerate(src.shape))
        out = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.shared_hbm, name=f"out_{tag}")

        def mine(t, s, j=None, cut=slice(0, c), axis=axis):
            lo, hi = c0 + cut.start, c0 + cut.stop
            if j is None:
                return t[s, 0:ep, 0:t.shape[2], :, lo:hi] if axis == 4 else t[s, 0:ep, 0:t.shape[2], lo:hi, :]
            return t[s, j][0:t.shape[2], :, lo:hi] if axis == 4 else t[s, j][0:t.shape[2], lo:hi, :]
        if channels == 2:  # the fused kernel's ring (`ring_alltoall`), whole blocks per sub-chunk
            rg, _, pos = ring_setup(groups, 2, "expert_alltoall")
            ex = RingExchange(ep, rg, s_n, shape[2:], axis - 2, src.dtype, f"ring_{tag}")
            for s in range(s_n):
                ring_all_to_all(src, out, ex, s, pos, lambda t, j, cut, s=s: mine(t, s, j, cut), f"a2a_{tag}{s}")
        else:
            rg, _ = replica_group(groups, channels, "expert_alltoall")
            send = nl.ndarray(shape[1:], dtype=src.dtype, buffer=nl.private_hbm, name=f"send_{tag}")
            recv = nl.ndarray(shape[1:], dtype=src.dtype, buffer=nl.private_hbm, name=f"recv_{tag}")
            for s in range(s_n):
                nisa.dma_copy(dst=send, src=mine(src, s), name=f"stage_{tag}")
                ncc.all_to_all(srcs=[send], dsts=[recv], replica_group=rg, collective_dim=0, name=f"a2a_{tag}{s}")
                nisa.dma_copy(dst=mine(out, s), src=recv, name=f"out_{tag}")
        outs.append(out)
    return outs[0], outs[1]


@nki.jit
def grouped_expert_matmul(x_grouped, w, sbuf_bytes=SBUF_TRN2):
    """The grouped matmul alone: y[s, j, e] = x_grouped[s, j, e].T @ w[e], no communication.

    Args:
        x_grouped: [S, ep, E_local, H, C], token blocks already on this rank, HBM.
        w: [E_local, H, F], HBM, same dtype.
        sbuf_bytes: SBUF bytes per partition of the target chip.

    Returns:
        y: [S, ep, E_local, C, F] in w's dtype, shared HBM (same tiling and calls as the
        fused kernel, `expert_tiling`).
    """
    assert len(x_grouped.shape) == 5 and len(w.shape) == 3, (
        f"x_grouped must be 5-D and w 3-D, got {tuple(x_grouped.shape)} and {tuple(w.shape)}")
    s_n, ep, el, h, c = x_grouped.shape
    assert tuple(w.shape[:2]) == (el, h), f"w {tuple(w.shape)} does not match x_grouped {tuple(x_grouped.shape)}"
    assert x_grouped.dtype == w.dtype, f"x_grouped dtype {x_grouped.dtype} != w dtype {w.dtype}"
    f = w.shape[2]
    dt = w.dtype
    y = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.shared_hbm, name="y")
    c0, cm = program_share(c, "grouped_expert_matmul")  # as the fused kernel splits the slots
    tiling, per_call = expert_tiling(ep, cm, h, f, dt, sbuf_bytes)
    pipe = MatmulPipeline(h, f, dt, dt, tiling, name="moe")
    for s in range(s_n):
        for e in range(el):
            for js in _calls(ep, per_call):
                pipe([RowBlock(x_grouped[s, j, e][0:h, c0:c0 + cm], y[s, j, e][c0:c0 + cm, 0:f]) for j in js],
                     w[e], w_key=e)
    return y


__all__ = ["alltoall_expert_matmul", "expert_alltoall", "grouped_expert_matmul"]
