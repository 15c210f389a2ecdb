"""Every constraint check, each triggered once by a kernel that breaks it."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import nki, ncc, nisa, nl
from trnopt.kernels.sim import ConstraintError, UninitializedReadError, rates, run_ranks

F32 = np.float32


def sim(kernel, *args, sbuf_bytes_per_partition=None, **kernel_kwargs):
    return run_ranks(kernel, [args], sbuf_bytes_per_partition=sbuf_bytes_per_partition, kwargs=kernel_kwargs)


@nki.jit
def partition_over_128():
    nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)


@nki.jit
def matmul_shapes(k, m, n):
    st = nl.zeros((k, m), dtype=nl.bfloat16, buffer=nl.sbuf)
    mv = nl.zeros((k, n), dtype=nl.bfloat16, buffer=nl.sbuf)
    ps = nl.ndarray((min(m, 128), n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, name="mm")


@nki.jit
def psum_nine_banks():
    """Nine full PSUM banks in use at once: each is written, then all are read."""
    tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
    for t in tiles:
        nisa.memset(dst=t, value=0.0)
    sb = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    for t in tiles:
        nisa.tensor_copy(dst=sb, src=t)


@nki.jit
def psum_tile_over_8_banks():
    """One PSUM tile of 18 KiB per partition: more than PSUM holds, nothing to spill."""
    t = nl.ndarray((128, 4608), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=t, value=0.0)


@nki.jit
def psum_tiles_never_used_together():
    """Nine PSUM tiles referenced from Python, but each used alone: the compiler reuses the space."""
    tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
    sb = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    for t in tiles:
        nisa.memset(dst=t, value=0.0)
        nisa.tensor_copy(dst=sb, src=t)


@nki.jit
def sbuf_two_big_tiles():
    a = nl.ndarray((128, 60000), dtype=nl.bfloat16, buffer=nl.sbuf, name="a")
    b = nl.ndarray((128, 60000), dtype=nl.bfloat16, buffer=nl.sbuf, name="b")
    nisa.memset(dst=a, value=0.0)
    nisa.memset(dst=b, value=0.0)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)


@nki.jit
def sbuf_reuse_in_loop():
    """One 120 KB tile per iteration: the previous one is freed when rebound."""
    for _ in range(4):
        a = nl.ndarray((128, 60000), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=a, value=0.0)


@nki.jit
def matmul_placement(where):
    st = nl.zeros((64, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    mv = nl.zeros((64, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    ps = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    if where == "stationary_in_psum":
        st = nl.zeros((64, 64), dtype=nl.bfloat16, buffer=nl.psum)
    if where == "dst_in_sbuf":
        ps = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv)


@nki.jit
def dma_from_psum():
    ps = nl.zeros((64, 64), dtype=nl.float32, buffer=nl.psum)
    out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=ps)
    return out


@nki.jit
def matmul_dtype_mismatch():
    st = nl.zeros((64, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    mv = nl.zeros((64, 64), dtype=nl.float32, buffer=nl.sbuf)
    ps = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv)


@nki.jit
def oob_slice(x):
    sb = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x[200:328, :])


@nki.jit
def oob_ap(x):
    sb = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x.ap(pattern=[[4, 128], [1, 4]], offset=4 * 200))


@nki.jit
def output_in_private_hbm(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


@nki.jit
def output_in_sbuf(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=x)
    return out


@nki.jit
def collective_on_input(x):
    g = ncc.ReplicaGroup([[0, 1]])
    dst = nl.ndarray((2 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    ncc.all_gather(srcs=[x], dsts=[dst], replica_group=g, collective_dim=0)


@nki.jit
def collective_into_output(x):
    g = ncc.ReplicaGroup([[0, 1]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    out = nl.ndarray((2 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[src], dsts=[out], replica_group=g, collective_dim=0, name="ag")
    return out


@nki.jit
def read_unwritten():
    sb = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf, name="fresh")
    out = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb, name="load")
    return out


def test_partition_dim_over_128() -> None:
    with pytest.raises(ConstraintError, match=r"rank 0, nl.ndarray: partition dimension 256 > 128"):
        sim(partition_over_128)


def test_matmul_stationary_free_over_128() -> None:
    with pytest.raises(ConstraintError, match=r"nc_matmul\(name='mm'\): matmul stationary free size 256 > 128"):
        sim(matmul_shapes, k=128, m=256, n=64)


def test_matmul_moving_free_over_512() -> None:
    with pytest.raises(ConstraintError, match=r"matmul moving free size 1024 > 512"):
        sim(matmul_shapes, k=128, m=128, n=1024)


def test_matmul_contraction_over_128() -> None:
    with pytest.raises(ConstraintError, match=r"partition dimension 256 > 128"):
        sim(matmul_shapes, k=256, m=64, n=64)


def test_psum_over_8_banks_spills_into_sbuf() -> None:
    # nine banks live at once: the compiler spills one (the one read last) into SBUF and
    # reloads it, on the DMA queues; one tile larger than PSUM cannot be spilled
    res = sim(psum_nine_banks)
    assert res.timeline.cores[0].counts["DMA spill"] == 2 * rates.PMAX
    with pytest.raises(ConstraintError, match=r"memset: PSUM over capacity: live tensors need 18432 bytes per "
                                              r"partition > 16384 \(8 banks of 2048 bytes; the tensors this "
                                              r"instruction touches alone exceed it"):
        sim(psum_tile_over_8_banks)
    assert "DMA spill" not in sim(psum_tiles_never_used_together).timeline.cores[0].counts


def test_sbuf_over_224_kib_and_trn3_figure() -> None:
    # the tensor_tensor touches both tiles: nothing can be spilled, the compiler refuses too
    with pytest.raises(ConstraintError, match=r"SBUF over capacity: .* 240000 bytes per partition > 229376 \(224 KiB; "
                                              r"the tensors this instruction touches alone exceed it"):
        sim(sbuf_two_big_tiles)
    sim(sbuf_two_big_tiles, sbuf_bytes_per_partition=rates.SBUF_BYTES_PER_PARTITION["trn3"])
    sim(sbuf_reuse_in_loop)


@pytest.mark.parametrize("where, msg", [("stationary_in_psum", "matmul stationary must be in sbuf"),
                                        ("dst_in_sbuf", r"matmul result \(dst\) must be in psum")])
def test_matmul_placement(where: str, msg: str) -> None:
    with pytest.raises(ConstraintError, match=msg):
        sim(matmul_placement, where=where)


def test_dma_from_psum() -> None:
    with pytest.raises(ConstraintError, match="DMA cannot read PSUM"):
        sim(dma_from_psum)


def test_dtype_mismatches() -> None:
    with pytest.raises(ConstraintError, match="dtype mismatch: matmul stationary is bfloat16, moving is float32"):
        sim(matmul_dtype_mismatch)


def test_out_of_bounds_slice_and_access_pattern() -> None:
    x = np.zeros((256, 4), F32)
    with pytest.raises(ConstraintError, match=r"slice \[200:328:1\] out of bounds for dim 0 of size 256"):
        sim(oob_slice, x)
    with pytest.raises(ConstraintError, match=r"\.ap\(pattern=\[\[4, 128\], \[1, 4\]\], offset=800\) reaches"):
        sim(oob_ap, x)


def test_output_in_hbm_accepted_on_chip_refused() -> None:
    # AWS's kernel-optimization tutorial returns a result allocated with buffer=nl.hbm
    x = np.arange(16, dtype=F32).reshape(4, 4)
    np.testing.assert_array_equal(sim(output_in_private_hbm, x).outputs[0], x)
    with pytest.raises(ConstraintError, match="kernel outputs must be allocated in HBM"):
        sim(output_in_sbuf, x)


def test_collective_on_kernel_input_or_output() -> None:
    xs = [(np.zeros((2, 2), F32),)] * 2
    with pytest.raises(ConstraintError, match="collective src the kernel's own input tensor 'arg0' is in "
                                              "shared_hbm; with LNC degree 1 collective srcs on HBM must be in "
                                              "private_hbm"):
        run_ranks(collective_on_input, xs)
    with pytest.raises(ConstraintError, match=r"collective dst #\d+ is in shared_hbm; with LNC degree 1 a "
                                              r"shared_hbm dst needs NKI_LNC1_SHARED_HBM=1"):
        run_ranks(collective_into_output, xs)


def test_collective_into_output_with_lnc1_shared_hbm(monkeypatch) -> None:
    monkeypatch.setenv("NKI_LNC1_SHARED_HBM", "1")
    xs = [(np.zeros((2, 2), F32),)] * 2
    with pytest.raises(ConstraintError, match=r"kernel output .* is used by collective all_gather\(name='ag'\)"):
        run_ranks(collective_into_output, xs)


def test_uninitialized_read() -> None:
    with pytest.raises(UninitializedReadError, match=r"rank 0, dma_copy\(name='load'\): src reads 64 of 64 elements "
                                                     r"of tensor 'fresh'"):
        sim(read_unwritten)


def test_checks_run_without_numerics() -> None:
    with pytest.raises(ConstraintError, match="PSUM over capacity"):
        run_ranks(psum_tile_over_8_banks, [()], numerics=False)
    with pytest.raises(ConstraintError, match="matmul moving free size 1024 > 512"):
        run_ranks(matmul_shapes, [()], numerics=False, kwargs=dict(k=128, m=128, n=1024))


@nki.jit
def permute_from_shared(x, kind):
    """A collective whose src is a shared_hbm buffer at LNC 1."""
    g = ncc.ReplicaGroup([[0, 1]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray(x.shape if kind == "permute" else (2 * x.shape[0], x.shape[1]), dtype=x.dtype,
                     buffer=nl.private_hbm)
    if kind == "permute":
        ncc.collective_permute_implicit(srcs_by_channel=[[src]], dsts_by_channel=[[dst]], replica_group=g)
    else:
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)


def test_lnc1_private_hbm_rule_applies_to_the_collectives_whose_pages_state_it() -> None:
    """all_gather / all_reduce / reduce_scatter pages (SDK 2.33): LNC 1 srcs on private_hbm;
    collective_permute_implicit's page has no such rule (AWS's ring kernels use shared_hbm)."""
    x = [(np.ones((2, 4), F32),)] * 2
    run_ranks(permute_from_shared, x, kwargs=dict(kind="permute"))
    with pytest.raises(ConstraintError, match="with LNC degree 1 collective srcs on HBM must be in private_hbm"):
        run_ranks(permute_from_shared, x, kwargs=dict(kind="all_gather"))


@nki.jit
def fence_over_half_written(x):
    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:2, :])
    nisa.dma_copy(dst=out[0:2, :], src=t)
    nisa.dma_copy(dst=out, src=out)  # an HBM fence: rows 2-3 were never written
    return out


@nki.jit
def compute_on_half_written(x):
    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:2, :], src=x[0:2, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_dma_moves_unwritten_elements_and_compute_refuses_them() -> None:
    x = np.arange(32, dtype=F32).reshape(4, 8)
    out = run_ranks(fence_over_half_written, [(x,)]).outputs[0]
    assert np.array_equal(out[:2], x[:2]) and np.isnan(out[2:]).all()
    with pytest.raises(UninitializedReadError, match="tensor_scalar"):
        run_ranks(compute_on_half_written, [(x,)])
