"""``neuronxcc.nki.language`` (the pre-0.6 NKI API) over the simulator's engines.

Follows the "nki.language" API reference of Neuron SDK 2.2x (aws-neuron-sdk,
nki/api/nki.language.rst at the pre-0.6 docs) and the "NKI Programming Model" page:
every function takes ``mask=`` (the elements it touches) and the math functions return a
new tile; ``nl.load(t[i_p, i_f], mask=...)`` / ``nl.store(t[...], value=..., mask=...)``;
``nl.par_dim(n)`` marks the partition dim of a shape; ``nl.arange`` / ``nl.mgrid`` index.
The functions are those of the 0.6+ module (``kernels.sim.language``) with the mask
applied around them: the masked box of the index space is what the instruction runs on.
"""

from __future__ import annotations

import builtins
import operator
import math
import functools
from typing import Any

import numpy as np

from .. import language as _nl
from ..errors import ConstraintError
from ..state import here
from ..tensor import NkiTensor
from . import index as _ix
from .index import Idx, Mask, OutOfBounds, arange, mgrid  # noqa: F401 - the public names

_SKIP = {"ndarray", "zeros", "ones", "full", "load", "store", "rand", "shared_constant", "affine_range",
         "sequential_range", "static_range", "ds", "program_id", "num_programs", "program_ndim"}


def resolve(x: Any, op: str, box: tuple | None = None, shape: tuple | None = None) -> Any:
    """An instruction's operand as a plain view: an OutOfBounds access needs a mask's box."""
    if isinstance(x, OutOfBounds):
        if box is None:
            x.refuse(op)
        base, key = x.base, x.legacy_key
        return _ix.view(base, key, _fit(box, _ix._key_shape(key)))
    if box is not None and isinstance(x, _ix.IndexedView):
        base, key = x.legacy_key
        return _ix.view(base, key, _fit(box, _ix._key_shape(key)))
    if box is not None and isinstance(x, NkiTensor) and shape is not None and tuple(x.shape) == tuple(shape):
        return x[box]
    return x


def _fit(box: tuple, shape: tuple) -> tuple:
    return tuple(b if n > 1 else slice(0, 1) for b, n in zip(box, shape))


def _shape_of(xs: tuple) -> tuple[int, ...]:
    shapes = [tuple(x.shape) for x in xs if isinstance(x, (NkiTensor, OutOfBounds))]
    return tuple(np.broadcast_shapes(*shapes)) if shapes else ()


def expand(t: NkiTensor, ndim: int) -> NkiTensor:
    """``t`` with size-1 dims appended up to ``ndim``: pre-0.6 tiles broadcast with the
    partition dim aligned ("NKI Programming Model", Broadcasting: a [128] reduction result
    is a [128, 1] tile), where NumPy would align the last dims."""
    k = ndim - t.ndim
    v = NkiTensor(t.alloc, t.offset, t.pattern + ((1, 1),) * k, t._dims + ((-1, 0, 1),) * k, t._fixed)
    v = t._same_lanes(v)
    v._box = t._box if t._box is not None else tuple((0, n) for n in t.alloc.shape)
    return v


def _aligned(args: tuple) -> tuple:
    tiles = [a for a in args if isinstance(a, NkiTensor)]
    if len(tiles) < 2:
        return args
    nd = builtins.max(t.ndim for t in tiles)
    return tuple(expand(a, nd) if isinstance(a, NkiTensor) and 0 < a.ndim < nd else a for a in args)


def _free_axes_last(fn: Any) -> Any:
    """A reduction over any free axes: the tile is viewed with those axes last (the 0.6+
    reduction takes the last contiguous ones)."""
    @functools.wraps(fn)
    def red(x, axis, *args, **kw):
        if isinstance(x, NkiTensor):
            axes = sorted(int(a) % x.ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
            rest = [d for d in range(x.ndim) if d not in axes]
            if rest + axes != list(range(x.ndim)) and 0 not in axes:
                keep = kw.get("keepdims", args[1] if len(args) > 1 else False)
                out = fn(x.permute(tuple(rest + axes)), list(range(len(rest), x.ndim)), *args, **kw)
                return out if not keep else out.reshape(tuple(1 if d in axes else n for d, n in enumerate(x.shape)))
        return fn(x, axis, *args, **kw)
    return red


def masked(fn: Any, op: str) -> Any:
    """``fn`` with the pre-0.6 ``mask=``: the result tile is allocated whole and ``fn`` runs on
    the masked box of its operands ("NKI Programming Model", Masking)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, mask: Any = None, **kw: Any) -> Any:
        args = _aligned(tuple(resolve(a, f"nl.{op}") if mask is None else a for a in args))
        if mask is None:
            return fn(*[resolve(a, f"nl.{op}") for a in args],
                      **{k: resolve(v, f"nl.{op}") for k, v in kw.items()})
        shape = _shape_of(args + tuple(kw.values()))
        box = _ix.mask_box(mask, shape, here(f"nl.{op}"))
        part = fn(*[resolve(a, f"nl.{op}", box, shape) for a in args],
                  **{k: resolve(v, f"nl.{op}", box, shape) for k, v in kw.items()})
        if not isinstance(part, NkiTensor):
            return part
        full = _nl.ndarray(shape if len(shape) == part.ndim else part.shape, part.dtype, part.buffer)
        from .. import isa as _isa
        _isa.tensor_copy(full[_fit(box, full.shape)] if full.shape == shape else full, part)
        return full
    return wrapper


class _ParDim(int):
    """A dim size marked as the partition dim."""


def par_dim(n: int) -> int:
    """``nl.par_dim(n)``: marks the partition dim of a tile shape ("nki.language.par_dim");
    dims left of it are block dims (``(4, par_dim(128), 512)``: 4 tiles of [128, 512])."""
    return _ParDim(int(n))


def _shape(shape: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _par_first(make: Any, shape: Any, buffer: Any) -> Any:
    """Allocate with the partition dim first (the engines' layout), viewed in the kernel's order."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    j = next((i for i, s in enumerate(shape) if isinstance(s, _ParDim)), 0)
    if j == 0 or not _buf(buffer).on_chip:
        return make(_shape(shape))
    order = (j,) + tuple(i for i in range(len(shape)) if i != j)
    t = make(tuple(int(shape[i]) for i in order))
    t.alloc.block_elems = math.prod(int(s) for s in shape[j + 1:])  # each block live on its own
    return t.permute(tuple(order.index(i) for i in range(len(shape))))


def ndarray(shape, dtype, buffer=_nl.sbuf, name='', **kwargs):
    """``nl.ndarray(shape, dtype, buffer=...)``: a new tensor ("nki.language.ndarray"); the
    pre-0.6 default buffer is SBUF, ``nl.hbm`` / ``nl.shared_hbm`` for HBM tensors."""
    return _par_first(lambda s: _nl.ndarray(s, dtype, _buf(buffer), name), shape, buffer)


def _buf(buffer: Any) -> Any:
    if buffer is None:
        return _nl.sbuf
    return getattr(buffer, "buffer", buffer)  # a direct allocation (nki.compiler) names its buffer


def zeros(shape, dtype, buffer=_nl.sbuf, name='', **kwargs):
    return _par_first(lambda s: _nl.zeros(s, dtype, _buf(buffer), name), shape, buffer)


def ones(shape, dtype, buffer=_nl.sbuf, name='', **kwargs):
    return _par_first(lambda s: _nl.ones(s, dtype, _buf(buffer), name), shape, buffer)


def full(shape, fill_value, dtype, buffer=_nl.sbuf, name='', **kwargs):
    return _par_first(lambda s: _nl.full(s, fill_value, dtype, _buf(buffer), name), shape, buffer)


def rand(shape, dtype=_nl.float32, buffer=_nl.sbuf, name='', **kwargs):
    return _nl.rand(_shape(shape), dtype, _buf(buffer), name)


def load(src, mask=None, dtype=None, **kwargs):
    """``nl.load(src, mask=None, dtype=None)``: a new SBUF tile of ``src``'s shape; with a
    mask, only the masked elements are read ("nki.language.load")."""
    if mask is None:
        return _nl.load(resolve(src, "nl.load"), dtype)
    shape = tuple(src.shape)
    box = _ix.mask_box(mask, shape, here("nl.load"))
    tile = _nl.ndarray(shape, dtype or src.dtype, _nl.sbuf)
    _stale(tile)
    if builtins.all(b.stop > b.start for b in box):
        from .. import isa as _isa
        _isa.dma_copy(tile[box], resolve(src, "nl.load", box, shape))
    return tile


def broadcast_to(x, shape, dtype=None, **kwargs):
    """``x`` broadcast to ``shape``; a tile of lower rank first gets trailing size-1 dims
    (partition-aligned, as pre-0.6 tiles broadcast)."""
    x = resolve(x, "nl.broadcast_to")
    if isinstance(x, NkiTensor) and 0 < x.ndim < len(shape):
        x = expand(x, len(shape))
    return _nl.broadcast_to(x, tuple(int(s) for s in shape), dtype)


def _stale(tile: NkiTensor) -> None:
    """The elements a masked load leaves alone hold what SBUF held before: unknown data that
    the kernel may compute on (per partition) and then drop with a masked store. ASSUMPTION:
    the simulator writes NaN there (no instruction), so that such data reaching an output
    shows as NaN rather than stopping the kernel at the first read."""
    from ..state import current
    ctx = current()
    if ctx is not None and ctx.numerics and tile.dtype.kind == "f":
        ctx.write(tile, np.full(tile.shape, np.nan, dtype=np.float32))


def store(dst, value, mask=None, **kwargs):
    """``nl.store(dst, value, mask=None)``: write the tile ``value`` (or a scalar) into HBM
    ``dst``; with a mask only the masked elements ("nki.language.store")."""
    if not isinstance(value, (NkiTensor, OutOfBounds)):
        value = _nl.full(tuple(dst.shape), value, dst.dtype)
    value = _off_psum(value)
    if mask is None:
        d, v = resolve(dst, "nl.store"), resolve(value, "nl.store")
        if isinstance(v, NkiTensor) and tuple(v.shape) != tuple(d.shape) and v.size != d.size:
            v = _nl.broadcast_to(v, d.shape)
        return _nl.store(d, v)
    shape = tuple(dst.shape)
    box = _ix.mask_box(mask, shape, here("nl.store"))
    if builtins.all(b.stop > b.start for b in box):
        _nl.store(resolve(dst, "nl.store", box, shape), resolve(value, "nl.store", box, shape))


def _off_psum(value: Any) -> Any:
    """A PSUM tile stored to HBM goes through SBUF first (DMA cannot read PSUM; the pre-0.6
    examples store ``nisa.nc_matmul`` results directly, so the copy is the compiler's)."""
    if isinstance(value, NkiTensor) and value.buffer is _nl.psum:
        return copy(value)
    return value


def nc(n: int) -> int:
    """``nl.nc(n)``: ``n`` physical NeuronCores as a launch-grid dim ("nki.language.nc")."""
    return int(n)


def spmd_dim(*dims: Any) -> int:
    import math
    return int(math.prod(int(d) for d in dims))


def setitem(self: NkiTensor, key: Any, value: Any) -> None:
    """``t[key] = value`` (pre-0.6 tile assignment): a copy into the view, on an engine for
    on-chip tiles (tensor_copy), by DMA when either side is in HBM, memset for a scalar."""
    from .. import isa as _isa
    view = resolve(self[key], "tile assignment")
    if not isinstance(value, (NkiTensor, OutOfBounds)):
        if view.buffer.on_chip:
            _isa.memset(view, value)
        else:
            _nl.store(view, _nl.full(tuple(view.shape), value, view.dtype))
        return
    value = resolve(value, "tile assignment")
    if 0 < value.ndim < view.ndim:
        value = expand(value, view.ndim)
    if tuple(value.shape) != tuple(view.shape) and value.size != view.size:
        value = _nl.broadcast_to(value, view.shape)
    elif tuple(value.shape) != tuple(view.shape):
        value = value.reshape(view.shape)
    if view.buffer.on_chip and value.buffer.on_chip:
        _isa.tensor_copy(view, value)
    else:
        _isa.dma_copy(view, _off_psum(value))


def affine_range(*args, **kwargs):
    return _nl.affine_range(*args)


def sequential_range(*args, **kwargs):
    return _nl.sequential_range(*args)


def static_range(*args, **kwargs):
    return _nl.static_range(*args)


def ds(start, size):
    return _nl.ds(start, size)


def program_id(axis=0):
    return _nl.program_id(axis)


def num_programs(axes=0):
    return _nl.num_programs(axes)


def program_ndim():
    return _nl.program_ndim()


def shared_constant(constant, dtype=None, **kwargs):
    return _nl.shared_constant(np.asarray(constant, dtype=dtype) if dtype is not None else constant)


class _FInfo:
    def __init__(self, dt: Any) -> None:
        import ml_dtypes
        f = ml_dtypes.finfo(dt)
        self.min, self.max = float(f.min), float(f.max)


fp32 = _FInfo(np.float32)  # "nki.language": nl.fp32.min is the smallest float32
bf16 = _FInfo(_nl.bfloat16)
tfloat32 = _nl.tfloat32
# ASSUMPTION: pre-0.6 kernels allocate their outputs with ``buffer=nl.hbm`` and return them
# (the "nki.isa" examples of that API do, and AWS's simulator runs them), so ``nl.hbm`` is
# the kernel-visible (shared) HBM here, not the private HBM of the 0.6+ alias.
hbm = _nl.shared_hbm
sbuf, psum, shared_hbm, private_hbm = _nl.sbuf, _nl.psum, _nl.shared_hbm, _nl.private_hbm


def _export() -> None:
    g = globals()
    for name in dir(_nl):
        if name.startswith("_") or name in g or name in _SKIP:
            continue
        v = getattr(_nl, name)
        if name in ("sum", "max", "min", "mean", "prod", "var", "all"):
            g[name] = masked(_free_axes_last(v), name)
        elif callable(v) and not isinstance(v, (type, np.dtype)) and getattr(v, "__module__", "").endswith("language"):
            g[name] = masked(v, name)
        elif callable(v) and type(v).__name__ in ("function",):
            g[name] = masked(v, name)
        else:
            g[name] = v


_export()


_INDEX_OPS = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul}


def _tile_op(fn_name: str, rev: bool = False) -> Any:
    def op(self: Any, other: Any) -> Any:
        if isinstance(other, (_ix.Idx, _ix.DynIdx)) and fn_name in _INDEX_OPS:  # t[0, i] + iy: a dynamic index
            return _ix.DynIdx(self)._bin(other, _INDEX_OPS[fn_name], rev)
        fn = globals()[fn_name]
        return fn(other, self) if rev else fn(self, other)
    return op


def _iadd(self: Any, other: Any) -> Any:
    """``acc += nisa.nc_matmul(...)`` on a PSUM tile: the matmuls accumulating into one PSUM
    location form an accumulation group whose first matmul overwrites (the nc_matmul pages: the
    first matmul into a PSUM location writes, later ones accumulate), so onto PSUM that nothing
    has written yet the first ``+=`` of a PSUM result is its value; otherwise ``acc + other``."""
    from ..state import current
    ctx = current()
    if (isinstance(self, NkiTensor) and isinstance(other, NkiTensor) and self.buffer is _nl.psum
            and other.buffer is _nl.psum and ctx is not None and ctx.numerics
            and not np.asarray(self.written_mask()).any()):
        return other
    return globals()["add"](self, other)


def install_operators() -> None:
    """Tile arithmetic (``a + b``, ``a * 2``, ``-a``, ``a < b``) and index-expression
    subscripts (``t[i_p, i_f]``) on the simulator's tensors: the "NKI Programming Model"
    writes tile math as Python operators (each one an nl function on the tiles)."""
    ops = {"__add__": "add", "__sub__": "subtract", "__mul__": "multiply", "__truediv__": "divide",
           "__pow__": "power", "__mod__": "mod", "__lt__": "less", "__le__": "less_equal",
           "__gt__": "greater", "__ge__": "greater_equal", "__and__": "logical_and", "__or__": "logical_or",
           "__xor__": "logical_xor", "__lshift__": "left_shift", "__rshift__": "right_shift"}
    for dunder, fn in ops.items():
        setattr(NkiTensor, dunder, _tile_op(fn))
        if dunder in ("__add__", "__sub__", "__mul__", "__truediv__", "__pow__"):
            setattr(NkiTensor, dunder.replace("__", "__r", 1), _tile_op(fn, rev=True))
    NkiTensor.__iadd__ = _iadd
    NkiTensor.__neg__ = lambda self: globals()["negative"](self)
    NkiTensor.broadcast_to = lambda self, shape: globals()["broadcast_to"](self, shape)
    if "__setitem__" not in NkiTensor.__dict__ or not getattr(NkiTensor.__setitem__, "_legacy", False):
        setitem._legacy = True  # type: ignore[attr-defined]
        setitem._plain = NkiTensor.__dict__.get("__setitem__")  # type: ignore[attr-defined]
        NkiTensor.__setitem__ = setitem
    if not getattr(NkiTensor.__getitem__, "_legacy", False):
        plain = NkiTensor.__getitem__

        def getitem(self: NkiTensor, key: Any) -> Any:
            if _ix.has_index(key):
                return _ix.getitem(self, key)
            return plain(self, key)
        getitem._legacy = True  # type: ignore[attr-defined]
        getitem._plain = plain  # type: ignore[attr-defined]
        NkiTensor.__getitem__ = getitem


def uninstall_operators() -> None:
    """Undo ``install_operators``."""
    for dunder in ("__add__", "__sub__", "__mul__", "__truediv__", "__pow__", "__mod__", "__lt__", "__le__",
                   "__gt__", "__ge__", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "__radd__",
                   "__rsub__", "__rmul__", "__rtruediv__", "__rpow__", "__neg__", "__iadd__", "broadcast_to"):
        if dunder in NkiTensor.__dict__:
            delattr(NkiTensor, dunder)
    if getattr(NkiTensor.__getitem__, "_legacy", False):
        NkiTensor.__getitem__ = NkiTensor.__getitem__._plain
    if getattr(NkiTensor.__setitem__, "_legacy", False):
        NkiTensor.__setitem__ = NkiTensor.__setitem__._plain


from .dynamic import atomic_rmw  # noqa: E402,F401 - nl.atomic_rmw (an HBM read-modify-write)
