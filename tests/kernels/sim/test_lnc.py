"""The two programs of an LNC 2 rank: shared HBM, core_barrier, sendrecv, and deterministic
runs (a cross-program race is refused every time rather than resolved by thread timing)."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.sim import ConstraintError, run_ranks
from trnopt.kernels.sim.lnc import RaceError


@nki.jit
def gather_then_matmul(x_t, w, tp, barrier=True):
    """TP ring all-gather of the K-major shards, the two programs each gathering one half of
    every shard's columns (on their own channel) into one shared buffer; after the barrier
    each program multiplies the whole gathered X by its half of W's columns."""
    g = ncc.ReplicaGroup([list(range(tp))])
    p = nl.program_id(0)
    k, ms = x_t.shape
    n = w.shape[1]
    h, hn = ms // 2, n // 2
    gathered = nl.ndarray((k, tp * ms), dtype=x_t.dtype, buffer=nl.shared_hbm, name="gathered")
    bufs = [nl.ndarray((k, h), dtype=x_t.dtype, buffer=nl.private_hbm) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x_t[:, p * h:(p + 1) * h])
    for s in range(tp):
        held = ncc.collective_permute_implicit_current_processing_rank_id(s, g, channel_id=p)
        nisa.dma_copy(dst=gathered.ap([[tp * ms, k], [1, h]], offset=p * h, scalar_offset=held * ms, indirect_dim=1),
                      src=bufs[s % 2])
        if s < tp - 1:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[s % 2]]], dsts_by_channel=[[bufs[(s + 1) % 2]]],
                                            replica_group=g, channel_ids=[p])
    if barrier:
        nisa.core_barrier(data=gathered, cores=(0, 1))
    y = nl.ndarray((tp * ms, n), dtype=nl.float32, buffer=nl.shared_hbm, name="y")
    xt = nl.ndarray((k, tp * ms), dtype=x_t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=gathered)
    wt = nl.ndarray((k, hn), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w[:, p * hn:(p + 1) * hn])
    for m0 in range(0, tp * ms, 128):
        ps = nl.ndarray((128, hn), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=xt[:, m0:m0 + 128], moving=wt)
        sb = nl.ndarray((128, hn), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        nisa.dma_copy(dst=y[m0:m0 + 128, p * hn:(p + 1) * hn], src=sb)
    return y


def _inputs(tp):
    rng = np.random.default_rng(7)
    xs = [rng.integers(-3, 4, (128, 64)).astype(np.float32) for _ in range(tp)]
    w = rng.integers(-3, 4, (128, 64)).astype(np.float32)
    return xs, w


def test_allgather_matmul_ring_at_tp4_lnc2_is_deterministic_and_right():
    tp = 4
    xs, w = _inputs(tp)
    ref = np.concatenate(xs, axis=1).T @ w
    for _ in range(8):
        res = run_ranks(gather_then_matmul, [(x, w) for x in xs], lnc=2, kwargs=dict(tp=tp))
        for out in res.outputs:
            np.testing.assert_array_equal(out, ref)


def test_reading_the_other_programs_writes_without_a_barrier_is_refused_every_time():
    tp = 4
    xs, w = _inputs(tp)
    for _ in range(5):
        with pytest.raises(RaceError, match="shared_hbm tensor 'gathered'"):
            run_ranks(gather_then_matmul, [(x, w) for x in xs], lnc=2, kwargs=dict(tp=tp, barrier=False))


@nki.jit
def both_write_same_rows(x):
    """Each program writes its own values (x + program id) into the same rows."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(nl.program_id(0)))
    nisa.dma_copy(dst=out, src=t, name="store")
    return out


def test_write_write_race_names_both_programs():
    with pytest.raises(RaceError, match=r"program 1, rank 0 \(program 1\), dma_copy\(name='store'\): writes elements "
                                        r"of shared_hbm tensor 'out' .* that program 0 wrote in|program 0, .* program 1 wrote"):
        run_ranks(both_write_same_rows, [(np.ones((4, 4), np.float32),)], lnc=2)


@nki.jit
def swap_halves(x):
    """Each program sends its SBUF tile to the other with sendrecv."""
    p = nl.program_id(0)
    rows = x.shape[0] // 2
    mine = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[p * rows:(p + 1) * rows, :])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - p, recv_from_rank=1 - p, pipe_id=0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[p * rows:(p + 1) * rows, :], src=theirs)
    return out


def test_sendrecv_swaps_between_the_programs():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    out = nki.simulate(swap_halves[2])(x)
    np.testing.assert_array_equal(out, np.concatenate([x[2:], x[:2]]))


@nki.jit
def barrier_at_lnc1(x):
    nisa.core_barrier(data=x, cores=(0, 1))


def test_core_barrier_needs_lnc2():
    with pytest.raises(ConstraintError, match="core_barrier needs LNC 2"):
        nki.simulate(barrier_at_lnc1)(np.zeros((2, 2), np.float32))


@nki.jit
def both_zero_then_each_half(x):
    """Both programs zero the whole output (the same values: no race), and after a barrier
    each writes its half."""
    p = nl.program_id(0)
    rows = x.shape[0] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    z = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    nisa.dma_copy(dst=out, src=z)
    nisa.core_barrier(data=out, cores=(0, 1))
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[p * rows:(p + 1) * rows, :])
    nisa.dma_copy(dst=out[p * rows:(p + 1) * rows, :], src=t)
    return out


def test_the_same_values_written_by_both_programs_are_no_race():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    for _ in range(3):
        np.testing.assert_array_equal(nki.simulate(both_zero_then_each_half[2])(x), x)


@nki.jit
def one_core_barrier(x):
    nisa.core_barrier(data=x, cores=(0))
    return None


def test_a_barrier_of_one_core_at_lnc1_waits_for_no_one():
    nki.simulate(one_core_barrier)(np.zeros((2, 2), np.float32))


@nki.jit
def halves_then_self_copy(x, changing):
    """Each program writes its half, a barrier, then both copy the whole output onto itself
    (``changing``: program 1 writes other values instead, a real race with program 0's copy)."""
    p = nl.program_id(0)
    rows = x.shape[0] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[p * rows:(p + 1) * rows, :])
    nisa.dma_copy(dst=out[p * rows:(p + 1) * rows, :], src=t)
    nisa.core_barrier(data=out, cores=(0, 1))
    if changing and p == 1:
        z = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z, value=-1.0)
        nisa.dma_copy(dst=out, src=z)
    else:
        nisa.dma_copy(dst=out, src=out)
    return out


def test_a_write_that_leaves_the_values_is_no_race_with_the_other_programs_reads():
    """Both programs copying the tensor onto itself: each reads what the other writes with no
    barrier, but the writes leave memory as it was, so every order reads and leaves the same."""
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    for _ in range(3):
        np.testing.assert_array_equal(nki.simulate(halves_then_self_copy[2])(x, False), x)


def test_a_write_that_changes_values_races_with_the_other_programs_reads():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    for _ in range(3):
        with pytest.raises(RaceError, match="no nisa.core_barrier"):
            nki.simulate(halves_then_self_copy[2])(x, True)
