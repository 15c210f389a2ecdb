"""Symmetric runs (rank 0 simulated, peers assumed identical) give the full run's timeline,
and refuse or fall back where the symmetry they assume does not hold."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.allgather_matmul import allgather_matmul, allgather_ring
from trnopt.kernels.alltoall_expert_matmul import alltoall_expert_matmul, expert_alltoall
from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter, reduce_scatter_ring
from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.sim import (CollectiveMismatchError, LinkModel, SymmetryError, TensorSpec, run_ranks)
from trnopt.kernels.tiling import matmul

BF16 = np.dtype(ml_dtypes.bfloat16)
LINK = LinkModel(256e9, 1.5e-6)


def _trace(core):
    return [(i.op, i.name, i.engine, i.start_s, i.end_s) for i in core.instructions]


def _same_timeline(kernel, args, kwargs, lnc=1):
    full = run_ranks(kernel, args, numerics=False, kwargs=kwargs, link=LINK, symmetric=False, lnc=lnc)
    sym = run_ranks(kernel, args, numerics=False, kwargs=kwargs, link=LINK, symmetric=True, lnc=lnc)
    assert sym.symmetric and sym.timeline.symmetric and not full.symmetric
    # the full run is itself symmetric: every core has rank 0's schedule
    for core in full.timeline.cores[1:]:
        assert _trace(core) == _trace(full.timeline.cores[core.program])
    assert sym.timeline.total_s == full.timeline.total_s
    assert sym.timeline.busy_s == full.timeline.busy_s
    assert sym.timeline.exposed_comm_s == full.timeline.exposed_comm_s
    assert [(c.rank, c.program) for c in sym.timeline.cores] == [(c.rank, c.program) for c in full.timeline.cores]
    for s, f in zip(sym.timeline.cores, full.timeline.cores):
        assert _trace(s) == _trace(f)
        assert s.busy == f.busy and s.counts == f.counts
    assert sym.timeline.summary().splitlines()[1:] == full.timeline.summary().splitlines()[1:]
    return full, sym


def _groups(tp):
    return {"groups": (tuple(range(tp)),)}


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_allgather_kernels(tp, channels):
    k, ms, n = 256, 64 * channels, 300
    args = [(TensorSpec((k, ms), BF16), TensorSpec((k, n), BF16))] * tp
    _same_timeline(allgather_matmul, args, {**_groups(tp), "channels": channels})
    _same_timeline(allgather_ring, [(TensorSpec((k, ms), BF16),)] * tp, {**_groups(tp), "channels": channels})


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_reduce_scatter_kernels(tp, channels):
    k, m, n = 128, 64 * tp, 600
    args = [(TensorSpec((k, m), BF16), TensorSpec((k, n), BF16))] * tp
    _same_timeline(matmul_reduce_scatter, args, {**_groups(tp), "channels": channels})
    _same_timeline(reduce_scatter_ring, [(TensorSpec((m, n), BF16),)] * tp, {**_groups(tp), "channels": channels})


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_kernels(ep):
    s, el, h, c, f = 2, 1, 256, 16, 256
    args = [(TensorSpec((s, ep, el, h, c), BF16), TensorSpec((el, h, f), BF16))] * ep
    _same_timeline(alltoall_expert_matmul, args, _groups(ep))
    ys = [(TensorSpec((s, ep, el, h, c), BF16), TensorSpec((s, ep, el, c, f), BF16))] * ep
    _same_timeline(expert_alltoall, ys, _groups(ep))


def test_sub_groups_of_equal_size():
    """Two TP rings of 4 in 8 ranks: every rank-list the same size, all ranks covered."""
    args = [(TensorSpec((128, 64), BF16), TensorSpec((128, 256), BF16))] * 8
    _same_timeline(allgather_matmul, args, {"groups": ((0, 1, 2, 3), (4, 5, 6, 7)), "channels": 2})
    _same_timeline(allgather_matmul, args, {"groups": ((0, 2, 4, 6), (1, 3, 5, 7)), "channels": 1})


@nki.jit
def lnc2_ring(x):
    """Each program of a rank runs its own ring on its half of the rows (LNC 2)."""
    g = ncc.ReplicaGroup([list(range(4))])
    p = nl.program_id(0)
    half = x.shape[0] // 2
    a = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    b = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=a, src=x[p * half:(p + 1) * half, :])
    for _ in range(3):
        ncc.collective_permute_implicit(srcs_by_channel=[[a]], dsts_by_channel=[[b]], replica_group=g,
                                        channel_ids=[p])
        a, b = b, a
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[p * half:(p + 1) * half, :], src=a)
    return out


def test_lnc2():
    _same_timeline(lnc2_ring, [(TensorSpec((256, 512), BF16),)] * 4, {}, lnc=2)


def test_single_rank_matmul_is_never_symmetric():
    res = run_ranks(matmul, [(TensorSpec((256, 128), BF16), TensorSpec((256, 512), BF16))], numerics=False)
    assert not res.symmetric and len(res.timeline.cores) == 1


def test_default_is_symmetric_for_schedule_only_runs_with_equal_arguments():
    args = [(TensorSpec((128, 64), BF16), TensorSpec((128, 256), BF16))] * 4
    res = run_ranks(allgather_matmul, args, numerics=False, kwargs=_groups(4))
    assert res.symmetric and len(res.timeline.cores) == 4
    # numerics on, or different arguments per rank: every rank runs
    x = np.zeros((128, 64), BF16)
    w = np.zeros((128, 256), BF16)
    assert not run_ranks(allgather_matmul, [(x, w)] * 4, kwargs=_groups(4)).symmetric
    mixed = args[:3] + [(TensorSpec((128, 64), BF16), TensorSpec((128, 512), BF16))]
    assert not run_ranks(allgather_matmul, mixed, numerics=False, kwargs=_groups(4)).symmetric


def test_refuses_numerics_and_unequal_arguments():
    x = np.zeros((128, 64), BF16)
    with pytest.raises(SymmetryError, match="needs numerics=False"):
        run_ranks(allgather_ring, [(x,)] * 2, kwargs=_groups(2), symmetric=True)
    specs = [(TensorSpec((128, 64), BF16),), (TensorSpec((128, 32), BF16),)]
    with pytest.raises(SymmetryError, match="rank 1's arguments differ"):
        run_ranks(allgather_ring, specs, numerics=False, kwargs=_groups(2), symmetric=True)


@nki.jit
def uneven_groups(x):
    """Rank-lists of sizes 2 and 1: rank 2's all_gather is not rank 0's."""
    g = ncc.ReplicaGroup([[0, 1], [2]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    n = 1 if ncc.rank_id() == 2 else 2
    dst = nl.ndarray((n * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")


@nki.jit
def pair_swap(x, pairs):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs, name="swap")


def test_asymmetric_groups_refused_or_fall_back():
    specs = [(TensorSpec((4, 8), np.float32),)] * 3
    with pytest.raises(SymmetryError, match=r"rank-list sizes \[2, 1\]"):
        run_ranks(uneven_groups, specs, numerics=False, symmetric=True)
    res = run_ranks(uneven_groups, specs, numerics=False)  # default: falls back to the full run
    assert not res.symmetric and len(res.timeline.cores) == 3
    one_way = [(0, 1), (1, 2)]
    with pytest.raises(SymmetryError, match="sends once and receives once"):
        run_ranks(pair_swap, specs, numerics=False, kwargs=dict(pairs=one_way), symmetric=True)
    assert not run_ranks(pair_swap, specs, numerics=False, kwargs=dict(pairs=one_way)).symmetric
    swap = [(0, 1), (1, 0), (2, 3), (3, 2)]
    _same_timeline(pair_swap, [(TensorSpec((4, 8), np.float32),)] * 4, dict(pairs=swap))


@nki.jit
def rank_branch(x):
    g = ncc.ReplicaGroup([[0, 1, 2, 3]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray((4 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    if ncc.rank_id() == 2:
        ncc.all_reduce(srcs=[src], dsts=[dst[0:x.shape[0], :]], replica_group=g, op=nl.add, name="oops")
    else:
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")


def test_rank_dependent_control_flow_needs_the_full_run():
    """Documented limit: a branch on rank_id is invisible to a symmetric run; symmetric=False
    still reports the mismatch."""
    specs = [(TensorSpec((4, 8), np.float32),)] * 4
    assert run_ranks(rank_branch, specs, numerics=False).symmetric
    with pytest.raises(CollectiveMismatchError, match="rank 2: all_reduce"):
        run_ranks(rank_branch, specs, numerics=False, symmetric=False)
