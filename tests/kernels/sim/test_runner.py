"""run_ranks, nki.jit/nki.simulate, numerics=False and LNC 2."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.nki_api import nki, ncc, nisa, nl
from trnopt.kernels.sim import SimulatorError, TensorSpec, run_ranks


@nki.jit
def ag_matmul(x_shard, w, tp):
    """Y = all_gather(X) @ W: gather the row shards, then tile the matmul (128-row tiles)."""
    g = ncc.ReplicaGroup([list(range(tp))])
    rows, k = x_shard.shape
    n = w.shape[1]
    src = nl.ndarray((rows, k), dtype=x_shard.dtype, buffer=nl.private_hbm)
    xs = nl.ndarray((tp * rows, k), dtype=x_shard.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x_shard)
    ncc.all_gather(srcs=[src], dsts=[xs], replica_group=g, collective_dim=0)
    out = nl.ndarray((tp * rows, n), dtype=nl.float32, buffer=nl.shared_hbm)
    for m0 in range(0, tp * rows, 128):
        acc = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.psum)
        for k0 in range(0, k, 128):
            xt = nl.ndarray((128, 128), dtype=x_shard.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=xs.ap(pattern=[[1, 128], [k, 128]], offset=m0 * k + k0))  # transposed load
            wt = nl.ndarray((128, n), dtype=w.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=wt, src=w[k0:k0 + 128, :])
            nisa.nc_matmul(dst=acc, stationary=xt, moving=wt)
        sb = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=acc)
        nisa.dma_copy(dst=out[m0:m0 + 128, :], src=sb)
    return out, tp


def test_outputs_per_rank_tuples_stay_tuples() -> None:
    rng = np.random.default_rng(0)
    tp = 2
    xs = [rng.standard_normal((128, 256)).astype(ml_dtypes.bfloat16) for _ in range(tp)]
    w = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16)
    res = run_ranks(ag_matmul, [(x, w) for x in xs], kwargs=dict(tp=tp))
    ref = np.concatenate(xs).astype(np.float32) @ w.astype(np.float32)
    for r, out in enumerate(res.outputs):
        assert isinstance(out, tuple) and out[1] == tp
        np.testing.assert_allclose(out[0], ref, rtol=1e-3, atol=1e-3)


def test_numerics_off_gives_same_timeline_without_data() -> None:
    rng = np.random.default_rng(0)
    tp = 4
    xs = [rng.standard_normal((128, 256)).astype(ml_dtypes.bfloat16) for _ in range(tp)]
    w = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16)
    on = run_ranks(ag_matmul, [(x, w) for x in xs], kwargs=dict(tp=tp))
    specs = [(TensorSpec((128, 256), ml_dtypes.bfloat16), TensorSpec((256, 64), ml_dtypes.bfloat16))] * tp
    off = run_ranks(ag_matmul, specs, numerics=False, kwargs=dict(tp=tp))
    assert off.outputs is None
    assert off.timeline.total_s == pytest.approx(on.timeline.total_s)
    assert off.timeline.busy_s == pytest.approx(on.timeline.busy_s)


def test_numerics_off_scales_to_large_shapes() -> None:
    """16 ranks, 4096 x 1024 gathered rows, 1024 matmul instructions per rank, no data."""
    tp = 16
    specs = [(TensorSpec((256, 1024), ml_dtypes.bfloat16), TensorSpec((1024, 512), ml_dtypes.bfloat16))] * tp
    res = run_ranks(ag_matmul, specs, numerics=False, kwargs=dict(tp=tp))
    assert res.timeline.cores[0].counts["Tensor"] == (tp * 256 // 128) * (1024 // 128)
    assert res.timeline.busy_s["Tensor"] == pytest.approx(256 * 512 / 2.4e9)


@nki.jit
def lnc2_scale(x):
    """Each of the two programs doubles its half of the rows into the shared output."""
    rows, cols = x.shape
    half = rows // nl.num_programs()
    p = nl.program_id(0)
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((half, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[p * half:(p + 1) * half, :])
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=out[p * half:(p + 1) * half, :], src=t)
    return out


def test_lnc2_programs_share_hbm() -> None:
    x = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
    np.testing.assert_array_equal(nki.simulate(lnc2_scale[2])(x), 2 * x)
    res = run_ranks(lnc2_scale, [(x,), (x + 1,)], lnc=2)
    np.testing.assert_array_equal(res.outputs[1], 2 * (x + 1))
    assert len(res.timeline.cores) == 4


def test_calling_a_kernel_outside_simulation_simulates_it() -> None:
    x = np.ones((128, 8), np.float32)
    np.testing.assert_array_equal(lnc2_scale(x), 2 * x)


def test_api_outside_a_kernel_raises() -> None:
    with pytest.raises(SimulatorError, match="outside a simulated kernel"):
        nl.ndarray((4, 4), dtype=nl.float32)


def test_kernel_exception_propagates() -> None:
    @nki.jit
    def boom(x):
        raise ValueError("kernel bug")

    with pytest.raises(ValueError, match="kernel bug"):
        run_ranks(boom, [(np.zeros(2),)] * 3)


@nki.jit
def scaled(x, scale):
    """x * scale, where scale may arrive as a keyword argument."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    s = nl.ndarray(scale.shape, dtype=scale.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=s, src=scale)
    nisa.tensor_tensor(dst=t, data1=t, data2=s, op=nl.multiply)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_keyword_array_arguments_become_tensors() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    s = np.full((2, 4), 3.0, np.float32)
    np.testing.assert_array_equal(nki.simulate(scaled)(x, scale=s), 3 * x)
    np.testing.assert_array_equal(scaled(x=x, scale=s), 3 * x)


@nki.jit
def grid_copy(a):
    """The SPMD example of the reference: program (i, j) copies element [i, j]."""
    b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    t = nl.ndarray((1, 1), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[i, j])
    nisa.dma_copy(dst=b[i, j], src=t)
    assert nl.num_programs(1) == a.shape[1] and nl.num_programs(None) == a.shape[0] * a.shape[1]
    assert nl.program_ndim() == 2
    return b


@pytest.mark.parametrize("grid", [(1, 2), (4, 2), (2, 3)])
def test_every_program_of_a_launch_grid_runs(grid) -> None:
    a = np.random.default_rng(0).random((*grid, 1, 1)).astype(np.float32)
    np.testing.assert_array_equal(grid_copy[grid](a), a)
    res = run_ranks(grid_copy[grid], [(a,)])
    assert len(res.timeline.cores) == grid[0] * grid[1]


def test_nl_hbm_is_private_hbm() -> None:
    assert nl.hbm is nl.private_hbm


@nki.jit
def stuck(x, me):
    if me == 1:
        while True:
            time.sleep(0.01)
    return None


def test_a_rank_stuck_in_python_fails_the_run_with_its_line_and_the_stall_time() -> None:
    from trnopt.kernels.sim.watchdog import StallError

    t0 = time.monotonic()
    with pytest.raises(StallError, match=r"no rank issued an instruction for \d+\.\d s \(timeout_s=0\.2\).*\n"
                                         r"  rank 1 at .*test_runner\.py:\d+ in stuck"):
        run_ranks(stuck, [(np.zeros(1, np.float32), r) for r in range(2)], timeout_s=0.2)
    assert time.monotonic() - t0 < 30  # bounded; never a hang


def test_a_debugger_trace_function_is_recognised_and_a_plain_tracer_is_not() -> None:
    import pdb

    from trnopt.kernels.sim.watchdog import _is_debugger, debugging

    assert _is_debugger(pdb.Pdb().trace_dispatch)
    assert not _is_debugger(lambda frame, event, arg: None)
    assert not debugging()


def test_time_limit_stops_a_busy_run_and_its_ranks():
    """A run still issuing instructions at its time limit stops (RunTimeLimitError), and its
    rank threads stop at their next instruction instead of running on in the background."""
    import threading

    from trnopt.kernels.sim.runner import time_limit
    from trnopt.kernels.sim.watchdog import RunTimeLimitError

    @nki.jit
    def busy(x):
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        for _ in range(10**9):
            nisa.dma_copy(dst=t, src=x)
        return x

    before = threading.active_count()
    with time_limit(0.3), pytest.raises(RunTimeLimitError, match="time limit"):
        run_ranks(busy, [(TensorSpec((128, 128), np.float32),)] * 2, numerics=False, symmetric=False)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
    with time_limit(0.0), pytest.raises(RunTimeLimitError, match="not started"):
        run_ranks(busy, [(TensorSpec((128, 128), np.float32),)], numerics=False)
