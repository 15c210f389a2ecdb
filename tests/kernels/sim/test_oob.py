"""dma_copy with out-of-bounds gather/scatter indices ("nki.isa.dma_copy", oob_mode): an error by
default; with oob_mode.skip the transfer of each out-of-bounds index is skipped."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.sim import run_ranks
from trnopt.kernels.sim import isa as nisa
from trnopt.kernels.sim import language as nl
from trnopt.kernels.sim import nki
from trnopt.kernels.sim.errors import ConstraintError


@nki.jit
def gather_kernel(table, idx, skip):
    """out[p] = table[idx[p]] for in-bounds indices; the other rows keep the memset -7."""
    n, f = table.shape
    parts = idx.shape[0]
    ix = nl.ndarray((parts, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    rows = nl.ndarray((parts, f), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=rows, value=-7.0)
    nisa.dma_copy(dst=rows, src=table.ap(pattern=[[f, parts], [1, f]], offset=0, vector_offset=ix, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
    out = nl.ndarray((parts, f), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=rows)
    return out


@nki.jit
def scatter_kernel(src, idx, n):
    """out[idx[p]] = src[p] for in-bounds indices; rows nothing scatters to stay 0."""
    parts, f = src.shape
    ix = nl.ndarray((parts, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    data = nl.ndarray((parts, f), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=data, src=src)
    zeros = nl.ndarray((n, f), dtype=src.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    out = nl.ndarray((n, f), dtype=src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=zeros)
    nisa.dma_copy(dst=out.ap(pattern=[[f, parts], [1, f]], offset=0, vector_offset=ix, indirect_dim=0), src=data,
                  oob_mode=nisa.oob_mode.skip)
    return out


def _table(n=16, f=8):
    return np.arange(n * f, dtype=np.float32).reshape(n, f)


def test_gather_skips_out_of_bounds_indices():
    table = _table()
    idx = np.array([[3], [-1], [15], [16], [0], [-5]], np.int32)
    got = run_ranks(gather_kernel, [(table, idx)], kwargs={"skip": True}).outputs[0]
    want = np.full((6, 8), -7.0, np.float32)
    for p, i in enumerate(idx[:, 0]):
        if 0 <= i < 16:
            want[p] = table[i]
    assert np.array_equal(got, want)


def test_gather_out_of_bounds_is_an_error_by_default():
    idx = np.array([[3], [-1]], np.int32)
    with pytest.raises(ConstraintError, match="vector_offset index -1 of partition 1"):
        run_ranks(gather_kernel, [(_table(), idx)], kwargs={"skip": False})


def test_scatter_skips_out_of_bounds_indices():
    src = _table(4, 8) + 1
    idx = np.array([[2], [-1], [7], [9]], np.int32)
    got = run_ranks(scatter_kernel, [(src, idx)], kwargs={"n": 8}).outputs[0]
    want = np.zeros((8, 8), np.float32)
    want[2], want[7] = src[0], src[2]
    assert np.array_equal(got, want)
