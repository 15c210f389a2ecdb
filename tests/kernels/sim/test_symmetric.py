"""Symmetric runs (rank 0 simulated, peers assumed identical) give the full run's timeline,
and refuse or fall back where a fault could hide on a rank they do not simulate.

A kernel cannot branch on a rank id in Python (it is a register, as on the device), so a
rank differs from rank 0 only through its arguments (a symmetric run requires them equal),
register values used as dynamic offsets (every rank's offset is bounds-checked) and
dynamic loops on registers (a rank-dependent trip count falls back to the full run).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.sim import ConstraintError, LinkModel, SymmetryError, TensorSpec, run_ranks

BF16 = np.dtype(ml_dtypes.bfloat16)
LINK = LinkModel(256e9, 1.5e-6)


def _trace(core):
    return [(i.op, i.name, i.engine, i.start_s, i.end_s) for i in core.instructions]


def _same_timeline(kernel, args, kwargs, lnc=None):
    full = run_ranks(kernel, args, numerics=False, kwargs=kwargs, link=LINK, symmetric=False, lnc=lnc)
    sym = run_ranks(kernel, args, numerics=False, kwargs=kwargs, link=LINK, symmetric=True, lnc=lnc)
    assert sym.symmetric and sym.timeline.symmetric and not full.symmetric
    for core in full.timeline.cores[1:]:
        assert _trace(core) == _trace(full.timeline.cores[core.program])
    assert sym.timeline.total_s == full.timeline.total_s
    assert sym.timeline.busy_s == full.timeline.busy_s
    assert sym.timeline.exposed_comm_s == full.timeline.exposed_comm_s
    assert [(c.rank, c.program) for c in sym.timeline.cores] == [(c.rank, c.program) for c in full.timeline.cores]
    for s, f in zip(sym.timeline.cores, full.timeline.cores):
        assert _trace(s) == _trace(f)
        assert s.busy == f.busy and s.counts == f.counts
    return full, sym


@nki.jit
def ring_matmul(x_t, w, tp, channels=1):
    """All-gather of the [K, M_shard] shards by ring, each chunk multiplied as it arrives;
    rows of the chunk in hand at offset (held rank) * M_shard, by register arithmetic."""
    g = ncc.ReplicaGroup([list(range(tp))])
    k, ms = x_t.shape
    n = w.shape[1]
    h = ms // channels
    y = nl.ndarray((tp * ms, n), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = nl.ndarray((k, n), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w)
    bufs = [[nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.private_hbm) for _ in range(2)] for _ in range(channels)]
    for c in range(channels):
        nisa.dma_copy(dst=bufs[c][0], src=x_t[:, c * h:(c + 1) * h])
    for s in range(tp):
        for c in range(channels):
            held = ncc.collective_permute_implicit_current_processing_rank_id(s, g, channel_id=c)
            xt = nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=bufs[c][s % 2])
            ps = nl.ndarray((h, n), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=xt, moving=wt)
            sb = nl.ndarray((h, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=sb, src=ps)
            nisa.dma_copy(dst=y.ap([[n, h], [1, n]], scalar_offset=held * ms + c * h, indirect_dim=0), src=sb)
        if s < tp - 1:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[c][s % 2]] for c in range(channels)],
                                            dsts_by_channel=[[bufs[c][(s + 1) % 2]] for c in range(channels)],
                                            replica_group=g, channel_ids=list(range(channels)))
    return y


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_ring_kernel_same_timeline(tp, channels):
    args = [(TensorSpec((128, 64), BF16), TensorSpec((128, 256), BF16))] * tp
    _same_timeline(ring_matmul, args, {"tp": tp, "channels": channels})


def test_ring_kernel_numerics():
    rng = np.random.default_rng(0)
    tp = 4
    xs = [rng.integers(-2, 3, (128, 64)).astype(BF16) for _ in range(tp)]
    w = rng.integers(-2, 3, (128, 96)).astype(BF16)
    res = run_ranks(ring_matmul, [(x, w) for x in xs], kwargs={"tp": tp, "channels": 2})
    ref = np.concatenate(xs, axis=1).astype(np.float32).T @ w.astype(np.float32)
    for out in res.outputs:
        np.testing.assert_array_equal(out, ref)


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


def test_default_is_symmetric_for_schedule_only_runs_with_equal_arguments():
    args = [(TensorSpec((128, 64), BF16), TensorSpec((128, 256), BF16))] * 4
    res = run_ranks(ring_matmul, args, numerics=False, kwargs={"tp": 4})
    assert res.symmetric and len(res.timeline.cores) == 4
    x, w = np.zeros((128, 64), BF16), np.zeros((128, 256), BF16)
    assert not run_ranks(ring_matmul, [(x, w)] * 4, kwargs={"tp": 4}).symmetric
    mixed = args[:3] + [(TensorSpec((128, 64), BF16), TensorSpec((128, 512), BF16))]
    assert not run_ranks(ring_matmul, mixed, numerics=False, kwargs={"tp": 4}).symmetric


def test_refuses_numerics_and_unequal_arguments():
    x, w = np.zeros((128, 64), BF16), np.zeros((128, 256), BF16)
    with pytest.raises(SymmetryError, match="needs numerics=False"):
        run_ranks(ring_matmul, [(x, w)] * 2, kwargs={"tp": 2}, symmetric=True)
    specs = [(TensorSpec((128, 64), BF16), TensorSpec((128, 256), BF16)),
             (TensorSpec((128, 32), BF16), TensorSpec((128, 256), BF16))]
    with pytest.raises(SymmetryError, match="rank 1's arguments differ"):
        run_ranks(ring_matmul, specs, numerics=False, kwargs={"tp": 2}, symmetric=True)


@nki.jit
def uneven_groups(x):
    """Rank-lists of sizes 2 and 1; every rank allocates a 2-rank result: only rank 2 is wrong."""
    g = ncc.ReplicaGroup([[0, 1], [2]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((2 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")


@nki.jit
def pair_swap(x, pairs):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs, name="swap")


def test_asymmetric_groups_refused_or_fall_back_to_the_full_run():
    specs = [(TensorSpec((4, 8), np.float32),)] * 3
    with pytest.raises(SymmetryError, match=r"rank-list sizes \[2, 1\]"):
        run_ranks(uneven_groups, specs, numerics=False, symmetric=True)
    # the default falls back to the full run, which finds the fault of rank 2 alone
    with pytest.raises(ConstraintError, match=r"rank 2, all_gather\(name='ag'\): dst shape \(8, 8\) != \(4, 8\)"):
        run_ranks(uneven_groups, specs, numerics=False)
    one_way = [(0, 1), (1, 2)]
    with pytest.raises(SymmetryError, match="sends once and receives once"):
        run_ranks(pair_swap, specs, numerics=False, kwargs=dict(pairs=one_way), symmetric=True)
    assert not run_ranks(pair_swap, specs, numerics=False, kwargs=dict(pairs=one_way)).symmetric
    swap = [(0, 1), (1, 0), (2, 3), (3, 2)]
    _same_timeline(pair_swap, [(TensorSpec((4, 8), np.float32),)] * 4, dict(pairs=swap))


@nki.jit
def rank_branch(x):
    if ncc.rank_id() == 2:
        nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)


def test_python_branch_on_rank_id_fails_as_on_the_device():
    with pytest.raises(TypeError, match="truth value .* of a VirtualRegister"):
        run_ranks(rank_branch, [(TensorSpec((4, 8), np.float32),)] * 4, numerics=False)


@nki.jit
def rank_offset_write(x, rows_per_rank):
    """Rank r writes rows r*rows_per_rank..: out of bounds for the last rank when too large."""
    out = nl.ndarray((8, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out.ap([[x.shape[1], x.shape[0]], [1, x.shape[1]]], scalar_offset=ncc.rank_id() * rows_per_rank,
                             indirect_dim=0), src=t, name="place")
    return out


@nki.jit
def rank_offset_read(x):
    """Rank r reads row r of its input: a rank-dependent read."""
    t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=ncc.rank_id(), indirect_dim=0))


def test_rank_dependent_offsets():
    specs = [(TensorSpec((2, 8), np.float32),)] * 4
    assert run_ranks(rank_offset_write, specs, numerics=False, kwargs=dict(rows_per_rank=2)).symmetric
    # only rank 3 writes out of bounds: the symmetric run checks every rank's offset
    with pytest.raises(ConstraintError, match="outside its 64 elements on rank 3"):
        run_ranks(rank_offset_write, specs, numerics=False, kwargs=dict(rows_per_rank=3), symmetric=True)
    tall = [(TensorSpec((4, 8), np.float32),)] * 4
    _same_timeline(rank_offset_read, tall, {})
    with pytest.raises(ConstraintError, match="outside its 16 elements on rank 2"):
        run_ranks(rank_offset_read, [(TensorSpec((2, 8), np.float32),)] * 4, numerics=False, symmetric=True)


@nki.jit
def rank_loop(x):
    """A dynamic loop whose trip count is the rank id."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    for _ in nl.dynamic_range(ncc.rank_id()):
        nisa.dma_copy(dst=t, src=x)


def test_rank_dependent_loop_falls_back_to_the_full_run():
    specs = [(TensorSpec((2, 8), np.float32),)] * 4
    with pytest.raises(SymmetryError, match="loop bound differs between ranks"):
        run_ranks(rank_loop, specs, numerics=False, symmetric=True)
    res = run_ranks(rank_loop, specs, numerics=False)
    assert not res.symmetric
    assert [c.counts.get("DMA", 0) for c in res.timeline.cores] == [0, 1, 2, 3]


@nki.jit
def last_rank_reads_unwritten(x):
    """Rows 0..2 of a scratch tensor are written; rank r reads row r: rank 3 reads a row nothing wrote."""
    scratch = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=scratch[0:3, :], src=x[0:3, :])
    t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=scratch.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=ncc.rank_id(),
                                        indirect_dim=0), name="row")


def test_a_one_rank_fault_the_fast_mode_cannot_see_is_said():
    from trnopt.kernels.sim.errors import UninitializedReadError
    from trnopt.kernels.sim.runner import NUMERICS_OFF, SYMMETRIC

    with pytest.raises(UninitializedReadError, match="rank 3"):
        run_ranks(last_rank_reads_unwritten, [(np.ones((4, 8), np.float32),)] * 4)
    fast = run_ranks(last_rank_reads_unwritten, [(TensorSpec((4, 8), np.float32),)] * 4, numerics=False)
    assert fast.symmetric and fast.unseen == (NUMERICS_OFF, SYMMETRIC)
    full = run_ranks(last_rank_reads_unwritten, [(TensorSpec((4, 8), np.float32),)] * 4, numerics=False,
                     symmetric=False)
    assert full.unseen == (NUMERICS_OFF,)
    checked = run_ranks(rank_offset_read, [(np.ones((4, 8), np.float32),)] * 4)
    assert checked.unseen == ()
