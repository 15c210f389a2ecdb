"""The constraint checks, one function per rule, each raising ConstraintError with the numbers.

Rules and sources: partition dim <= 128, matmul stationary free <= 128 and moving free
<= 512, matmul reads SBUF and writes PSUM, a matmul result fits one 2 KiB PSUM bank
("nki.isa.nc_matmul", "nki.language.tile_size"); PSUM 8 banks x 2 KiB and SBUF 224 KiB
per partition (Trainium2 architecture guide); DMA cannot read PSUM, moves equal element counts and converts dtypes
through float32 ("nki.isa.dma_copy"); kernel outputs
live in HBM, shared_hbm or nl.hbm (private_hbm), as AWS's "Introduction to NKI Kernel
Optimization" tutorial allocates and runs them; collectives take HBM or SBUF tensors, not a mix
("nki.collectives.all_gather" and siblings).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from . import rates
from .errors import ConstraintError
from .tensor import MemoryRegion, NkiTensor

_FP8 = {np.dtype(ml_dtypes.float8_e4m3), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}
MATMUL_INPUT_DTYPES = {np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)} | _FP8
MATMUL_OUTPUT_DTYPES = {np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)}


def shape_tuple(shape: Any, where: str) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    except (TypeError, ValueError):
        raise ConstraintError(f"{where}: shape must be a tuple of ints, got {shape!r}") from None
    if not out or any(s <= 0 for s in out):
        raise ConstraintError(f"{where}: shape must have positive dims, got {out}")
    return out


def dtype_of(dtype: Any, where: str) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ConstraintError(f"{where}: {dtype!r} is not a dtype (use nl.bfloat16, nl.float32, ...)") from None


def partition_dim(n: int, where: str, what: str) -> None:
    if n > rates.PMAX:
        raise ConstraintError(f"{where}: partition dimension {n} > {rates.PMAX} ({what}); "
                              f"tile dim 0 over the 128 partitions")


def free_size(v: NkiTensor) -> int:
    """Elements per partition of the view."""
    shape = v.shape
    p = v.partitions
    if shape and p == shape[0]:
        return int(math.prod(shape[1:])) if len(shape) > 1 else 1
    return v.size // p if p else 0


def on_chip(v: NkiTensor, where: str, role: str) -> None:
    if not v.buffer.on_chip:
        raise ConstraintError(f"{where}: {role} is in {v.buffer.name}; this instruction works on SBUF/PSUM "
                              f"tiles only (move HBM data with nisa.dma_copy)")
    partition_dim(v.partitions, where, f"{role} shape {v.shape}")


def in_buffer(v: NkiTensor, buffers: Sequence[MemoryRegion], where: str, role: str) -> None:
    if v.buffer not in buffers:
        names = " or ".join(b.name for b in buffers)
        raise ConstraintError(f"{where}: {role} must be in {names}, but tensor {v.alloc.label()} "
                              f"is in {v.buffer.name}")


def tensor_arg(v: Any, where: str, role: str) -> NkiTensor:
    if not isinstance(v, NkiTensor):
        raise ConstraintError(f"{where}: {role} must be an NKI tensor, got {type(v).__name__}")
    return v


def same_partitions(a: NkiTensor, b: NkiTensor, where: str, ra: str, rb: str) -> None:
    if a.partitions != b.partitions or free_size(a) != free_size(b):
        raise ConstraintError(f"{where}: shape mismatch: {ra} {a.shape} vs {rb} {b.shape} "
                              f"(partitions and free size must agree)")


def matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, where: str) -> tuple[int, int, int]:
    """Layout, placement and dtype rules of nc_matmul; returns (K, M, N)."""
    in_buffer(stationary, [MemoryRegion.sbuf], where, "matmul stationary")
    in_buffer(moving, [MemoryRegion.sbuf], where, "matmul moving")
    in_buffer(dst, [MemoryRegion.psum], where, "matmul result (dst)")
    k, m, n = stationary.shape[0], free_size(stationary), free_size(moving)
    partition_dim(k, where, f"stationary shape {stationary.shape}")
    if moving.shape[0] != k:
        raise ConstraintError(f"{where}: contraction (partition) dims differ: stationary {stationary.shape} "
                              f"vs moving {moving.shape}")
    if m > rates.GEMM_STATIONARY_FMAX:
        raise ConstraintError(f"{where}: matmul stationary free size {m} > {rates.GEMM_STATIONARY_FMAX} "
                              f"(stationary shape {stationary.shape})")
    if n > rates.GEMM_MOVING_FMAX:
        raise ConstraintError(f"{where}: matmul moving free size {n} > {rates.GEMM_MOVING_FMAX} "
                              f"(moving shape {moving.shape})")
    if dst.shape[0] != m or free_size(dst) != n:
        raise ConstraintError(f"{where}: matmul result shape {dst.shape} != [{m}, {n}] "
                              f"(stationary {stationary.shape}, moving {moving.shape})")
    if free_size(dst) * dst.dtype.itemsize > rates.PSUM_BANK_BYTES:
        raise ConstraintError(f"{where}: matmul result needs {free_size(dst) * dst.dtype.itemsize} bytes "
                              f"per partition > one PSUM bank of {rates.PSUM_BANK_BYTES}")
    for role, v in (("stationary", stationary), ("moving", moving)):
        if v.dtype not in MATMUL_INPUT_DTYPES:
            raise ConstraintError(f"{where}: matmul {role} dtype {v.dtype.name} not supported "
                                  f"(bfloat16, float16, float32, float8)")
    a, b = stationary.dtype, moving.dtype
    if a != b and not (a in _FP8 and b in _FP8):
        raise ConstraintError(f"{where}: dtype mismatch: matmul stationary is {a.name}, moving is {b.name}")
    if dst.dtype not in MATMUL_OUTPUT_DTYPES:
        raise ConstraintError(f"{where}: matmul result dtype {dst.dtype.name} must be float32 or bfloat16")
    return k, m, n


def dma(dst: NkiTensor, src: NkiTensor, where: str) -> None:
    if src.buffer is MemoryRegion.psum:
        raise ConstraintError(f"{where}: DMA cannot read PSUM (src tensor {src.alloc.label()} is in psum); "
                              f"copy it to SBUF with nisa.tensor_copy first")
    if dst.buffer is MemoryRegion.psum:
        raise ConstraintError(f"{where}: DMA cannot write PSUM (dst tensor {dst.alloc.label()})")
    for role, v in (("dst", dst), ("src", src)):
        if v.buffer.on_chip:
            partition_dim(v.partitions, where, f"{role} shape {v.shape}")
    if dst.size != src.size:
        raise ConstraintError(f"{where}: dst has {dst.size} elements {dst.shape} but src has {src.size} "
                              f"{src.shape}; a DMA copies equal element counts")


def kernel_output(v: Any, where: str) -> None:
    if isinstance(v, NkiTensor) and not v.buffer.is_hbm:
        raise ConstraintError(f"{where}: kernel output {v.alloc.label()} is in {v.buffer.name}; kernel "
                              f"outputs must be allocated in HBM (buffer=nl.shared_hbm or nl.hbm)")
    if isinstance(v, NkiTensor) and v.alloc.collective_touched:
        raise ConstraintError(f"{where}: kernel output {v.alloc.label()} is used by collective "
                              f"{v.alloc.collective_touched}; collectives must use internal buffers, "
                              f"then copy into the output")
