"""The Fused Mamba tutorial's kernels (aws-neuron-sdk, nki/guides/tutorials/fused_mamba.rst:
mamba_v1, mamba_v2, mamba_v3), written here from the page's description for
``sim_vs_device.py`` (no AWS code is copied or run)."""

from __future__ import annotations

from trnopt.kernels.sim import isa as nisa
from trnopt.kernels.sim import language as nl
from trnopt.kernels.sim import nki

TN = 512  # nl.tile_size.gemm_moving_fmax (and psum_fmax for FP32): columns per broadcast matmul

# The Fused Mamba kernels. B and C rows are loaded into one partition and broadcast to 128
# partitions on TensorE into PSUM, 512 columns (one PSUM bank, nl.tile_size.gemm_moving_fmax)
# per matmul, as the page describes ("partition-dim broadcast often requires a separate
# instruction on TensorE"); the multiply that consumes a broadcast then reads one input from
# PSUM (nki.isa.tensor_tensor cost: N cycles, not 2N).
def _load_row(src, name):
    """A [1, L] row of ``src`` in one SBUF partition."""
    row = nl.ndarray((1, src.shape[-1]), dtype=src.dtype, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=row, src=src)
    return row


def _times_row(dst, data, ones, row, c0=0):
    """dst = data * (columns [c0, c0 + free) of ``row`` broadcast to 128 partitions), one
    tensor_tensor as the page writes it. The broadcast is ones[1, 128]^T @ row on TensorE,
    512 columns per matmul (one PSUM bank: nl.tile_size.psum_fmax, gemm_moving_fmax). A
    broadcast of at most one bank is read from PSUM; a wider one cannot be one PSUM tile, so
    it is copied bank by bank into an SBUF tile (on ScalarE, the engine with the least work in
    these kernels: nisa.tensor_copy's default lets the compiler pick by workload) and the
    multiply reads two SBUF inputs."""
    free = data.shape[1]
    if free <= TN:
        bc = nl.ndarray((128, free), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=bc, stationary=ones, moving=row[:, c0:c0 + free])
    else:
        bc = nl.ndarray((128, free), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(0, free, TN):
            w = min(TN, free - j)
            part = nl.ndarray((128, w), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=part, stationary=ones, moving=row[:, c0 + j:c0 + j + w])
            nisa.tensor_copy(dst=bc[:, j:j + w], src=part, engine=nisa.scalar_engine)
    nisa.tensor_tensor(dst=dst, data1=data, data2=bc, op=nl.multiply)


def _ones(dtype):
    ones = nl.ndarray((1, 128), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    return ones


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """The fused Mamba tutorial's first kernel, from its description: per batch, per state,
    per 128-channel tile: load delta and u ([128, L]), A's column for the state, B's and C's
    row for the state; exp(delta * A) in one ScalarE activation, delta * u * B in two
    tensor_tensor, the associative scan (tensor_tensor_scan, multiply then add), times C,
    accumulated over the states (tensor_tensor add) into one zeroed accumulator per channel
    tile; store per tile at the end of the batch."""
    nb, channels, L = delta.shape
    n_state = A.shape[1]
    out = nl.ndarray((nb, channels, L), dtype=delta.dtype, buffer=nl.hbm)
    ones = _ones(delta.dtype)
    for b in nl.affine_range(nb):
        accs = [nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf) for _ in range(channels // 128)]
        for acc in accs:  # the page's scanC_accum = nl.zeros(...), added to at every state
            nisa.memset(dst=acc, value=0.0)
        for s in nl.affine_range(n_state):
            for t in nl.affine_range(channels // 128):
                c0 = t * 128
                d_i = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                u_i = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                a_i = nl.ndarray((128, 1), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=d_i, src=delta[b, c0:c0 + 128, :])
                nisa.dma_copy(dst=a_i, src=A[c0:c0 + 128, s:s + 1])
                dA = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.activation(dst=dA, op=nl.exp, data=d_i, scale=a_i)
                nisa.dma_copy(dst=u_i, src=u[b, c0:c0 + 128, :])
                b_i = _load_row(B[b, s:s + 1, :], "B_i")
                dU = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=dU, data1=d_i, data2=u_i, op=nl.multiply)
                dBu = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                _times_row(dBu, dU, ones, b_i)
                scan = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor_scan(dst=scan, data0=dA, data1=dBu, initial=0.0, op0=nl.multiply, op1=nl.add)
                c_i = _load_row(C[b, s:s + 1, :], "C_i")
                _times_row(scan, scan, ones, c_i)
                nisa.tensor_tensor(dst=accs[t], data1=accs[t], data2=scan, op=nl.add)
        for t in nl.affine_range(channels // 128):
            nisa.dma_copy(dst=out[b, t * 128:(t + 1) * 128, :], src=accs[t])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """The tutorial's mamba_v2: loops [batch, channel tile, state] (``_mamba_reordered``)."""
    return _mamba_reordered(delta, u, A, B, C, 0)


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """The tutorial's mamba_v3: mamba_v2 with seq_len tiled by 512 (``_mamba_reordered``)."""
    return _mamba_reordered(delta, u, A, B, C, 512)


def _mamba_reordered(delta, u, A, B, C, seq_tile):
    """The tutorial's mamba_v2 (``seq_tile=0``) and mamba_v3 (``seq_tile=512``), from the
    page's description. v2: the loops reordered to [batch, channel tile, state]: delta and u
    loaded once per 128-channel tile, one zeroed accumulator per tile, stored at the end of
    the tile; per state the steps of ``mamba_v1``. v3: a fourth, inner-most loop over
    ``seq_tile`` columns of seq_len for the per-state steps (delta, u and the accumulator stay
    whole), the scan carried from tile to tile through its ``initial`` (the previous tile's
    last column).

    delta * u does not depend on the state: it is computed once per channel tile (loop-
    invariant code motion). The page's own profile figures require it: VectorE was active
    92.16% of mamba_v1's 2.34 ms (2.16 ms) and 99.63% of mamba_v2's 1.61 ms (1.60 ms) on the
    same instructions otherwise; the 0.55 ms difference is the 512 (state, tile) evaluations
    of one [128, 512] FP32 tensor_tensor (2N + 64 cycles at 1.12 GHz: 0.50 ms)."""
    nb, channels, L = delta.shape
    n_state = A.shape[1]
    ts = min(seq_tile, L) if seq_tile else L
    out = nl.ndarray((nb, channels, L), dtype=delta.dtype, buffer=nl.hbm)
    ones = _ones(delta.dtype)
    for b in nl.affine_range(nb):
        for t in nl.affine_range(channels // 128):
            c0 = t * 128
            acc = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            d_i = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
            u_i = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=d_i, src=delta[b, c0:c0 + 128, :])
            nisa.dma_copy(dst=u_i, src=u[b, c0:c0 + 128, :])
            dU = nl.ndarray((128, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=dU, data1=d_i, data2=u_i, op=nl.multiply)
            for s in nl.affine_range(n_state):
                a_i = nl.ndarray((128, 1), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a_i, src=A[c0:c0 + 128, s:s + 1])
                b_i = _load_row(B[b, s:s + 1, :], "B_i")
                c_i = _load_row(C[b, s:s + 1, :], "C_i")
                init = 0.0
                for j0 in nl.sequential_range(0, L, ts):
                    w = min(ts, L - j0)
                    cols = slice(j0, j0 + w)
                    dA = nl.ndarray((128, w), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.activation(dst=dA, op=nl.exp, data=d_i[:, cols], scale=a_i)
                    dBu = nl.ndarray((128, w), dtype=delta.dtype, buffer=nl.sbuf)
                    _times_row(dBu, dU[:, cols], ones, b_i, j0)
                    scan = nl.ndarray((128, w), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.tensor_tensor_scan(dst=scan, data0=dA, data1=dBu, initial=init, op0=nl.multiply,
                                            op1=nl.add)
                    init = scan[:, w - 1:w]
                    scanC = nl.ndarray((128, w), dtype=delta.dtype, buffer=nl.sbuf)
                    _times_row(scanC, scan, ones, c_i, j0)
                    nisa.tensor_tensor(dst=acc[:, cols], data1=acc[:, cols], data2=scanC, op=nl.add)
            nisa.dma_copy(dst=out[b, c0:c0 + 128, :], src=acc)
    return out
