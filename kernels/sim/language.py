"""The simulator's ``nki.language`` (nl): dtypes, buffers, tensor creation, ranges, ops.

Over ~450 lines: nki.language is one public namespace of 103 functions; they are thin
wrappers kept together so the API test reads one module.

Names, parameters and defaults follow the "nki.language" API reference (NKI 0.6/0.7,
Neuron SDK 2.32/2.33). The element-wise functions (``add``, ``exp``, ...) serve as the
``op`` argument of ISA instructions and collectives; the simulator evaluates them on
NumPy arrays. Calling them on tiles (the pre-0.6 tile API) is not simulated.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import ml_dtypes
import numpy as np

from . import rates
from . import unimplemented as _unimplemented
from . import tiles as _tiles
from .errors import ConstraintError, SimulatorError, SymmetryError
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
# 4x packed 8-bit (and 4-bit pairs) types of nc_matmul_mx / quantize_mx: 32-bit containers,
# kept distinct from uint32 so that a packed tensor is never taken for integers
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", np.uint32)])
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", np.uint32)])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", np.uint16)])

# --- buffers ------------------------------------------------------------------------------
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = MemoryRegion.private_hbm  # "nki.language": hbm is an alias of private_hbm


class _NKIObjectType(type):
    """Instances of NKIObject classes accept their class attributes as keyword arguments,
    also where ``@dataclass`` saw no annotated fields (``class P(nl.NKIObject): x = None``
    then ``P(x=1)``), as kernels of nki-library construct them. A field the constructor leaves
    out and that has no default is None, as the NKI 0.6+ front end (KLR) initializes it (its
    class tests, interop/test/test_class.py of github.com/leanprover/KLR: ``A()`` of a class
    with ``y : bool`` reads ``a.y == None``), where a Python dataclass raises TypeError."""

    _accepted: dict[type, tuple[bool, frozenset]] = {}
    _required: dict[type, tuple[str, ...]] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        unset = {name: None for name in cls._required_fields()[len(args):] if name not in kwargs}
        kwargs = {**unset, **kwargs}
        if not kwargs:
            return super().__call__(*args)
        acc = _NKIObjectType._accepted.get(cls)
        if acc is None:
            import inspect
            try:
                params = inspect.signature(cls.__init__).parameters
            except (TypeError, ValueError):
                params = {}
            acc = (any(p.kind is p.VAR_KEYWORD for p in params.values()), frozenset(params))
            _NKIObjectType._accepted[cls] = acc
        var_kw, names = acc
        known = {k: v for k, v in kwargs.items() if var_kw or k in names}
        obj = super().__call__(*args, **known)
        for k, v in kwargs.items():
            if k not in known:
                if not hasattr(cls, k):
                    raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {k!r}")
                setattr(obj, k, v)
        return obj

    def _required_fields(cls) -> tuple[str, ...]:
        """The dataclass fields without a default that ``__init__`` takes and requires, in order
        (a class's own ``__init__`` may take others); () for classes that are not dataclasses."""
        req = _NKIObjectType._required.get(cls)
        if req is None:
            import dataclasses
            import inspect
            req = ()
            if dataclasses.is_dataclass(cls):
                params = inspect.signature(cls.__init__).parameters
                req = tuple(f.name for f in dataclasses.fields(cls)
                            if f.name in params and params[f.name].default is inspect.Parameter.empty)
            _NKIObjectType._required[cls] = req
        return req


class NKIObject(metaclass=_NKIObjectType):
    """Base class of NKI kernel dataclasses and configuration objects ("nki.language.NKIObject"):
    keyword arguments set attributes."""

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


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


# --- math functions: on tiles (a new tile, see ``tiles``) or, as the op of ISA instructions,
# on NumPy arrays ----------------------------------------------------------------------------
def _np(xs: tuple, integer: bool) -> list[Any]:
    if integer:
        return [np.asarray(x) for x in xs]
    return [np.asarray(x, dtype=np.float32) if not isinstance(x, np.ndarray) else x for x in xs]


def _cast(r: Any, dtype: Any) -> Any:
    return r if dtype is None else np.asarray(r).astype(dtype)


def _binary(name: str) -> Any:
    fn = _tiles.BINARY[name]

    def op(x, y, dtype=None):
        if _tiles.has_tile(x, y):
            return _tiles.elementwise(name, fn, (x, y), dtype)
        return _cast(fn(*_np((x, y), name in _tiles.INTEGER_OPS)), dtype)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"nl.{name}(x, y): element-wise on tiles (a new SBUF tile) or NumPy arrays."
    return op


def _unary(name: str) -> Any:
    fn = _tiles.UNARY[name]

    def op(x, dtype=None):
        if _tiles.has_tile(x):
            return _tiles.elementwise(name, fn, (x,), dtype)
        return _cast(fn(*_np((x,), name in _tiles.INTEGER_OPS)), dtype)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"nl.{name}(x): element-wise on a tile (a new SBUF tile) or a NumPy array."
    return op


def _reduction(name: str) -> Any:
    fn = _tiles.REDUCTIONS[name]

    def op(x, axis, dtype=None, keepdims=False):
        if _tiles.has_tile(x):
            return _tiles.reduction(name, fn, x, axis, dtype, keepdims)
        return _cast(fn(np.asarray(x, dtype=np.float32), axis=axis, keepdims=keepdims), dtype)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"nl.{name}(x, axis): reduction over free axes of a tile (a new SBUF tile)."
    return op


add, subtract, multiply, divide = (_binary(n) for n in ("add", "subtract", "multiply", "divide"))
maximum, minimum, power, fmod, mod = (_binary(n) for n in ("maximum", "minimum", "power", "fmod", "mod"))
abs_max, abs_min = _binary("abs_max"), _binary("abs_min")
equal, not_equal, greater, greater_equal, less, less_equal = (
    _binary(n) for n in ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"))
logical_and, logical_or, logical_xor = (_binary(n) for n in ("logical_and", "logical_or", "logical_xor"))
bitwise_and, bitwise_or, bitwise_xor = (_binary(n) for n in ("bitwise_and", "bitwise_or", "bitwise_xor"))
left_shift, right_shift = _binary("left_shift"), _binary("right_shift")

copy, exp, log, sqrt, rsqrt, reciprocal = (_unary(n) for n in ("copy", "exp", "log", "sqrt", "rsqrt", "reciprocal"))
abs, negative, square, tanh, sigmoid, relu = (  # noqa: A001 - the reference name
    _unary(n) for n in ("abs", "negative", "square", "tanh", "sigmoid", "relu"))
silu, silu_dx, gelu, gelu_dx = (_unary(n) for n in ("silu", "silu_dx", "gelu", "gelu_dx"))
gelu_apprx_tanh, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx = (
    _unary(n) for n in ("gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx"))
erf, erf_dx, sin, cos, tan, arctan = (_unary(n) for n in ("erf", "erf_dx", "sin", "cos", "tan", "arctan"))
ceil, floor, trunc, sign, softplus, mish = (_unary(n) for n in ("ceil", "floor", "trunc", "sign", "softplus", "mish"))
invert, logical_not = _unary("invert"), _unary("logical_not")

sum, max, min, mean, prod, var = (  # noqa: A001 - the reference names
    _reduction(n) for n in ("sum", "max", "min", "mean", "prod", "var"))
_all_reduction = _reduction("all")


def all(x, axis, dtype=None):  # noqa: A001 - the reference name
    """1 where every element along the free ``axis`` is non-zero, else 0."""
    return _all_reduction(x, axis, dtype)

_REDUCE_OPS = (add, minimum, maximum)


class _AluOp:
    """An ``op`` of ISA instructions that is a name, not a function, of nki.language (bypass, ...)."""

    def __init__(self, name: str, fn: Any) -> None:
        self.__name__, self._fn = name, fn

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"nl.{self.__name__}"


def _op_only(name: str, fn: Any) -> Any:
    return _AluOp(name, fn)


bypass = _op_only("bypass", lambda x, y=None: x)  # passes data through: skips a tensor_scalar stage
average = _op_only("average", lambda x, y=None: x)  # the reduce op of pooling (a mean over the window)
prelu = _op_only("prelu", lambda x, alpha=0.0: np.where(x >= 0, x, x * alpha))


def load(src, dtype=None):
    """A new SBUF tile holding the HBM tensor ``src`` (converted to ``dtype``)."""
    return _tiles.load(src, dtype)


def store(dst, value):
    """Store the SBUF tile ``value`` into the HBM tensor ``dst``."""
    _tiles.store(dst, value)


def matmul(x, y, transpose_x=False):
    """``x @ y`` (``x.T @ y`` with transpose_x) into a new FP32 PSUM tile."""
    return _tiles.matmul(x, y, transpose_x)


def transpose(x, dtype=None):
    """The 2-D tile ``x`` transposed (partition <-> free), in PSUM."""
    return _tiles.transpose(x, dtype)


def load_transpose2d(src, dtype=None):
    """``src`` (a 2-D HBM tensor) loaded into SBUF transposed."""
    return _tiles.load(src.permute((1, 0)) if src.ndim == 2 else src, dtype)


def broadcast_to(x, shape, dtype=None):
    """``x`` broadcast to ``shape`` (same rank; dims of size 1 broadcast), NumPy rules."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape) == shape and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    if len(shape) != x.ndim:
        raise ConstraintError(f"nl.broadcast_to: shape {shape} must have the rank of the tile {x.shape}")
    return _tiles.elementwise("broadcast_to", lambda a: np.broadcast_to(a, shape), (x,), dtype, shape=shape)


def expand_dims(x, axis):
    """A view of ``x`` with a new dim of size 1 at ``axis``."""
    axis = int(axis) % (x.ndim + 1)
    return x.reshape(x.shape[:axis] + (1,) + x.shape[axis:])


def where(condition, x, y, dtype=None):
    """Elements of ``x`` where ``condition`` is non-zero, else of ``y``."""
    return _tiles.elementwise("where", lambda c, a, b: np.where(c != 0, a, b), (condition, x, y),
                              dtype if dtype is not None else next(
                                  t.dtype for t in (x, y, condition) if isinstance(t, NkiTensor)))


def softmax(x, axis=-1, dtype=None):
    """exp(x - max) / sum(exp(x - max)) along free ``axis``."""
    def fn(a):
        ax = tuple(int(v) for v in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        e = np.exp(a - np.max(a, axis=ax, keepdims=True))
        return e / np.sum(e, axis=ax, keepdims=True)
    return _tiles.elementwise("softmax", fn, (x,), dtype)


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """``x / sqrt(sum(x^2 along axis) / n + epsilon) * w``."""
    def fn(a, b):
        ax = tuple(int(v) for v in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        return a / np.sqrt(np.sum(a * a, axis=ax, keepdims=True) / n + epsilon) * b
    return _tiles.elementwise("rms_norm", fn, (x, w), dtype)


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per partition, ``data[p, indices[p, j]]`` over the flattened free dims."""
    def fn(d, i):
        flat = d.reshape(d.shape[0], -1)
        return np.take_along_axis(flat, i.reshape(i.shape[0], -1).astype(np.int64), axis=1).reshape(i.shape)
    ctx = _ctx("gather_flattened")
    out = _tiles.new_tile(ctx, "gather_flattened", tuple(indices.shape), dtype or data.dtype)
    if ctx.numerics:
        ctx.write(out, fn(np.asarray(ctx.read(data, "nl.gather_flattened", None, "data")),
                          np.asarray(ctx.read(indices, "nl.gather_flattened", None, "indices"))))
    ctx.issue("nl.gather_flattened", None, "GpSimd", rates.elementwise_seconds(indices.size // indices.shape[0]),
              [data, indices], [out])
    return out


def device_print(print_prefix, tensor):
    """Print ``print_prefix`` and the tensor's values to stdout (as the CPU simulator does)."""
    ctx = _ctx("device_print")
    if ctx.numerics and isinstance(tensor, NkiTensor):
        print(print_prefix, np.array(tensor.array()))
    else:
        print(print_prefix, tensor)


def dynamic_range(start, stop=None, step=1):
    """A loop run on the device with register (or int) bounds; ``step`` a positive int."""
    from .registers import runtime_int
    if isinstance(step, VirtualRegister) or int(step) <= 0:
        raise ConstraintError(f"nl.dynamic_range: step must be a positive compile-time int, got {step!r}")
    lo, hi = (0, start) if stop is None else (start, stop)
    ctx = _ctx("dynamic_range")
    for b in (lo, hi):
        if isinstance(b, VirtualRegister) and b.lanes is not None and ctx.rendezvous.symmetric:
            raise SymmetryError(f"{ctx.where('nl.dynamic_range')}: loop bound differs between ranks; a "
                                f"symmetric run cannot follow the other ranks' loops (run with symmetric=False)")
    return (VirtualRegister(i, frozen=True) for i in range(runtime_int(lo, "dynamic_range start"),
                                                           runtime_int(hi, "dynamic_range stop"), int(step)))


def fori_loop(lower, upper, body_fun, step=1):
    """``body_fun(i)`` for i in [lower, upper) by ``step``, ``i`` a register."""
    for i in dynamic_range(lower, upper, step):
        body_fun(i)


def while_loop(init, body_fun):
    """Run ``body_fun`` while the register ``init`` is non-zero (body_fun updates it)."""
    from .registers import runtime_int
    while runtime_int(init, "while_loop condition") != 0:
        body_fun()


def no_reorder():
    """A block whose instructions the compiler keeps in program order (the simulator runs
    every instruction in program order already)."""
    import contextlib
    return contextlib.nullcontext()


def shared_constant(constant):
    """A shared_hbm tensor holding ``constant`` (an array or a .npy path)."""
    arr = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    ctx = _ctx("shared_constant")
    t = ctx.allocate(arr.shape, arr.dtype, shared_hbm, op="nl.shared_constant")
    if ctx.numerics:
        ctx.write(t, arr)
    elif t.alloc.written is not None:
        t.alloc.written[...] = True
    return t


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An n x n identity matrix in SBUF (into ``dst`` when given)."""
    ctx = _ctx("shared_identity_matrix")
    t = dst if dst is not None else ctx.allocate((n, n), dtype, sbuf, op="nl.shared_identity_matrix")
    if ctx.numerics:
        ctx.write(t, np.eye(n, dtype=np.float32))
    ctx.issue("nl.shared_identity_matrix", None, "GpSimd", rates.elementwise_seconds(n), [], [t])
    return t


def _rng_state() -> Any:
    ctx = _ctx("rand")
    if not hasattr(ctx, "rng"):
        ctx.rng = np.random.default_rng(0)
    return ctx


def random_seed(seed):
    """Seed the random numbers of ``nl.rand`` / ``nl.dropout`` (per program)."""
    ctx = _rng_state()
    seed_v = np.asarray(ctx.read(seed, "nl.random_seed", None, "seed")).reshape(-1)[0] \
        if isinstance(seed, NkiTensor) and ctx.numerics else seed
    ctx.rng = np.random.default_rng(int(seed_v) if not isinstance(seed_v, NkiTensor) else 0)


def rand(shape, dtype, buffer=sbuf, name=''):
    """A new tile of uniform random numbers in [0, 1)."""
    ctx = _rng_state()
    t = ctx.allocate(shape, dtype, buffer, name, op="nl.rand")
    if ctx.numerics:
        ctx.write(t, ctx.rng.random(t.shape, dtype=np.float32))
    ctx.issue("nl.rand", name or None, "GpSimd", rates.elementwise_seconds(_free_size(t)), [], [t])
    return t


def dropout(x, rate, dtype=None):
    """Elements of ``x`` zeroed with probability ``rate`` (scaled by 1 / (1 - rate))."""
    ctx = _rng_state()
    r = float(rate) if not isinstance(rate, NkiTensor) else float(np.asarray(ctx.read(rate, "nl.dropout", None,
                                                                                       "rate")).reshape(-1)[0])
    keep = ctx.rng.random(x.shape) >= r if ctx.numerics else None
    return _tiles.elementwise("dropout", lambda a: np.where(keep, a / (1 - r), 0) if keep is not None else a,
                              (x,), dtype)


def _free_size(t: NkiTensor) -> int:
    return int(math.prod(t.shape[1:])) if t.ndim > 1 else 1


_unimplemented.fill(globals(), "nki.language")


# --- names the real package has beyond the reference table ----------------------------------
# nki-library's kernels use them (apicheck.BEYOND_TABLE names where); set last, as they
# shadow builtins that the functions above must keep.
range = builtins.range  # noqa: A001 - the "nki.language.affine_range" page: "an alias for Python's range()"
bool = bool_  # noqa: A001 - "Boolean (True or False) stored as a byte" (nki.language.bool_)
