"""The tile-level nki.language functions: ``nl.add(a, b)`` on tiles makes a new SBUF tile.

"nki.language" (NKI 0.7): the math functions (``nl.add``, ``nl.exp``, ...) take tiles (or
scalars) and return a new tile; ``nl.load`` / ``nl.store`` move tiles between HBM and
SBUF; ``nl.matmul`` / ``nl.transpose`` return PSUM tiles; the reductions (``nl.sum``,
``nl.max``, ...) reduce free axes (never the partition axis 0, and only the last
contiguous ones). The same functions serve as the ``op`` of ISA instructions, where the
simulator calls them on NumPy arrays.

Each tile call is one instruction on the engine the compiler would pick for it
(ASSUMPTION: arithmetic on Vector, transcendental functions on Scalar, loads and stores
on DMA, matmul and transpose on Tensor), with the elementwise / DMA / matmul durations
of ``rates``. Arithmetic runs in FP32 (bitwise and shift functions on the integers) and
the result is cast to ``dtype`` (default: the dtype of the first tile operand).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from . import checks, rates
from .errors import ConstraintError, SimulatorError
from .state import BLAS_LOCK, current
from .tensor import MemoryRegion, NkiTensor

INTEGER_OPS = {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert"}
SCALAR_ENGINE_OPS = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "silu", "silu_dx", "gelu",
                     "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "erf",
                     "erf_dx", "sin", "cos", "tan", "arctan", "softplus", "mish", "square", "copy"}


def _ctx(op: str) -> Any:
    ctx = current()
    if ctx is None:
        raise SimulatorError(f"nl.{op} called outside a simulated kernel (use nki.simulate or run_ranks)")
    return ctx


def has_tile(*xs: Any) -> bool:
    return any(isinstance(x, NkiTensor) for x in xs)


def _operand_shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, NkiTensor) else ()


def _values(ctx: Any, op: str, xs: tuple, integer: bool) -> list[Any]:
    out = []
    for i, x in enumerate(xs):
        if isinstance(x, NkiTensor):
            a = ctx.read(x, f"nl.{op}", None, f"operand {i}")
            out.append(np.asarray(a) if integer else np.asarray(a).astype(np.float32))
        else:
            out.append(x if integer else np.float32(x))
    return out


def new_tile(ctx: Any, op: str, shape: tuple[int, ...], dtype: Any, buffer: MemoryRegion = MemoryRegion.sbuf) -> NkiTensor:
    return ctx.allocate(shape, dtype, buffer, op=f"nl.{op}")


def elementwise(op: str, fn: Callable[..., Any], xs: tuple, dtype: Any, shape: Any = None) -> NkiTensor:
    """``fn`` of tiles and scalars into a new SBUF tile of the broadcast shape (or ``shape``)."""
    ctx = _ctx(op)
    w = ctx.where(f"nl.{op}")
    tiles = [x for x in xs if isinstance(x, NkiTensor)]
    for t in tiles:
        checks.on_chip(t, w, "operand")
    try:
        shape = np.broadcast_shapes(*[_operand_shape(x) for x in xs], *(() if shape is None else (shape,)))
    except ValueError:
        raise ConstraintError(f"{w}: operand shapes {[_operand_shape(x) for x in xs]} do not broadcast") from None
    out_dtype = np.dtype(dtype) if dtype is not None else tiles[0].dtype
    out = new_tile(ctx, op, tuple(shape), out_dtype)
    if ctx.numerics:
        vals = _values(ctx, op, xs, op in INTEGER_OPS)
        ctx.write(out, np.broadcast_to(np.asarray(fn(*vals)), shape))
    engine = "Scalar" if op in SCALAR_ENGINE_OPS else "Vector"
    ctx.issue(f"nl.{op}", None, engine, rates.elementwise_seconds(checks.free_size(out)), tiles, [out])
    return out


def _axes(x: NkiTensor, axis: Any, w: str) -> tuple[int, ...]:
    axes = tuple(sorted(int(a) % x.ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,))))
    if 0 in axes or axes != tuple(range(x.ndim - len(axes), x.ndim)):
        raise ConstraintError(f"{w}: axis {axis} must be the last contiguous free dims of a tile of shape "
                              f"{x.shape} (never the partition dim 0)")
    return axes


def reduction(op: str, fn: Callable[..., Any], x: Any, axis: Any, dtype: Any, keepdims: bool) -> NkiTensor:
    """``fn(values, axis=axes, keepdims=...)`` over free axes of tile ``x``, into a new SBUF tile."""
    ctx = _ctx(op)
    w = ctx.where(f"nl.{op}")
    x = checks.tensor_arg(x, w, "x")
    checks.on_chip(x, w, "x")
    axes = _axes(x, axis, w)
    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdims else \
        tuple(n for d, n in enumerate(x.shape) if d not in axes)
    out = new_tile(ctx, op, shape, dtype if dtype is not None else x.dtype)
    if ctx.numerics:
        v = np.asarray(ctx.read(x, f"nl.{op}", None, "x")).astype(np.float32)
        ctx.write(out, np.asarray(fn(v, axis=axes, keepdims=keepdims)).reshape(shape))
    ctx.issue(f"nl.{op}", None, "Vector", rates.elementwise_seconds(checks.free_size(x)), [x], [out])
    return out


def load(src: Any, dtype: Any) -> NkiTensor:
    """A new SBUF tile holding ``src`` (HBM), by DMA."""
    ctx = _ctx("load")
    w = ctx.where("nl.load")
    src = checks.tensor_arg(src, w, "src")
    if src.ndim == 0:
        raise ConstraintError(f"{w}: cannot load a 0-d view")
    checks.partition_dim(src.shape[0], w, f"loaded tile shape {src.shape}")
    out = new_tile(ctx, "load", src.shape, dtype if dtype is not None else src.dtype)
    checks.dma(out, src, w)
    if ctx.numerics:
        ctx.write(out, np.asarray(ctx.read(src, "nl.load", None, "src")).astype(np.float32)
                  if out.dtype != src.dtype else ctx.read(src, "nl.load", None, "src"))
    ctx.issue_dma("nl.load", None, src.nbytes, [src], [out])
    return out


def store(dst: Any, value: Any) -> None:
    """Copy the tile ``value`` into ``dst`` by DMA (converting to dst's dtype)."""
    ctx = _ctx("store")
    w = ctx.where("nl.store")
    dst, value = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(value, w, "value")
    if value.shape != dst.shape and value.size == dst.size:
        value = value.reshape(dst.shape) if value.is_contiguous() else value
    checks.dma(dst, value, w)
    if ctx.numerics:
        # a DMA moves bytes, written or not (as isa.dma_copy): unwritten elements move along as
        # unwritten (NaN), refused where they are used; a tile nothing has written is refused here
        data, mask = ctx.read_moved(value, "nl.store", None, "value")
        ctx.write_moved(dst, (np.asarray(data).astype(np.float32) if value.dtype != dst.dtype else data)
                        .reshape(dst.shape), None if mask is None else mask.reshape(dst.shape))
    ctx.issue_dma("nl.store", None, value.nbytes, [value], [dst])


def matmul(x: Any, y: Any, transpose_x: bool) -> NkiTensor:
    """``x @ y`` (or ``x.T @ y`` with transpose_x) into a new FP32 PSUM tile on the Tensor engine."""
    ctx = _ctx("matmul")
    w = ctx.where("nl.matmul")
    x, y = checks.tensor_arg(x, w, "x"), checks.tensor_arg(y, w, "y")
    checks.on_chip(x, w, "x")
    checks.on_chip(y, w, "y")
    kx, m = (x.shape[0], checks.free_size(x)) if transpose_x else (checks.free_size(x), x.shape[0])
    if kx != y.shape[0]:
        raise ConstraintError(f"{w}: contraction dims differ: x {x.shape} (transpose_x={transpose_x}) vs y {y.shape}")
    n = checks.free_size(y)
    if m > rates.GEMM_STATIONARY_FMAX or n > rates.GEMM_MOVING_FMAX or kx > rates.PMAX:
        raise ConstraintError(f"{w}: matmul of [{kx}, {m}] and [{kx}, {n}] exceeds the tile limits "
                              f"(K <= {rates.PMAX}, M <= {rates.GEMM_STATIONARY_FMAX}, N <= {rates.GEMM_MOVING_FMAX})")
    out = new_tile(ctx, "matmul", (m, n), np.float32, MemoryRegion.psum)
    if ctx.numerics:
        a = np.asarray(ctx.read(x, "nl.matmul", None, "x")).astype(np.float32).reshape(x.shape[0], -1)
        b = np.asarray(ctx.read(y, "nl.matmul", None, "y")).astype(np.float32).reshape(kx, n)
        with BLAS_LOCK:
            r = (a.T if transpose_x else a) @ b
        ctx.write(out, r)
    ctx.issue("nl.matmul", None, "Tensor", rates.matmul_seconds(m, n, x.dtype), [x, y], [out])
    return out


def transpose(x: Any, dtype: Any) -> NkiTensor:
    """The 2-D tile ``x`` with partition and free dims swapped, in PSUM (Tensor engine)."""
    ctx = _ctx("transpose")
    w = ctx.where("nl.transpose")
    x = checks.tensor_arg(x, w, "x")
    checks.on_chip(x, w, "x")
    p, f = x.shape[0], checks.free_size(x)
    checks.partition_dim(f, w, f"transposed tile shape ({f}, {p})")
    out = new_tile(ctx, "transpose", (f, p), dtype if dtype is not None else x.dtype, MemoryRegion.psum)
    if ctx.numerics:
        ctx.write(out, np.asarray(ctx.read(x, "nl.transpose", None, "x")).reshape(p, f).T)
    ctx.issue("nl.transpose", None, "Tensor", rates.matmul_seconds(p, f, x.dtype), [x], [out])
    return out


# --- NumPy definitions of the math functions ("nki.language" page per function) ------------
def erf(a: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    a = np.asarray(a, dtype=np.float64)
    s, x = np.sign(a), np.abs(a)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-x * x)
    return (s * y).astype(np.float32)


def _sigmoid(a: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-a))


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

UNARY: dict[str, Callable[[Any], Any]] = {
    "copy": lambda a: np.array(a), "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a), "reciprocal": lambda a: 1.0 / a, "abs": np.abs,
    "negative": np.negative, "square": np.square, "tanh": np.tanh, "sigmoid": _sigmoid,
    "relu": lambda a: np.maximum(a, 0), "silu": lambda a: a * _sigmoid(a),
    "silu_dx": lambda a: _sigmoid(a) * (1 + a * (1 - _sigmoid(a))),
    "gelu": lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2.0))),
    "gelu_dx": lambda a: 0.5 * (1 + erf(a / math.sqrt(2.0))) + a * np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi),
    "gelu_apprx_tanh": lambda a: 0.5 * a * (1.0 + np.tanh(SQRT_2_OVER_PI * (a + 0.044715 * a ** 3))),
    "gelu_apprx_sigmoid": lambda a: a * _sigmoid(1.702 * a),
    "gelu_apprx_sigmoid_dx": lambda a: _sigmoid(1.702 * a) * (1 + 1.702 * a * (1 - _sigmoid(1.702 * a))),
    "erf": erf, "erf_dx": lambda a: 2.0 / math.sqrt(math.pi) * np.exp(-a * a),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "arctan": np.arctan, "ceil": np.ceil, "floor": np.floor,
    "trunc": np.trunc, "sign": np.sign, "softplus": lambda a: np.logaddexp(0, a),
    "mish": lambda a: a * np.tanh(np.logaddexp(0, a)), "invert": np.invert,
    "logical_not": lambda a: (np.asarray(a) == 0).astype(np.float32),
}

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power, "fmod": np.fmod, "mod": np.mod,
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)), "abs_min": lambda a, b: np.minimum(np.abs(a), np.abs(b)),
    "equal": lambda a, b: np.equal(a, b).astype(np.float32),
    "not_equal": lambda a, b: np.not_equal(a, b).astype(np.float32),
    "greater": lambda a, b: np.greater(a, b).astype(np.float32),
    "greater_equal": lambda a, b: np.greater_equal(a, b).astype(np.float32),
    "less": lambda a, b: np.less(a, b).astype(np.float32),
    "less_equal": lambda a, b: np.less_equal(a, b).astype(np.float32),
    "logical_and": lambda a, b: np.logical_and(a, b).astype(np.float32),
    "logical_or": lambda a, b: np.logical_or(a, b).astype(np.float32),
    "logical_xor": lambda a, b: np.logical_xor(a, b).astype(np.float32),
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": np.right_shift,
}

REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod, "var": np.var,
    "all": lambda a, axis, keepdims: np.all(a != 0, axis=axis, keepdims=keepdims).astype(np.float32),
}
