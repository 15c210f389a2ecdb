"""Expert-parallel MoE layer body: all-to-all dispatch, grouped matmul per expert, all-to-all combine.

The tokens a rank routes to the experts of the EP group arrive packed in capacity slots
(`pack_dispatch`): for every destination rank and each of its local experts, C slots of
tokens (K-major: hidden on the partition axis, as TensorE consumes them), cut along C into
S sub-chunks. The kernel pipelines over the sub-chunks: the dispatch all-to-all of
sub-chunk s + 1 (issued one ahead) and the combine all-to-all of sub-chunk s - 1 run while
the experts multiply sub-chunk s.

Kernels here:
- `alltoall_expert_matmul`: the fused pipelined kernel.
- `expert_alltoall`: dispatch and combine all-to-alls of the same sizes, no matmul (the
  collective alone).
- `grouped_expert_matmul`: the grouped matmul alone on local data (the undecomposed matmul).
- `alltoall_expert_matmul_reference`, `alltoall_reference`, `pack_dispatch`,
  `unpack_combine`, `moe_reference`: NumPy side.
- `alltoall_expert_matmul_timings`: T_mm / T_cc / T_f and the overlap ratios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.tiling import PMAX, MatmulPipeline, RowBlock, choose_tiling, unit_pieces


def _my_ring(groups: Sequence[Sequence[int]], me: int) -> list[int]:
    for g in groups:
        if me in g:
            return list(g)
    raise AssertionError(f"rank {me} is in no rank-list of replica groups {[list(g) for g in groups]}")


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
    assert nl.num_programs() == 1, f"expert kernels run one program per rank (LNC 1), got {nl.num_programs()}"
    return s, ep, el, h, c, f


@nki.jit
def alltoall_expert_matmul(x_disp, w, groups):
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

    Returns:
        y: [S, ep, E_local, C, F] in w's dtype, shared HBM: y[s, j, e] is the expert output
        of this rank's slots x_disp[s, j, e], computed on list position j.

    Decomposition: all_to_all (collective_dim 0) of sub-chunk s moves x_disp[s, j] to list
    position j; the receiver runs, per local expert e, one `MatmulPipeline` over the ep
    source blocks recv[s, :, e] ([H, C] each) against w[e]; all_to_all of the results
    returns them. The staging copy of sub-chunk s + 1 (collectives never touch kernel
    inputs) is spread over the matmul of s, and its dispatch is issued before the combine
    of s, so that the collective engine never waits on the matmul it should overlap.

    Preconditions: shapes as above with matching E_local, H and dtype; every rank-list of
    size ep; LNC 1.
    """
    s_n, ep, el, h, c, f = _check_shapes(x_disp, w, groups)
    rg = ncc.ReplicaGroup([list(g) for g in groups])
    dt = w.dtype
    y = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.shared_hbm, name="y")
    send = nl.ndarray((s_n, ep, el, h, c), dtype=dt, buffer=nl.private_hbm, name="a2a_send")
    recv = nl.ndarray((s_n, ep, el, h, c), dtype=dt, buffer=nl.private_hbm, name="a2a_recv")
    res = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.private_hbm, name="a2a_res")
    back = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.private_hbm, name="a2a_back")
    def dispatch(s: int) -> None:
        ncc.all_to_all(srcs=[send[s]], dsts=[recv[s]], replica_group=rg, collective_dim=0, name=f"dispatch{s}")

    tiling = choose_tiling(ep * c, h, f, dt.itemsize, dt.itemsize)
    pipe = MatmulPipeline(h, f, dt, dt, tiling, name="moe")
    # Copies spread over a matmul go in slabs small enough to sit in the DMA slack of one
    # K block: about one per K-block iteration of half a sub-chunk's matmul.
    n_slabs = max(1, pipe.iterations([c] * ep) * el // (2 * ep * el))
    k_slabs = unit_pieces(h, PMAX, n_slabs)
    c_slabs = unit_pieces(c, 1, n_slabs)

    def staging(s: int) -> list:
        # collectives never touch kernel inputs: copy sub-chunk s into the send buffer
        return [(send[s, j, e][k0:k0 + kl, 0:c], x_disp[s, j, e][k0:k0 + kl, 0:c])
                for j in range(ep) for e in range(el) for k0, kl in k_slabs]

    def output(s: int) -> list:
        return [(y[s, j, e][c0:c0 + cl, 0:f], back[s, j, e][c0:c0 + cl, 0:f])
                for j in range(ep) for e in range(el) for c0, cl in c_slabs]

    for dst, src in staging(0):
        nisa.dma_copy(dst=dst, src=src, name="a2a_stage")
    dispatch(0)
    for s in range(s_n):
        for e in range(el):
            side = staging(s + 1) if e == 0 and s + 1 < s_n else []
            # the previous sub-chunk's results, in the second half, once its combine is through
            late = output(s - 1) if e == el - 1 and s > 0 else []
            pipe([RowBlock(recv[s, j, e], res[s, j, e]) for j in range(ep)], w[e], side=side, late=late)
        if s + 1 < s_n:
            dispatch(s + 1)
        ncc.all_to_all(srcs=[res[s]], dsts=[back[s]], replica_group=rg, collective_dim=0, name=f"combine{s}")
    for dst, src in output(s_n - 1):
        nisa.dma_copy(dst=dst, src=src, name="a2a_out")
    return y


@nki.jit
def expert_alltoall(x_disp, y_local, groups):
    """The collectives alone: the dispatch all-to-all of x_disp and the combine of y_local.

    Args:
        x_disp: [S, ep, E_local, H, C] as in `alltoall_expert_matmul`.
        y_local: [S, ep, E_local, C, F], expert outputs to return to their source ranks.
        groups: replica groups (rank-lists of ep ranks).

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
    assert nl.num_programs() == 1, f"expert_alltoall runs one program per rank (LNC 1), got {nl.num_programs()}"
    rg = ncc.ReplicaGroup([list(g) for g in groups])
    outs = []
    for src, tag in ((x_disp, "x"), (y_local, "y")):
        send = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.private_hbm, name=f"send_{tag}")
        recv = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.private_hbm, name=f"recv_{tag}")
        out = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.shared_hbm, name=f"out_{tag}")
        for s in range(s_n):
            nisa.dma_copy(dst=send[s], src=src[s], name=f"stage_{tag}")
            ncc.all_to_all(srcs=[send[s]], dsts=[recv[s]], replica_group=rg, collective_dim=0, name=f"a2a_{tag}{s}")
            nisa.dma_copy(dst=out[s], src=recv[s], name=f"out_{tag}")
        outs.append(out)
    return outs[0], outs[1]


@nki.jit
def grouped_expert_matmul(x_grouped, w):
    """The grouped matmul alone: y[s, j, e] = x_grouped[s, j, e].T @ w[e], no communication.

    Args:
        x_grouped: [S, ep, E_local, H, C], token blocks already on this rank, HBM.
        w: [E_local, H, F], HBM, same dtype.

    Returns:
        y: [S, ep, E_local, C, F] in w's dtype, shared HBM (same tiling as the fused kernel).
    """
    assert len(x_grouped.shape) == 5 and len(w.shape) == 3, (
        f"x_grouped must be 5-D and w 3-D, got {tuple(x_grouped.shape)} and {tuple(w.shape)}")
    s_n, ep, el, h, c = x_grouped.shape
    assert tuple(w.shape[:2]) == (el, h), f"w {tuple(w.shape)} does not match x_grouped {tuple(x_grouped.shape)}"
    assert x_grouped.dtype == w.dtype, f"x_grouped dtype {x_grouped.dtype} != w dtype {w.dtype}"
    f = w.shape[2]
    dt = w.dtype
    y = nl.ndarray((s_n, ep, el, c, f), dtype=dt, buffer=nl.shared_hbm, name="y")
    pipe = MatmulPipeline(h, f, dt, dt, choose_tiling(ep * c, h, f, dt.itemsize, dt.itemsize), name="moe")
    for s in range(s_n):
        for e in range(el):
            pipe([RowBlock(x_grouped[s, j, e], y[s, j, e]) for j in range(ep)], w[e])
    return y


# --- NumPy side -----------------------------------------------------------------------------

def alltoall_reference(per_rank: Sequence[np.ndarray]) -> list[np.ndarray]:
    """NumPy all_to_all along dim 1 of [S, ep, ...] tensors: out[r][s, j] = per_rank[j][s, r]."""
    n = len(per_rank)
    return [np.stack([np.asarray(per_rank[j])[:, r] for j in range(n)], axis=1) for r in range(n)]


def alltoall_expert_matmul_reference(x_disp: Sequence[np.ndarray], w: Sequence[np.ndarray], *,
                                     out_dtype: Any = None) -> list[np.ndarray]:
    """NumPy reference of `alltoall_expert_matmul` for a whole rank-list.

    Args:
        x_disp: per list position, [S, ep, E_local, H, C]; w: per list position, [E_local, H, F].

    Returns:
        per list position r, y[s, j, e] = x_disp[r][s, j, e].T @ w[j][e] (float64, rounded once).
    """
    dt = out_dtype or np.asarray(w[0]).dtype
    out = []
    for xr in x_disp:
        xr = np.asarray(xr, dtype=np.float64)
        s_n, ep, el, _, c = xr.shape
        f = np.asarray(w[0]).shape[2]
        y = np.empty((s_n, ep, el, c, f))
        for j in range(ep):
            wj = np.asarray(w[j], dtype=np.float64)
            for e in range(el):
                y[:, j, e] = np.einsum("shc,hf->scf", xr[:, j, e], wj[e])
        out.append(y.astype(dt))
    return out


@dataclass(frozen=True)
class DispatchPlan:
    """Where each (token, choice) went: ``slot[t, k] = (s, j, e, c)`` or None when dropped."""

    slot: list
    n_sub: int
    ep: int
    e_local: int
    c_sub: int


def pack_dispatch(tokens: np.ndarray, expert_ids: np.ndarray, *, ep: int, e_local: int, capacity: int,
                  n_sub: int = 1) -> tuple[np.ndarray, DispatchPlan]:
    """Pack one rank's tokens into the kernel's dispatch layout.

    Args:
        tokens: [T, H]. expert_ids: [T, topk] global expert ids in [0, ep * e_local).
        capacity: slots per (destination rank, expert) in all, divisible by n_sub; tokens
            beyond it are dropped (their slot is None); empty slots hold zeros.

    Returns:
        (x_disp [n_sub, ep, e_local, H, capacity / n_sub], plan). Slots fill in token order,
        sub-chunk after sub-chunk.
    """
    t_n, h = tokens.shape
    assert capacity % n_sub == 0, f"capacity {capacity} must be divisible by n_sub {n_sub}"
    c_sub = capacity // n_sub
    x = np.zeros((n_sub, ep, e_local, h, c_sub), dtype=tokens.dtype)
    fill = np.zeros((ep, e_local), dtype=int)
    ids = np.asarray(expert_ids).reshape(t_n, -1)
    slot: list = [[None] * ids.shape[1] for _ in range(t_n)]
    for t in range(t_n):
        for k, g in enumerate(ids[t]):
            assert 0 <= g < ep * e_local, f"expert id {g} of token {t} outside [0, {ep * e_local})"
            j, e = divmod(int(g), e_local)
            n = fill[j, e]
            if n >= capacity:
                continue
            s, c = divmod(int(n), c_sub)
            x[s, j, e, :, c] = tokens[t]
            slot[t][k] = (s, j, e, c)
            fill[j, e] += 1
    return x, DispatchPlan(slot, n_sub, ep, e_local, c_sub)


def unpack_combine(y: np.ndarray, plan: DispatchPlan, gates: np.ndarray) -> np.ndarray:
    """Weighted sum of the expert outputs back to tokens: out[t] = sum_k gates[t, k] y[slot[t, k]]."""
    t_n = len(plan.slot)
    out = np.zeros((t_n, y.shape[-1]))
    g = np.asarray(gates, dtype=np.float64).reshape(t_n, -1)
    for t in range(t_n):
        for k, sl in enumerate(plan.slot[t]):
            if sl is not None:
                s, j, e, c = sl
                out[t] += g[t, k] * np.asarray(y[s, j, e, c], dtype=np.float64)
    return out


def moe_reference(tokens: np.ndarray, expert_ids: np.ndarray, gates: np.ndarray, experts: np.ndarray,
                  plan: DispatchPlan | None = None) -> np.ndarray:
    """The MoE layer body on one rank's tokens: sum_k gates[t, k] tokens[t] @ experts[id[t, k]].

    ``experts``: [E, H, F] all experts. With ``plan``, choices it dropped contribute nothing.
    """
    t_n = tokens.shape[0]
    ids = np.asarray(expert_ids).reshape(t_n, -1)
    g = np.asarray(gates, dtype=np.float64).reshape(t_n, -1)
    x = np.asarray(tokens, dtype=np.float64)
    out = np.zeros((t_n, experts.shape[2]))
    for t in range(t_n):
        for k in range(ids.shape[1]):
            if plan is not None and plan.slot[t][k] is None:
                continue
            out[t] += g[t, k] * (x[t] @ np.asarray(experts[ids[t, k]], dtype=np.float64))
    return out


def alltoall_expert_matmul_timings(tokens: int, h: int, f: int, ep: int, dtype: Any, link: Any, *,
                                   e_local: int = 1, n_sub: int = 4, capacity_factor: float = 1.0,
                                   numerics: bool = False, timeout_s: float = 600.0) -> dict:
    """T_mm, T_cc, T_f, hidden fraction and speedup of `alltoall_expert_matmul` in the simulator.

    Args:
        tokens: tokens per rank (top-1 routing: one slot each); h, f: hidden and expert
        output sizes; ep: ranks; e_local: experts per rank; n_sub: pipeline sub-chunks;
        capacity_factor: slots per (rank, expert) = tokens * factor / (ep * e_local),
        rounded up to a multiple of n_sub.

    Variants: T_mm `grouped_expert_matmul` on one rank, T_cc `expert_alltoall`, T_f
    `alltoall_expert_matmul`.
    """
    from trnopt.kernels.overlap import Variant, measure_overlap, operand

    per = -(-int(tokens * capacity_factor) // (ep * e_local))
    cap = -(-per // n_sub) * n_sub
    c = cap // n_sub
    groups = (tuple(range(ep)),)
    xs = (n_sub, ep, e_local, h, c)
    ys = (n_sub, ep, e_local, c, f)
    x = lambda r: operand(xs, dtype, numerics, seed=r)  # noqa: E731
    wt = lambda r: operand((e_local, h, f), dtype, numerics, seed=1000 + r)  # noqa: E731
    res = measure_overlap(
        mm=Variant(grouped_expert_matmul, [(x(0), wt(0))]),
        cc=Variant(expert_alltoall, [(operand((1,) + xs[1:3] + (h, cap), dtype, numerics, seed=r),
                                      operand((1,) + ys[1:3] + (cap, f), dtype, numerics, seed=50 + r))
                                     for r in range(ep)], {"groups": groups}),
        fused=Variant(alltoall_expert_matmul, [(x(r), wt(r)) for r in range(ep)], {"groups": groups}),
        link=link, numerics=numerics, timeout_s=timeout_s)
    return res.as_dict()


__all__ = [
    "alltoall_expert_matmul", "expert_alltoall", "grouped_expert_matmul", "alltoall_reference",
    "alltoall_expert_matmul_reference", "pack_dispatch", "unpack_combine", "moe_reference", "DispatchPlan",
    "alltoall_expert_matmul_timings",
]
