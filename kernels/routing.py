"""Routing between the MoE router and the expert kernel's dispatch layout, on the host side.

The router gives, per token, its top-k expert ids and gate weights (`route`: softmax of
the router logits, then top-k, as in Mixtral, arXiv:2401.04088, section 2.1). The expert
kernel takes tokens packed in capacity slots per (destination rank, local expert) and
sub-chunk (`pack_dispatch`); tokens per expert are ragged, so the capacity is either
sized from the router's counts (`capacity_from_counts`: no token dropped) or from a
capacity factor (`capacity_slots`, Switch Transformer, arXiv:2101.03961, section 2.2:
tokens * factor / experts, overflowing tokens dropped). `unpack_combine` weighs the
expert outputs back into token order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(expert_ids [T, top_k], gates [T, top_k])`` from router logits [T, E]: the top-k
    experts of each token by logit, gates their softmax probabilities renormalised over
    the chosen k."""
    z = np.asarray(logits, dtype=np.float64)
    assert z.ndim == 2 and 1 <= top_k <= z.shape[1], f"logits must be [T, E] with E >= top_k, got {z.shape}"
    ids = np.argsort(-z, axis=1, kind="stable")[:, :top_k]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    g = np.take_along_axis(p, ids, axis=1)
    return ids, g / g.sum(axis=1, keepdims=True)


def tokens_per_expert(expert_ids: np.ndarray, n_experts: int) -> np.ndarray:
    """[n_experts] counts of (token, choice) pairs routed to each expert."""
    return np.bincount(np.asarray(expert_ids).reshape(-1), minlength=n_experts)


def capacity_from_counts(counts: np.ndarray, n_sub: int) -> int:
    """Slots per (rank, expert) that hold every routed token: the largest count over all
    source ranks and experts, rounded up to a multiple of ``n_sub``."""
    top = int(np.max(counts)) if np.size(counts) else 0
    return max(n_sub, -(-top // n_sub) * n_sub)


def capacity_slots(tokens: int, experts: int, n_sub: int, factor: float = 1.0) -> int:
    """Slots per (rank, expert) from a capacity factor: ceil(tokens * factor / experts),
    rounded up to a multiple of ``n_sub``."""
    per = max(1, math.ceil(tokens * factor / experts))
    return -(-per // n_sub) * n_sub


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
