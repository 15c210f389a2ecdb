"""NumPy references of the overlap kernels, beside the kernels they check.

Each reference computes in float64 and rounds once to the output dtype, so a kernel that
accumulates in FP32 PSUM must agree within the per-dtype tolerance of tests/kernels.
The routing helpers (router output to the expert kernel's dispatch layout and back) are
in `trnopt.kernels.routing`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def allgather_matmul_reference(x_t_shards: Sequence[np.ndarray], w_shard: np.ndarray, *,
                               out_dtype: Any = None) -> np.ndarray:
    """NumPy reference of `allgather_matmul` for one rank.

    Args:
        x_t_shards: the rank-list's shards in list order, each [K, M_shard].
        w_shard: this rank's [K, N_shard].
        out_dtype: result dtype (default w_shard's).

    Returns:
        [tp * M_shard, N_shard]: products summed exactly (float64), rounded once.
    """
    x = np.concatenate([np.asarray(s, dtype=np.float64) for s in x_t_shards], axis=1)
    y = x.T @ np.asarray(w_shard, dtype=np.float64)
    return y.astype(out_dtype or np.asarray(w_shard).dtype)


def allgather_reference(x_t_shards: Sequence[np.ndarray]) -> np.ndarray:
    """NumPy reference of `allgather_ring`: the shards concatenated along M (columns)."""
    return np.concatenate([np.asarray(s) for s in x_t_shards], axis=1)


def matmul_reduce_scatter_reference(x_t_slices: Sequence[np.ndarray], w_slices: Sequence[np.ndarray], *,
                                    out_dtype: Any = None) -> list[np.ndarray]:
    """NumPy reference of `matmul_reduce_scatter` for a whole rank-list.

    Args:
        x_t_slices: per list position, [K_shard, M]; w_slices: per list position, [K_shard, N].

    Returns:
        per list position i, rows i*M_shard.. of sum_r x_t_r.T @ w_r (float64, rounded once).
    """
    total = sum(np.asarray(x, dtype=np.float64).T @ np.asarray(w, dtype=np.float64)
                for x, w in zip(x_t_slices, w_slices))
    dt = out_dtype or np.asarray(w_slices[0]).dtype
    return [c.astype(dt) for c in np.split(total, len(x_t_slices), axis=0)]


def reduce_scatter_reference(partials: Sequence[np.ndarray]) -> list[np.ndarray]:
    """NumPy reference of `reduce_scatter_ring`: the float64 sum split along M, per list position."""
    total = sum(np.asarray(p, dtype=np.float64) for p in partials)
    dt = np.asarray(partials[0]).dtype
    return [c.astype(dt) for c in np.split(total, len(partials), axis=0)]


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


def moe_reference(tokens: np.ndarray, expert_ids: np.ndarray, gates: np.ndarray, experts: np.ndarray,
                  plan: Any = None) -> np.ndarray:
    """The MoE layer body on one rank's tokens: sum_k gates[t, k] tokens[t] @ experts[id[t, k]].

    ``experts``: [E, H, F] all experts. With ``plan`` (a `routing.DispatchPlan`), choices it
    dropped contribute nothing.
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
