"""Index expressions of the pre-0.6 NKI API: ``nl.arange``, ``nl.mgrid`` and masks.

"nki.language.arange" / "nki.language.mgrid" (Neuron SDK 2.2x NKI API reference, and the
"NKI Programming Model" page, section "Tensor Indexing"): ``nl.arange(n)[:, None]`` is a
partition index, ``nl.arange(m)[None, :]`` a free index; arithmetic on them gives affine
index expressions, and ``a[i_p, i_f]`` selects the elements at the broadcast of the index
arrays. A comparison of index expressions is a mask ("NKI Programming Model", "Masking"):
an instruction given ``mask=`` touches only the elements where it holds, so an index may
run past the tensor there.

The simulator turns an affine index (every key dim driven by at most one output axis with
a positive step) into an ordinary sliced view of the 0.6+ engines; the masked region must
be a box (the bounding box of the mask, checked to hold everywhere inside).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..errors import ConstraintError
from ..state import here
from ..tensor import NkiTensor


class Mask:
    """A predicate over the index space (a boolean array broadcast like the index arrays)."""

    def __init__(self, v: Any) -> None:
        self.v = np.asarray(v, dtype=bool)

    def _bin(self, o: Any, fn: Any) -> "Mask":
        return Mask(fn(self.v, o.v if isinstance(o, Mask) else bool(o)))

    def __and__(self, o): return self._bin(o, np.logical_and)
    __rand__ = __and__
    def __or__(self, o): return self._bin(o, np.logical_or)
    __ror__ = __or__
    def __invert__(self): return Mask(~self.v)

    def __bool__(self) -> bool:
        # ``(a < n and b < m)`` in a kernel: Python's ``and`` asks the left side for a bool;
        # NKI traces both sides, so a mask is truthy and ``and`` yields the right one.
        # ASSUMPTION: kernels that join masks with ``and`` mean ``&`` (only the right side
        # is kept, as in the traced program of the official toolchain when the left is true).
        return True


class _Arithmetic:
    """``+``, ``-`` and ``*`` of index expressions, both ways round, through the class's ``_bin``."""

    def __add__(self, o): return self._bin(o, operator.add)
    def __radd__(self, o): return self._bin(o, operator.add, True)
    def __sub__(self, o): return self._bin(o, operator.sub)
    def __rsub__(self, o): return self._bin(o, operator.sub, True)
    def __mul__(self, o): return self._bin(o, operator.mul)
    def __rmul__(self, o): return self._bin(o, operator.mul, True)


class Idx(_Arithmetic):
    """An integer index expression: a NumPy array broadcast over the index space."""

    __array_priority__ = 100

    def __init__(self, v: Any) -> None:
        self.v = np.asarray(v, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.v.shape

    def __getitem__(self, k: Any) -> "Idx":
        return Idx(self.v[k])

    def _bin(self, o: Any, fn: Any, rev: bool = False) -> Any:
        if isinstance(o, (NkiTensor, DynIdx)):  # iy + t[0, i]: an index with a runtime part
            return (o if isinstance(o, DynIdx) else DynIdx(o))._bin(self, fn, not rev)
        b = o.v if isinstance(o, Idx) else o
        r = fn(b, self.v) if rev else fn(self.v, b)
        return Mask(r) if r.dtype == bool else Idx(r)

    def __floordiv__(self, o): return self._bin(o, operator.floordiv)
    def __mod__(self, o): return self._bin(o, operator.mod)
    def __neg__(self): return Idx(-self.v)
    def __lt__(self, o): return self._bin(o, operator.lt)
    def __le__(self, o): return self._bin(o, operator.le)
    def __gt__(self, o): return self._bin(o, operator.gt)
    def __ge__(self, o): return self._bin(o, operator.ge)
    def __eq__(self, o): return self._bin(o, operator.eq)  # type: ignore[override]
    def __ne__(self, o): return self._bin(o, operator.ne)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]


class DynIdx(_Arithmetic):
    """An index with a runtime part: ``t[0, i] + iy`` in a subscript, the value of the
    one-element SBUF tile ``t[0, i]`` (read when the view is made, as the engine reads it
    into a register) combined with static index expressions; the view's address is not known
    ahead, so its dependencies cover the whole tensor ("nki.isa.tensor_copy_dynamic_src":
    "the dynamic offset must be a scalar value resided in SBUF", combined with nl.mgrid)."""

    __array_priority__ = 101

    def __init__(self, reg: NkiTensor, fn: Any = None) -> None:
        self.reg, self.fn = reg, fn or (lambda r: r)

    def resolve(self) -> Idx:
        from ..tensor import dynamic_index
        return Idx(self.fn(dynamic_index(self.reg, here("dynamic index"))))

    def _bin(self, o: Any, fn: Any, rev: bool = False) -> "DynIdx":
        f, b = self.fn, (o.v if isinstance(o, Idx) else o)
        return DynIdx(self.reg, (lambda r: fn(b, f(r))) if rev else (lambda r: fn(f(r), b)))



def arange(*args: Any) -> Idx:
    """``nl.arange``: a 1-D index expression, as numpy.arange ("nki.language.arange")."""
    return Idx(np.arange(*[int(a) for a in args]))


class _Grid(tuple):
    """What ``nl.mgrid[...]`` gives: unpackable index arrays, also as ``.p`` and ``.x``
    (``.y``, ``.z`` for further free dims)."""

    @property
    def p(self): return self[0]
    @property
    def x(self): return self[1]
    @property
    def y(self): return self[2]
    @property
    def z(self): return self[3]


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: index arrays over the grid, as numpy.mgrid ("nki.language.mgrid");
    kept open (broadcasting), which selects the same elements as the dense grid."""

    def __getitem__(self, key: Any) -> _Grid:
        key = key if isinstance(key, tuple) else (key,)
        return _Grid(Idx(a) for a in np.ogrid[key])


mgrid = _MGrid()


class IndexedView(NkiTensor):
    """A view built from index expressions; ``legacy_key`` keeps them for a later mask."""

    __slots__ = ("legacy_key",)


class OutOfBounds:
    """An index expression reaching past the tensor: legal only under a mask that keeps
    the access inside; any other use raises ``ConstraintError`` naming the instruction."""

    def __init__(self, base: NkiTensor, key: tuple, why: str) -> None:
        self.base, self.legacy_key, self.why = base, key, why

    @property
    def shape(self) -> tuple[int, ...]:
        return _key_shape(self.legacy_key)

    @property
    def dtype(self) -> Any:
        return self.base.dtype

    def refuse(self, op: str) -> None:
        raise ConstraintError(f"{here(op)}: {self.why}")


def _key_shape(key: tuple) -> tuple[int, ...]:
    return np.broadcast_shapes(*[k.v.shape for k in key if isinstance(k, Idx)])


def has_index(key: Any) -> bool:
    key = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (Idx, DynIdx)) for k in key) or bool(key and isinstance(key[0], NkiTensor))


def _affine(arr: np.ndarray, shape: tuple[int, ...]) -> tuple[int, list[int]] | None:
    a = np.broadcast_to(arr, shape)
    base = int(a[(0,) * len(shape)]) if a.size else 0
    coef = []
    for j, n in enumerate(shape):
        e = [0] * len(shape)
        if n > 1:
            e[j] = 1
            coef.append(int(a[tuple(e)]) - base)
        else:
            coef.append(0)
    expect = base + sum(c * g for c, g in zip(coef, np.indices(shape)))
    return (base, coef) if np.array_equal(expect, a) else None


def view(base: NkiTensor, key: tuple, box: tuple[slice, ...] | None = None) -> NkiTensor:
    """The view ``base[key]`` for index expressions (restricted to ``box`` of the index space)."""
    key = tuple(k if isinstance(k, Idx) else _const(k, base) for k in key)
    if len(key) != base.ndim:
        raise ConstraintError(f"{here()}: {len(key)} indices for a tensor of shape {base.shape}")
    shape = _key_shape(key)
    arrs = [np.broadcast_to(k.v, shape) for k in key]
    if box is not None:
        arrs = [a[box] for a in arrs]
        shape = arrs[0].shape if arrs else shape
    fits = []
    for d, a in enumerate(arrs):
        fit = _affine(a, shape)
        if fit is None:
            raise NotImplementedError(f"{here()}: index on dim {d} of {base.shape} is not affine in the grid")
        fits.append(fit)
    sl, order, used = [], [], set()
    for d, (a, (b, coef)) in enumerate(zip(arrs, fits)):
        axes = [j for j, c in enumerate(coef) if c != 0]
        if len(axes) > 1 or any(coef[j] < 0 for j in axes) or (axes and axes[0] in used):
            return _pattern_view(base, arrs, fits, shape)
        lo = int(a.min()) if a.size else 0
        hi = int(a.max()) if a.size else 0
        if lo < 0 or hi >= base.shape[d]:
            raise ConstraintError(f"{here()}: index [{lo}, {hi}] out of bounds for dim {d} of size "
                                  f"{base.shape[d]} of tensor {base.alloc.label()} shape {base.shape}")
        if axes:
            used.add(axes[0])
            n, step = shape[axes[0]], coef[axes[0]]
            sl.append(slice(b, b + (n - 1) * step + 1, step))
            order.append(axes[0])
        else:
            sl.append(b if not _keeps_dim(d, shape, used, arrs) else slice(b, b + 1))
            if isinstance(sl[-1], slice):
                order.append(None)
    v = NkiTensor.__getitem__(base, tuple(sl))
    return _arrange(v, order, shape)


def _pattern_view(base: NkiTensor, arrs: list, fits: list, shape: tuple[int, ...]) -> NkiTensor:
    """A grid axis driving several dims, or a dim driven by several grid axes (pooling windows,
    ``nl.mgrid`` splits of one dim): the access pattern over the storage, one (stride, count)
    per grid axis, as the hardware's access patterns are ("NKI Programming Model", Tensor Indexing)."""
    for d, a in enumerate(arrs):
        if a.size and (int(a.min()) < 0 or int(a.max()) >= base.shape[d]):
            raise ConstraintError(f"{here()}: index [{int(a.min())}, {int(a.max())}] out of bounds for dim {d} of "
                                  f"size {base.shape[d]} of tensor {base.alloc.label()} shape {base.shape}")
    strides = [s for s, _ in base.pattern]
    offset = base.offset + sum(b * st for (b, _), st in zip(fits, strides))
    pattern = tuple((sum(c[j] * st for (_, c), st in zip(fits, strides)), n) for j, n in enumerate(shape))
    v = NkiTensor(base.alloc, offset, pattern)
    v._dtype = base._dtype
    v._box = tuple((0, n) for n in base.alloc.shape)  # dependency tracking: the whole tensor
    return v


def _const(k: Any, base: NkiTensor) -> Idx:
    if isinstance(k, slice):
        raise NotImplementedError(f"{here()}: a slice beside index expressions on {base.shape} is not simulated")
    return Idx(int(k))


def _keeps_dim(d: int, shape: tuple[int, ...], used: set, arrs: list) -> bool:
    return False


def _arrange(v: NkiTensor, order: list, shape: tuple[int, ...]) -> NkiTensor:
    """Put the view's dims (one per grid axis they follow) in grid order, with size-1 dims for
    the grid axes no tensor dim follows."""
    kept = [o for o in order if o is not None]
    if kept == list(range(len(shape))):
        return v
    pattern = tuple(v.pattern[kept.index(j)] if j in kept else (1, 1) for j in range(len(shape)))
    dims = tuple(v._dims[kept.index(j)] if j in kept else (-1, 0, 1) for j in range(len(shape)))
    out = v._same_lanes(NkiTensor(v.alloc, v.offset, pattern, dims, v._fixed))
    out._box = v._box if v._box is not None else tuple((0, n) for n in v.alloc.shape)
    return out


def bounds_ok(base: NkiTensor, key: tuple) -> str | None:
    """None when every index of ``key`` is inside ``base``, else why not."""
    shape = _key_shape(key)
    for d, k in enumerate(key):
        a = k.v if isinstance(k, Idx) else np.asarray(k)
        if isinstance(k, slice) or a.size == 0:
            continue
        lo, hi = int(a.min()), int(a.max())
        if d < base.ndim and (lo < 0 or hi >= base.shape[d]):
            return (f"index [{lo}, {hi}] out of bounds for dim {d} of size {base.shape[d]} of tensor "
                    f"{base.alloc.label()} shape {base.shape} (grid {shape}, no mask)")
    return None


def _indirect(base: NkiTensor, key: tuple) -> NkiTensor:
    """``t[idx_tile[i_p, 0], i_f]``: rows picked by the values of an SBUF index tile (a DMA
    gather or scatter; "nki.language.load" / "store", indirect indexing), as the 0.6+ engines'
    ``ap(vector_offset=...)`` view."""
    idx = key[0]
    rest = tuple(k if isinstance(k, Idx) else Idx(int(k)) for k in key[1:])
    parts = idx.shape[0]
    shape = tuple(np.broadcast_shapes(*[k.v.shape for k in rest])) if rest else ()
    free = shape[1:] if len(shape) > 1 else shape
    strides = [st for st, _ in base.pattern]
    offset, pattern = 0, [(strides[0], parts)]
    fits = [_affine(np.broadcast_to(k.v, shape).reshape((1,) + free if len(shape) < 2 else shape)[0:1], (1,) + free)
            for k in rest]
    if any(f is None for f in fits):
        raise NotImplementedError(f"{here()}: an indirect index beside non-affine indices is not simulated")
    offset = sum(b * st for (b, _), st in zip(fits, strides[1:]))
    for j, n in enumerate(free, start=1):
        pattern.append((sum(c[j] * st for (_, c), st in zip(fits, strides[1:])), n))
    return base.ap(pattern, offset=offset, vector_offset=idx, indirect_dim=0)


def getitem(base: NkiTensor, key: Any) -> Any:
    """``base[key]`` with index expressions: an IndexedView, or an OutOfBounds placeholder."""
    key = key if isinstance(key, tuple) else (key,)
    if key and isinstance(key[0], NkiTensor):
        return _indirect(base, key + tuple(Idx(np.arange(n).reshape(1, n)) for n in base.shape[len(key):]))
    dynamic = any(isinstance(k, (DynIdx, NkiTensor)) for k in key)
    if dynamic:  # the runtime values, read now (instructions run in program order)
        key = tuple((k if isinstance(k, DynIdx) else DynIdx(k)).resolve() if isinstance(k, (DynIdx, NkiTensor))
                    else k for k in key)
    if len(key) < base.ndim:
        key = key + tuple(Idx(np.arange(n).reshape((1,) * (len(_key_shape(key)) + i) + (n,)))
                          for i, n in enumerate(base.shape[len(key):]))
    why = bounds_ok(base, key)
    if why is not None:
        return OutOfBounds(base, key, why)
    v = view(base, key)
    if dynamic:
        v._dyn = True
        v._box = tuple((0, n) for n in base.alloc.shape)
    out = object.__new__(IndexedView)
    for s in NkiTensor.__slots__:
        object.__setattr__(out, s, getattr(v, s))
    out.legacy_key = (base, key)
    return out


def mask_box(mask: Mask, shape: tuple[int, ...], where: str) -> tuple[slice, ...]:
    """The box of the index space where ``mask`` holds (it must hold everywhere inside)."""
    m = np.broadcast_to(mask.v, shape)
    if not m.any():
        return tuple(slice(0, 0) for _ in shape)
    box = tuple(slice(int(np.nonzero(m.any(axis=tuple(j for j in range(len(shape)) if j != d)))[0].min()),
                      int(np.nonzero(m.any(axis=tuple(j for j in range(len(shape)) if j != d)))[0].max()) + 1)
                for d in range(len(shape)))
    if not m[box].all():
        raise NotImplementedError(f"{where}: a mask that is not a box of the index space is not simulated")
    return box
