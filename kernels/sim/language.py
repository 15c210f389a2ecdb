"""The simulator's ``nki.language`` (nl): dtypes, buffers, tensor creation, ranges, ops.

Names, parameters and defaults follow the "nki.language" API reference (NKI 0.6/0.7,
Neuron SDK 2.32/2.33). The element-wise functions (``add``, ``exp``, ...) serve as the
``op`` argument of ISA instructions and collectives; the simulator evaluates them on
NumPy arrays. Calling them on tiles (the pre-0.6 tile API) is not simulated.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from . import rates
from .errors import ConstraintError, SimulatorError
from .state import current as _current
from .registers import VirtualRegister
from .tensor import MemoryRegion, NkiTensor

# --- dtypes (numpy / ml_dtypes); tfloat32 is simulated as float32 -------------------------
DType = np.dtype
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
tfloat32 = np.dtype(np.float32)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
bool_ = np.dtype(np.bool_)

# --- buffers ------------------------------------------------------------------------------
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = MemoryRegion.private_hbm  # "nki.language": hbm is an alias of private_hbm


class NKIObject:
    """Base class of NKI objects (as in the reference)."""


class _TileSize(NKIObject):
    """Hardware tile-size constants ("nki.language.tile_size"), Trn2 values."""

    pmax = rates.PMAX
    gemm_stationary_fmax = rates.GEMM_STATIONARY_FMAX
    gemm_moving_fmax = rates.GEMM_MOVING_FMAX
    psum_num_banks = rates.PSUM_NUM_BANKS
    psum_bank_fmax = rates.PSUM_BANK_FMAX
    psum_bank_fmax_bytes = rates.PSUM_BANK_BYTES
    psum_fmax = rates.PSUM_BANK_FMAX
    psum_min_align = 4
    sbuf_min_align = 1
    sbuf_fmax_bytes = rates.DEFAULT_SBUF_BYTES_PER_PARTITION
    sbuf_fmax = rates.DEFAULT_SBUF_BYTES_PER_PARTITION // 4
    sbuf_size_bytes = rates.DEFAULT_SBUF_BYTES_PER_PARTITION * rates.PMAX
    total_available_sbuf_size = rates.DEFAULT_SBUF_BYTES_PER_PARTITION
    bn_stats_fmax = 512


tile_size = _TileSize()


def _ctx(op: str) -> Any:
    ctx = _current()
    if ctx is None:
        raise SimulatorError(f"nl.{op} called outside a simulated kernel (use nki.simulate or run_ranks)")
    return ctx


# --- tensor creation ----------------------------------------------------------------------
def ndarray(shape, dtype, buffer=sbuf, name='', address=None):
    """A new tensor of ``shape`` in ``buffer``; on-chip tensors have the partition dim first.
    Its memory holds NaN until written."""
    return _ctx("ndarray").allocate(shape, dtype, buffer, name, op="nl.ndarray")


def _filled(op: str, shape: Any, dtype: Any, buffer: MemoryRegion, name: str, value: float) -> NkiTensor:
    ctx = _ctx(op)
    t = ctx.allocate(shape, dtype, buffer, name, op=f"nl.{op}")
    if ctx.numerics:
        ctx.write(t, np.full(t.shape, value, dtype=np.float64 if t.dtype.kind != "V" else np.float32))
    if buffer.on_chip:
        ctx.issue(f"nl.{op}", name or None, "Vector", rates.elementwise_seconds(math.prod(t.shape[1:])), [], [t])
    else:
        ctx.issue_dma(f"nl.{op}", name or None, t.nbytes, [], [t])
    return t


def zeros(shape, dtype, buffer=sbuf, name=''):
    return _filled("zeros", shape, dtype, buffer, name, 0.0)


def ones(shape, dtype, buffer=sbuf, name=''):
    return _filled("ones", shape, dtype, buffer, name, 1.0)


def full(shape, fill_value, dtype, buffer=sbuf, name=''):
    return _filled("full", shape, dtype, buffer, name, fill_value)


def zeros_like(x, dtype=None, buffer=None, name=''):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x, dtype=None, buffer=None, name=''):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def ds(start, size):
    """Dynamic slice ``start : start + size``; ``start`` may be a register (a runtime offset)."""
    if isinstance(start, VirtualRegister):
        return slice(start, start + int(size))
    return slice(int(start), int(start) + int(size))


# --- ranges and programs -----------------------------------------------------------------
def affine_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


def sequential_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


def static_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


def program_id(axis=0):
    """Index of this program along ``axis`` of the launch grid (``kernel[2]``: the physical
    core of an LNC 2 rank; ``kernel[a, b]``: row-major positions in the a x b grid)."""
    ctx = _ctx("program_id")
    grid = ctx.grid
    if not 0 <= int(axis) < len(grid):
        raise ConstraintError(f"{ctx.where('nl.program_id')}: axis {axis} out of range for launch grid {list(grid)}")
    return int(np.unravel_index(ctx.program, grid)[int(axis)])


def num_programs(axes=0):
    """Programs along ``axes`` (an int or a tuple of axes) of the launch grid; None: all."""
    ctx = _ctx("num_programs")
    grid = ctx.grid
    if axes is None:
        return math.prod(grid)
    picked = axes if isinstance(axes, (tuple, list)) else (axes,)
    if any(not 0 <= int(a) < len(grid) for a in picked):
        raise ConstraintError(f"{ctx.where('nl.num_programs')}: axes {axes} out of range for launch grid {list(grid)}")
    return math.prod(grid[int(a)] for a in picked)


def program_ndim():
    """Dimensions of the launch grid."""
    return len(_ctx("program_ndim").grid)


def is_hbm(buffer):
    return buffer in (private_hbm, shared_hbm)


def is_on_chip(buffer):
    return buffer in (sbuf, psum)


def is_psum(buffer):
    return buffer is psum


def is_sbuf(buffer):
    return buffer is sbuf


# --- element-wise functions, used as ``op`` ------------------------------------------------
def _np(op: str, *xs: Any) -> list[np.ndarray]:
    if any(isinstance(x, NkiTensor) for x in xs):
        raise ConstraintError(f"nl.{op} on tiles is not simulated; use it as the op of an ISA "
                              f"instruction, e.g. nisa.tensor_tensor(dst, a, b, op=nl.{op})")
    return [np.asarray(x, dtype=np.float32) if not isinstance(x, np.ndarray) else x for x in xs]


def _cast(r: np.ndarray, dtype: Any) -> np.ndarray:
    return r if dtype is None else r.astype(dtype)


def _binary(name: str, fn: Any) -> Any:
    """``nl.<name>(x, y, dtype=None)``: ``fn`` on NumPy operands, cast to ``dtype``."""
    def op(x, y, dtype=None):
        a, b = _np(name, x, y)
        return _cast(fn(a, b), dtype)
    op.__name__ = op.__qualname__ = name
    return op


def _unary(name: str, fn: Any) -> Any:
    """``nl.<name>(x, dtype=None)``: ``fn`` on a NumPy operand, cast to ``dtype``."""
    def op(x, dtype=None):
        (a,) = _np(name, x)
        return _cast(fn(a), dtype)
    op.__name__ = op.__qualname__ = name
    return op


add = _binary("add", np.add)
subtract = _binary("subtract", np.subtract)
multiply = _binary("multiply", np.multiply)
divide = _binary("divide", np.divide)
maximum = _binary("maximum", np.maximum)
minimum = _binary("minimum", np.minimum)
power = _binary("power", np.power)

copy = _unary("copy", np.array)
exp = _unary("exp", np.exp)
log = _unary("log", np.log)
sqrt = _unary("sqrt", np.sqrt)
rsqrt = _unary("rsqrt", lambda a: 1.0 / np.sqrt(a))
reciprocal = _unary("reciprocal", lambda a: 1.0 / a)
abs = _unary("abs", np.abs)  # noqa: A001 - the reference name
negative = _unary("negative", np.negative)
square = _unary("square", np.square)
tanh = _unary("tanh", np.tanh)
sigmoid = _unary("sigmoid", lambda a: 1.0 / (1.0 + np.exp(-a)))
relu = _unary("relu", lambda a: np.maximum(a, 0))
silu = _unary("silu", lambda a: a / (1.0 + np.exp(-a)))
gelu_apprx_tanh = _unary("gelu_apprx_tanh",
                         lambda a: 0.5 * a * (1.0 + np.tanh(0.7978845608028654 * (a + 0.044715 * a ** 3))))


_REDUCE_OPS = (add, minimum, maximum)
