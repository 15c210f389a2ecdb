"""All-gather + matmul: the column-parallel linear with sequence-parallel input.

Y = all_gather(X shards along M) @ W_shard, computed as a ring: each rank multiplies the
shard in hand while the next shard moves to it over the ring (double buffering), so the
all-gather hides behind the matmul. One channel runs the ring one way; two channels split
every shard's rows in halves and run the ring both ways at once (both directions of a
torus ring), halving the bytes per link per step.

On hardware, collective_permute_implicit_current_processing_rank_id returns a scalar register,
and the row offset of the chunk in hand would be formed with register arithmetic and a dynamic
access pattern (tensor.ap(scalar_offset=...)); the simulator returns the rank as an int and these
kernels index the rank-list with it in Python. Not yet run on a device.

Kernels here:
- `allgather_matmul`: the fused ring kernel.
- `allgather_ring`: the same ring without the matmul (the collective alone; a ring
  all-gather along M of the K-major shards).
- `allgather_matmul_reference`, `allgather_reference`: NumPy references.
- `allgather_matmul_timings`: T_mm / T_cc / T_f and the overlap ratios in the simulator.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.tiling import (PMAX, MatmulPipeline, RowBlock, choose_tiling, matmul_operands, ring_setup,
                                   split_rows, unit_pieces)


@nki.jit
def allgather_matmul(x_t, w, groups, channels=1, pieces=4):
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
        channels: 1 (ring one way) or 2 (each shard's rows split in halves, the first half
            going forward around the ring on channel 0 and the second backward on channel 1).
        pieces: each ring step moves its chunk in up to this many K-row slabs (aligned to
            the matmul's K blocks), so the next step's matmul can start on the first slab
            while the rest still moves, and the ring starts after the first slab's copy.

    Returns:
        Y: [M, N_shard] in w's dtype, shared HBM.

    Decomposition: step s = 0..tp-1 multiplies the shard (or half-shards) received s hops
    away, rows placed by collective_permute_implicit_current_processing_rank_id, while
    collective_permute_implicit moves it on to the successor slab by slab; two HBM ring
    buffers per channel (double buffering: step s reads buffer s % 2, receives into the
    other). Step 0 reads x_t directly; the ring starts from a copy of it (collectives never
    touch kernel inputs) made slab by slab during step 0.

    Preconditions: x_t and w 2-D with equal K and equal dtype; channels in (1, 2) and
    M_shard >= channels; pieces >= 1; rank-lists of equal size; one program per rank (LNC 1).
    """
    k, ms, n = matmul_operands(x_t, w)
    rg, ring, tp = ring_setup(groups, channels, "allgather_matmul")
    assert ms >= channels, f"M_shard={ms} rows cannot be split over {channels} channels"
    y = nl.ndarray((tp * ms, n), dtype=w.dtype, buffer=nl.shared_hbm, name="y")

    assert pieces >= 1, f"pieces must be >= 1, got {pieces}"
    halves = split_rows(ms, channels)
    chans = list(range(channels))
    tiling = choose_tiling(ms, k, n, x_t.dtype.itemsize, w.dtype.itemsize)
    slabs = unit_pieces(k, tiling.k_block * PMAX, pieces)
    bufs = [[nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.private_hbm, name=f"ring{c}_{i}") for i in range(2)]
            for c, (_, h) in enumerate(halves)]
    pipe = MatmulPipeline(k, n, x_t.dtype, w.dtype, tiling, name="ag")
    # The ring starts from a copy of x_t (collectives never touch kernel inputs), spread
    # over the first half of step 0's matmul in K-tile slabs.
    n_seed = max(1, pipe.iterations([h for _, h in halves]) // 2)
    seed = [(bufs[c][0][k0:k0 + kl, 0:h], x_t[k0:k0 + kl, off:off + h])
            for k0, kl in unit_pieces(k, PMAX, n_seed) for c, (off, h) in enumerate(halves)] if tp > 1 else []
    for s in range(tp):
        blocks = []
        for c, (off, h) in enumerate(halves):
            src = ncc.collective_permute_implicit_current_processing_rank_id(
                iteration_id=s, replica_group=rg, channel_id=c)
            row = ring.index(src) * ms + off
            chunk = x_t[0:k, off:off + h] if s == 0 else bufs[c][s % 2]
            blocks.append(RowBlock(chunk, y[row:row + h, 0:n]))
        pipe(blocks, w, side=seed if s == 0 else (), flush=s == tp - 1)
        if s < tp - 1:
            for k0, kl in slabs:
                ncc.collective_permute_implicit(
                    srcs_by_channel=[[bufs[c][s % 2][k0:k0 + kl, 0:h]] for c, (_, h) in enumerate(halves)],
                    dsts_by_channel=[[bufs[c][(s + 1) % 2][k0:k0 + kl, 0:h]] for c, (_, h) in enumerate(halves)],
                    replica_group=rg, channel_ids=chans, name=f"ag_step{s}")
    return y


@nki.jit
def allgather_ring(x_t, groups, channels=1):
    """The collective alone: G = all_gather of the K-major shards along M, as a ring.

    Args:
        x_t: [K, M_shard], this rank's shard, HBM.
        groups, channels: as in `allgather_matmul`.

    Returns:
        G: [K, tp * M_shard], shard of list position i in columns i*M_shard.., shared HBM.

    Decomposition: the ring schedule of `allgather_matmul` with the matmul replaced by a
    DMA of the chunk in hand into G. Preconditions as in `allgather_matmul`.
    """
    assert len(x_t.shape) == 2, f"x_t must be 2-D, got {tuple(x_t.shape)}"
    k, ms = x_t.shape
    rg, ring, tp = ring_setup(groups, channels, "allgather_ring")
    assert ms >= channels, f"M_shard={ms} rows cannot be split over {channels} channels"
    g_out = nl.ndarray((k, tp * ms), dtype=x_t.dtype, buffer=nl.shared_hbm, name="gathered")
    halves = split_rows(ms, channels)
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
            src = ncc.collective_permute_implicit_current_processing_rank_id(
                iteration_id=s, replica_group=rg, channel_id=c)
            col = ring.index(src) * ms + off
            chunk = x_t[0:k, off:off + h] if s == 0 else bufs[c][s % 2]
            nisa.dma_copy(dst=g_out[0:k, col:col + h], src=chunk, name="ag_place")
    return g_out


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


def allgather_matmul_timings(m: int, k: int, n: int, tp: int, dtype: Any, link: Any, channels: int = 1, *,
                             numerics: bool = False, timeout_s: float = 600.0) -> dict:
    """T_mm, T_cc, T_f, hidden fraction and speedup of `allgather_matmul` in the simulator.

    Args:
        m: rows of the gathered X (all ranks), divisible by tp; k: contraction size;
        n: columns of this rank's W shard; tp: ranks in the ring (one rank-list 0..tp-1);
        dtype: input/output dtype; link: LinkModel or {channel: LinkModel};
        channels: 1 or 2; numerics: simulate data too (False: schedule only).

    The three variants: T_mm the undecomposed matmul of the gathered [m, k] x [k, n] on one
    rank (`trnopt.kernels.tiling.matmul`), T_cc `allgather_ring` (whole chunks: the fewest
    hop latencies), T_f `allgather_matmul` (default pieces).
    """
    from trnopt.kernels.overlap import Variant, measure_overlap, operand
    from trnopt.kernels.tiling import matmul

    assert m % tp == 0, f"m={m} must be divisible by tp={tp}"
    ms = m // tp
    groups = (tuple(range(tp)),)
    kw = {"groups": groups, "channels": channels}
    x = lambda r: operand((k, ms), dtype, numerics, seed=r)  # noqa: E731
    wt = lambda r: operand((k, n), dtype, numerics, seed=1000 + r)  # noqa: E731
    res = measure_overlap(
        mm=Variant(matmul, [(operand((k, m), dtype, numerics, seed=0), wt(0))]),
        cc=Variant(allgather_ring, [(x(r),) for r in range(tp)], kw),
        fused=Variant(allgather_matmul, [(x(r), wt(r)) for r in range(tp)], kw),
        link=link, numerics=numerics, timeout_s=timeout_s)
    return res.as_dict()


__all__ = [
    "allgather_matmul", "allgather_ring", "allgather_matmul_reference", "allgather_reference",
    "allgather_matmul_timings",
]
