"""Mismatched collectives, missing peers, deadlocks and slow peers fail fast, naming rank and instruction."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trnopt.kernels.nki_api import nki, ncc, nisa, nl
from trnopt.kernels.sim import CollectiveMismatchError, run_ranks


def _bufs(x):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((4 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    return src, dst


@nki.jit
def mismatched(x, me):
    g = ncc.ReplicaGroup([[0, 1, 2, 3]])
    src, dst = _bufs(x)
    if me == 2:
        ncc.all_reduce(srcs=[src], dsts=[dst[0:2, :]], replica_group=g, op=nl.add, name="oops")
    else:
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")
    return None


@nki.jit
def one_skips(x, me):
    g = ncc.ReplicaGroup([[0, 1, 2, 3]])
    src, dst = _bufs(x)
    if me != 3:
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")
    return None


@nki.jit
def crossed(x, me):
    """Ranks 0 and 2 enter the pair groups first, ranks 1 and 3 the full group: deadlock."""
    pairs = ncc.ReplicaGroup([[0, 1], [2, 3]])
    full = ncc.ReplicaGroup([[0, 1, 2, 3]])
    src, dst = _bufs(x)
    calls = [lambda: ncc.all_gather(srcs=[src], dsts=[dst[0:4, :]], replica_group=pairs, collective_dim=0, name="pair"),
             lambda: ncc.all_gather(srcs=[src], dsts=[dst], replica_group=full, collective_dim=0, name="full")]
    if me % 2:
        calls.reverse()
    for c in calls:
        c()
    return None


@nki.jit
def slow_peer(x, me, delay):
    g = ncc.ReplicaGroup([[0, 1]])
    src, dst = _bufs(x)
    if me == 1:
        time.sleep(delay)
    ncc.all_gather(srcs=[src], dsts=[dst[0:4, :]], replica_group=g, collective_dim=0, name="ag")
    return None


def _args(n: int) -> list[tuple[np.ndarray, int]]:
    """Each rank gets its data and its rank as an argument (a kernel cannot branch on the
    ncc.rank_id() register in Python)."""
    return [(np.ones((2, 3), np.float32), r) for r in range(n)]


def test_mismatch_names_ranks_and_instructions() -> None:
    t0 = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as e:
        run_ranks(mismatched, _args(4))
    msg = str(e.value)
    assert "rank 2: all_reduce(name='oops')" in msg and "rank 0: all_gather(name='ag')" in msg
    assert time.monotonic() - t0 < 3


def test_peer_that_never_comes() -> None:
    t0 = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match=r"rank 3, which finished the kernel") as e:
        run_ranks(one_skips, _args(4))
    assert "all_gather(name='ag')" in str(e.value)
    assert time.monotonic() - t0 < 3


def test_deadlock_detected() -> None:
    t0 = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match="deadlock") as e:
        run_ranks(crossed, _args(4))
    assert "rank 1 waits in all_gather(name='full')" in str(e.value)
    assert "rank 0 waits in all_gather(name='pair')" in str(e.value)
    assert time.monotonic() - t0 < 3


def test_timeout_on_slow_peer() -> None:
    t0 = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match=r"rank 0, all_gather\(name='ag'\): blocked for \d+\.\d s \(timeout_s=0\.2\)"):
        run_ranks(slow_peer, _args(2), kwargs=dict(delay=1.0), timeout_s=0.2)
    assert time.monotonic() - t0 < 3


def test_slow_peer_within_timeout_is_fine() -> None:
    run_ranks(slow_peer, _args(2), kwargs=dict(delay=0.1), timeout_s=5)


@nki.jit
def busy_peer(x, me, steps):
    """Rank 1 works (issues instructions) for steps x 50 ms before the collective."""
    g = ncc.ReplicaGroup([[0, 1]])
    src, dst = _bufs(x)
    if me == 1:
        t = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.sbuf)
        for _ in range(steps):
            time.sleep(0.05)
            nisa.memset(dst=t, value=0.0)
    ncc.all_gather(srcs=[src], dsts=[dst[0:4, :]], replica_group=g, collective_dim=0, name="ag")
    return None


def test_timeout_counts_stalls_not_waits() -> None:
    """A peer that keeps issuing instructions never times out the ranks waiting for it,
    however long the wait: only a peer that makes no progress for timeout_s does."""
    t0 = time.monotonic()
    run_ranks(busy_peer, _args(2), kwargs=dict(steps=16), timeout_s=0.3)
    assert time.monotonic() - t0 > 0.6  # waited well past timeout_s without failing


@nki.jit
def skips_then_busy(x, me):
    """Rank 3 skips the all-gather and then issues instructions without end."""
    g = ncc.ReplicaGroup([[0, 1, 2, 3]])
    src, dst = _bufs(x)
    if me != 3:
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, name="ag")
    else:
        for _ in range(10**9):
            nisa.dma_copy(dst=src, src=x, name="spin")
    return None


@pytest.mark.parametrize("numerics", [True, False])
def test_a_rank_that_skips_a_collective_and_keeps_going_fails_fast_naming_it(numerics):
    x = np.ones((2, 8), np.float32)
    t0 = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as err:
        # timeout_s far beyond the test: the failure comes from the instruction count, not a stall
        run_ranks(skips_then_busy, [(x, r) for r in range(4)], numerics=numerics, timeout_s=3600)
    msg = str(err.value)
    assert "for rank 3, which has issued" in msg and "without reaching this collective" in msg
    assert "all_gather(name='ag')" in msg and "its last instruction: rank 3, dma_copy(name='spin')" in msg
    assert time.monotonic() - t0 < 600  # not a speed test: without the rule the run never ends
