"""Tensors: per-rank allocations and the strided views that NKI instructions consume.

Over ~450 lines: the tensor and its access-pattern views are one type (views share
bounds, definedness and dtype reinterpretation); splitting them would split the type.

Follows the "nki.language.NkiTensor" and "NKI Access Patterns" pages: a tensor lives in
one buffer (SBUF, PSUM, private or shared HBM); every view (slicing, ``.ap()``) is an
element offset plus an access pattern ``[[stride, count], ...]`` over the allocation's
row-major storage. On SBUF and PSUM, dim 0 of the allocation is the partition dim.

``ap(offset=...)`` is an element offset added to the view's own offset, and
``scalar_offset`` moves the view by that many strides of dim ``indirect_dim`` ("NkiTensor.ap").
Dynamic offsets (registers, index tensors) are resolved when the view is made, and the
dependency box of a dynamic view is the whole allocation (its address is not known ahead).
Simulator convention (the reference leaves it open): slices must lie inside the tensor
(no clipping) and indices must be non-negative.
"""

from __future__ import annotations

import math
from enum import Enum
from functools import lru_cache
from typing import Any

import numpy as np

from .errors import ConstraintError
from .registers import VirtualRegister, runtime_int
from .state import here


class MemoryRegion(Enum):
    """Memory region of a tensor ("nki.language" page: sbuf, psum, private_hbm, shared_hbm)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def on_chip(self) -> bool:
        return self in (MemoryRegion.sbuf, MemoryRegion.psum)

    @property
    def is_hbm(self) -> bool:
        return self in (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


class Allocation:
    """One allocation of one core: shape, dtype, buffer, and (numerics mode) its data.

    ``data`` is a flat array filled with NaN for float dtypes (so reads of unwritten memory
    show up); ``written`` is a flat bool mask of the elements some instruction has written.
    Both are None when the run records the schedule only (numerics=False).
    """

    __slots__ = ("id", "shape", "dtype", "buffer", "name", "data", "written", "kind",
                 "collective_touched", "strides", "size", "on_chip", "block_elems", "__weakref__")

    def __init__(self, aid: int, shape: tuple[int, ...], dtype: np.dtype, buffer: MemoryRegion,
                 name: str, numerics: bool, kind: str = "internal") -> None:
        self.id = aid
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.buffer = buffer
        self.on_chip = buffer.on_chip
        self.name = name
        self.kind = kind  # "internal", "input" or "output"
        self.collective_touched: str | None = None
        # elements per partition of one block of a pre-0.6 tensor with block dims (each block
        # is live on its own, ``Context.accesses``); 0: the tensor is one block
        self.block_elems = 0
        self.size = int(math.prod(shape))
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        self.strides = tuple(reversed(strides))
        if numerics:
            self.data = np.empty(self.size, dtype=self.dtype)
            if self.dtype.kind == "f" or self.dtype.name in ("bfloat16",) or "float" in self.dtype.name:
                self.data.fill(np.nan)
            else:
                self.data.fill(0)
            self.written = np.zeros(self.size, dtype=bool)
        else:
            self.data = None
            self.written = None

    @property
    def bytes_per_partition(self) -> int:
        """Bytes one partition holds: product of the free dims x itemsize (on-chip tensors)."""
        free = math.prod(self.shape[1:]) if len(self.shape) > 1 else 1
        return int(free) * self.dtype.itemsize

    def label(self) -> str:
        return f"'{self.name}'" if self.name else f"#{self.id}"


def _as_index(k: Any) -> int | None:
    if isinstance(k, (bool, np.bool_)):
        return None
    if isinstance(k, (int, np.integer)):
        return int(k)
    return None


class NkiTensor:
    """A view of an allocation: ``offset`` plus ``pattern`` ((stride, count) per dim).

    ``_dims`` maps each view dim to (alloc dim, first index, step) when the view came from
    slicing (alloc dim -1 after ``.ap()``/reshape); ``_fixed`` holds alloc dims removed by an
    integer index. Both serve the dependency tracking of the timeline (``box``).
    """

    __slots__ = ("alloc", "offset", "pattern", "_dims", "_fixed", "_box", "_shape", "lanes", "_dtype", "_dyn", "_rows",
                 "_oob")

    def __init__(self, alloc: Allocation, offset: int = 0,
                 pattern: tuple[tuple[int, int], ...] | None = None,
                 dims: tuple[tuple[int, int, int], ...] | None = None,
                 fixed: tuple[tuple[int, int], ...] = ()) -> None:
        self.alloc = alloc
        self.offset = offset
        if pattern is None:
            pattern = tuple(zip(alloc.strides, alloc.shape))
            dims = tuple((d, 0, 1) for d in range(len(alloc.shape)))
        self.pattern = pattern
        self._dims = dims if dims is not None else tuple((-1, 0, 1) for _ in pattern)
        self._fixed = fixed
        self._box: tuple[tuple[int, int], ...] | None = None
        self._shape = tuple([c for _, c in pattern])
        self.lanes: tuple[int, ...] | None = None  # every rank's offset (symmetric run, rank-dependent view)
        self._dtype: np.dtype | None = None  # a reinterpreting view: offset and pattern count these elements
        self._dyn = False  # the offset depends on a runtime value: the dependency box is the whole tensor
        self._rows: np.ndarray | None = None  # a gather view: the element offset of each partition's row
        # a gather view with out-of-bounds indices: (partitions out of bounds, the error message);
        # refused by every instruction except a DMA with oob_mode.skip, which skips those rows
        self._oob: tuple[np.ndarray, str] | None = None

    # --- attributes of the reference NkiTensor ---------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self.alloc.dtype if self._dtype is None else self._dtype

    @property
    def buffer(self) -> MemoryRegion:
        return self.alloc.buffer

    @property
    def name(self) -> str:
        return self.alloc.name

    @property
    def partitions(self) -> int:
        """Partitions the view spans: its dim 0 unless that is not the allocation's partition
        dim (an on-chip view whose partition index was fixed by an integer spans one)."""
        if not self._shape:
            return 1
        if self._dims[0][0] != 0 and self._fixed and self.alloc.on_chip and any(d == 0 for d, _ in self._fixed):
            return 1
        return self._shape[0]

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.pattern)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get_pattern(self) -> list[list[int]]:
        """The view's access pattern as [[stride, count], ...]."""
        return [[s, c] for s, c in self.pattern]

    def is_contiguous(self) -> bool:
        acc = 1
        for s, c in reversed(self.pattern):
            if c != 1 and s != acc:
                return False
            acc *= c
        return True

    def __repr__(self) -> str:
        return (f"NkiTensor({self.alloc.label()}, shape={self.shape}, dtype={self.dtype.name}, "
                f"buffer={self.buffer.name}, offset={self.offset})")

    def __len__(self) -> int:
        return self.shape[0]

    # --- views ------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> "NkiTensor":
        if self._rows is not None:
            raise NotImplementedError(f"{here()}: slicing a gather view (ap(vector_offset=...)) is not simulated")
        if type(key) is not tuple:
            key = (key,)
        ndim = len(self.pattern)
        if any(k is Ellipsis for k in key):
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = (slice(None),) * (ndim - (len(key) - 1))
            key = key[:i] + fill + key[i + 1:]
        if len(key) > ndim:
            raise ConstraintError(f"{here()}: {len(key)} indices for tensor {self.alloc.label()} "
                                  f"of shape {self.shape}")
        if len(key) < ndim:
            key = key + (slice(None),) * (ndim - len(key))
        offset, pattern, dims, fixed = self.offset, [], [], list(self._fixed)
        dyn = False
        lane_terms: list[tuple[int, ...]] = []
        for dim in range(ndim):
            k = key[dim]
            stride, count = self.pattern[dim]
            ad, first, step = self._dims[dim]
            tk = type(k)
            if tk is slice:
                kstart, kstop, kstep = k.start, k.stop, k.step
                if type(kstart) is VirtualRegister or type(kstop) is VirtualRegister:
                    dyn = True
                    if type(kstart) is VirtualRegister and kstart.lanes is not None:
                        lane_terms.append(tuple((v - kstart._value) * stride for v in kstart.lanes))
                    start = 0 if kstart is None else runtime_int(kstart, "slice start")
                    stop = count if kstop is None else runtime_int(kstop, "slice stop")
                else:
                    start = 0 if kstart is None else int(kstart)
                    stop = count if kstop is None else int(kstop)
                kstep = 1 if kstep is None else int(kstep)
                if kstep <= 0 or start < 0 or stop > count or start >= stop:
                    raise ConstraintError(
                        f"{here()}: slice [{start}:{stop}:{kstep}] out of bounds for dim {dim} of size "
                        f"{count} of tensor {self.alloc.label()} shape {self.shape}")
                n = (stop - start + kstep - 1) // kstep
                offset += start * stride
                pattern.append((stride * kstep, n))
                dims.append((ad, first + start * step, step * kstep) if ad >= 0 else (-1, 0, 1))
                continue
            if tk is VirtualRegister:
                dyn = True
                if k.lanes is not None:
                    lane_terms.append(tuple((v - k._value) * stride for v in k.lanes))
                k = k.value("register index")
                tk = int
            idx = k if tk is int else _as_index(k)
            if idx is None:
                raise ConstraintError(f"{here()}: unsupported index {k!r} on tensor {self.alloc.label()} "
                                      f"(use ints, slices, nl.ds, or .ap())")
            if not 0 <= idx < count:
                raise ConstraintError(
                    f"{here()}: index {idx} out of bounds for dim {dim} of size {count} "
                    f"of tensor {self.alloc.label()} shape {self.shape}")
            offset += idx * stride
            if ad >= 0:
                fixed.append((ad, first + idx * step))
        view = NkiTensor(self.alloc, offset, tuple(pattern), tuple(dims), tuple(fixed))
        view._dtype = self._dtype
        if self._dtype is not None:
            view._dims = tuple((-1, 0, 1) for _ in pattern)
            view._box = tuple((0, n) for n in self.alloc.shape)
        if dyn or self._dyn or self.lanes is not None:
            view._dyn = True
            view._box = tuple((0, n) for n in self.alloc.shape)  # unknown before the run: all of it
            view._set_lanes(self, offset, lane_terms, "slice")
        return view

    def _set_lanes(self, base: "NkiTensor", offset: int, terms: list[tuple[int, ...]], what: str) -> None:
        """Every rank's offset of a rank-dependent view (symmetric runs), bounds-checked for each rank."""
        lanes = None
        if base.lanes is not None:
            lanes = tuple(v - base.offset + offset for v in base.lanes)
        for t in terms:
            lanes = tuple((lanes[i] if lanes else offset) + d for i, d in enumerate(t))
        if lanes is None:
            return
        span_lo = sum(min(0, s * (c - 1)) for s, c in self.pattern)
        span_hi = sum(max(0, s * (c - 1)) for s, c in self.pattern)
        for r, off in enumerate(lanes):
            if off + span_lo < 0 or off + span_hi >= self.alloc.size:
                raise ConstraintError(
                    f"{here()} (symmetric run): {what} of tensor {self.alloc.label()} (shape {self.alloc.shape}) at a "
                    f"rank-dependent offset reaches elements [{off + span_lo}, {off + span_hi}] outside its "
                    f"{self.alloc.size} elements on rank {r}")
        self.lanes = lanes

    def ap(self, pattern: Any, offset: Any = None, scalar_offset: Any = None, vector_offset: Any = None,
           indirect_dim: int = 0, dtype: Any = None) -> "NkiTensor":
        """Access-pattern view ("NkiTensor.ap", NKI 0.7): ``pattern`` is [[stride, count], ...]
        (partition pair first on SBUF/PSUM) over the underlying storage; ``offset`` is an
        element offset added to this view's offset (None: this view's offset unchanged);
        ``scalar_offset`` (an int, a register, or a one-element tensor holding the index) moves
        the view by ``scalar_offset * stride`` of dim ``indirect_dim`` of this view; ``dtype``
        reinterprets the storage (only the tensor's own dtype is simulated)."""
        w = here("NkiTensor.ap")
        if self._rows is not None:
            raise NotImplementedError(f"{w}: a view of a gather view (vector_offset) is not simulated")
        if vector_offset is not None:
            return self._gather_view(pattern, offset, vector_offset, indirect_dim, dtype, w)
        new_dtype = self._reinterpret_dtype(dtype, w) if dtype is not None else self._dtype
        pat = tuple((int(s), int(c)) for s, c in pattern)
        if any(c <= 0 for _, c in pat):
            raise ConstraintError(f"{w}: pattern {list(map(list, pat))} has a count <= 0")
        base_offset = self.offset
        if new_dtype != self._dtype:  # the offsets count elements of the new dtype
            base_offset = base_offset * self.dtype.itemsize // np.dtype(new_dtype or self.alloc.dtype).itemsize
        off = base_offset + (0 if offset is None else int(offset))
        dynamic = scalar_offset is not None
        lane_terms: list[tuple[int, ...]] = []
        if dynamic:
            if not 0 <= int(indirect_dim) < len(self.pattern):
                raise ConstraintError(f"{w}: indirect_dim {indirect_dim} out of range for a view of "
                                      f"{len(self.pattern)} dims (shape {self.shape})")
            stride = self.pattern[int(indirect_dim)][0]
            idx = dynamic_index(scalar_offset, w)
            off += idx * stride
            if isinstance(scalar_offset, VirtualRegister) and scalar_offset.lanes is not None:
                lane_terms = [tuple((v - idx) * stride for v in scalar_offset.lanes)]
        lo = off + sum(min(0, s * (c - 1)) for s, c in pat)
        hi = off + sum(max(0, s * (c - 1)) for s, c in pat)
        limit = self.alloc.size if new_dtype is None else \
            self.alloc.size * self.alloc.dtype.itemsize // np.dtype(new_dtype).itemsize
        if lo < 0 or hi >= limit:
            raise ConstraintError(
                f"{w}: .ap(pattern={list(map(list, pat))}, offset={off}) reaches elements "
                f"[{lo}, {hi}] outside tensor {self.alloc.label()} of {self.alloc.size} elements "
                f"(shape {self.alloc.shape})")
        view = NkiTensor(self.alloc, off, pat)
        if new_dtype is not None:
            view._dtype = np.dtype(new_dtype) if np.dtype(new_dtype) != self.alloc.dtype else None
            if view._dtype is not None:
                view._box = tuple((0, n) for n in self.alloc.shape)
        if (dynamic and not isinstance(scalar_offset, (int, np.integer))) or self.lanes is not None or self._dyn:
            view._dyn = True
            view._box = tuple((0, n) for n in self.alloc.shape)  # unknown before the run: all of it
            view._set_lanes(self, off, lane_terms, ".ap")
        return view

    def _gather_view(self, pattern: Any, offset: Any, vector_offset: Any, indirect_dim: int, dtype: Any,
                     w: str) -> "NkiTensor":
        """``ap(vector_offset=idx)``: partition p's row starts at ``offset + idx[p] * stride`` of
        dim ``indirect_dim`` of this view (the pattern's partition stride is replaced); the free
        dims follow the pattern ("NkiTensor.ap", DMA gather/scatter)."""
        if dtype is not None and np.dtype(dtype) != self.dtype:
            raise NotImplementedError(f"{w}: ap(vector_offset=..., dtype=...) reinterpreting is not simulated")
        if not isinstance(vector_offset, NkiTensor):
            raise ConstraintError(f"{w}: vector_offset must be an index tensor, got {type(vector_offset).__name__}")
        pat = tuple((int(s), int(c)) for s, c in pattern)
        parts = pat[0][1]
        if vector_offset.size != parts:
            raise ConstraintError(f"{w}: vector_offset has {vector_offset.size} indices for {parts} partitions")
        stride = self.pattern[int(indirect_dim)][0]
        base = self.offset + (0 if offset is None else int(offset))
        if vector_offset.alloc.data is None:
            idx = np.zeros(parts, dtype=np.int64)  # schedule-only run: no data
        else:
            if not vector_offset.written_mask().all():
                from .errors import UninitializedReadError
                raise UninitializedReadError(f"{w}: vector_offset index tensor {vector_offset.alloc.label()} "
                                             f"was not written")
            idx = np.asarray(vector_offset.array()).reshape(-1).astype(np.int64)
        view = NkiTensor(self.alloc, base, pat)
        view._rows = base + idx * stride
        free = view._free_offsets()
        # an index is out of bounds when negative or when its row reaches outside the tensor;
        # the DMA using the view decides: an error, or with oob_mode.skip no transfer for that
        # index ("nki.isa.dma_copy": oob_mode)
        oob = (idx < 0) | (view._rows + int(free.min()) < 0) | (view._rows + int(free.max()) >= self.alloc.size)
        if oob.any():
            bad = int(np.argmax(oob))
            view._oob = (oob, f"{w}: vector_offset index {int(idx[bad])} of partition {bad} reaches outside "
                              f"tensor {self.alloc.label()} of {self.alloc.size} elements (shape "
                              f"{self.alloc.shape})")
            # rows kept addressable (an in-bounds row); no instruction reads or writes them
            view._rows = np.where(oob, int(view._rows[~oob][0]) if (~oob).any() else 0, view._rows)
        view._dyn = True
        view._box = tuple((0, n) for n in self.alloc.shape)
        return view

    def _gather_partitions(self, p0: int, p1: int) -> "NkiTensor":
        """Partitions [p0, p1) of a gather view (their rows; a DMA skipping out-of-bounds rows)."""
        (ps, _), rest = self.pattern[0], self.pattern[1:]
        view = NkiTensor(self.alloc, self.offset, ((ps, p1 - p0),) + rest)
        view._rows = self._rows[p0:p1]
        view._dyn = True
        view._box = self._box
        return view

    def _free_offsets(self) -> np.ndarray:
        off = np.zeros((1,), dtype=np.int64)
        for s, c in self.pattern[1:]:
            off = (off[:, None] + np.arange(c, dtype=np.int64)[None, :] * s).ravel()
        return off

    def _gather_index(self) -> np.ndarray:
        return (self._rows[:, None] + self._free_offsets()[None, :]).reshape(self.shape)

    def reshape(self, shape: Any) -> "NkiTensor":
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != self.size or not self.is_contiguous():
            raise ConstraintError(f"{here()}: cannot reshape view of shape {self.shape} "
                                  f"(contiguous={self.is_contiguous()}) to {shape}")
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        return self._same_lanes(NkiTensor(self.alloc, self.offset, tuple(zip(reversed(strides), shape))))

    def permute(self, dims: Any) -> "NkiTensor":
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ConstraintError(f"{here()}: permute{dims} is not a permutation of {self.ndim} dims")
        return self._same_lanes(NkiTensor(self.alloc, self.offset, tuple(self.pattern[d] for d in dims),
                                          tuple(self._dims[d] for d in dims), self._fixed))

    def _same_lanes(self, view: "NkiTensor") -> "NkiTensor":
        view._dtype = self._dtype
        view._dyn = self._dyn
        if self._dtype is not None or self._dyn:
            view._box = tuple((0, n) for n in self.alloc.shape)
        if self.lanes is not None:
            view.lanes = self.lanes
            view._box = tuple((0, n) for n in self.alloc.shape)
        return view

    # --- the view methods of the 0.7 NkiTensor ("nki.language.NkiTensor") -------------------
    def _dims_view(self, pattern: list[tuple[int, int]], what: str) -> "NkiTensor":
        return self._same_lanes(NkiTensor(self.alloc, self.offset, tuple(pattern)))

    def _free_dim(self, dim: int, what: str) -> int:
        dim = int(dim) % max(self.ndim, 1)
        if dim == 0 and self.buffer.on_chip:
            raise ConstraintError(f"{here()}: {what}: dim 0 is the partition dim of an on-chip tensor")
        return dim

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        """``t[..., start:end:step, ...]`` on dim ``dim``."""
        key = [slice(None)] * self.ndim
        key[int(dim)] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: Any) -> "NkiTensor":
        """Dim ``dim`` removed at ``index`` (an int, a register or a one-element index tensor)."""
        if isinstance(index, NkiTensor):
            sizes = [c for _, c in self.pattern]
            pat = [p for d, p in enumerate(self.pattern) if d != int(dim)]
            view = NkiTensor(self.alloc, self.offset, tuple(pat)) if pat else None
            if view is None:
                raise ConstraintError(f"{here()}: cannot select the only dim of a tensor")
            idx = dynamic_index(index, here("NkiTensor.select"))
            if not 0 <= idx < sizes[int(dim)]:
                raise ConstraintError(f"{here()}: dynamic index {idx} out of bounds for dim {dim} of size "
                                      f"{sizes[int(dim)]} of tensor {self.alloc.label()}")
            view.offset += idx * self.pattern[int(dim)][0]
            view._dyn = True
            view._box = tuple((0, n) for n in self.alloc.shape)
            return view
        key: list[Any] = [slice(None)] * self.ndim
        key[int(dim)] = index
        return self[tuple(key)]

    def expand_dim(self, dim: int) -> "NkiTensor":
        """A new dim of size 1 at ``dim``."""
        dim = int(dim) % (self.ndim + 1)
        if dim == 0 and self.buffer.on_chip:
            raise ConstraintError(f"{here()}: expand_dim: dim 0 is the partition dim of an on-chip tensor")
        pat = list(self.pattern)
        pat.insert(dim, (1, 1))
        return self._dims_view(pat, "expand_dim")

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        """Dim ``dim`` (of size 1) removed."""
        dim = self._free_dim(dim, "squeeze_dim")
        if self.pattern[dim][1] != 1:
            raise ConstraintError(f"{here()}: squeeze_dim({dim}) of a dim of size {self.pattern[dim][1]}")
        return self._dims_view([p for d, p in enumerate(self.pattern) if d != dim], "squeeze_dim")

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        """Dim ``dim`` (of size 1) repeated ``size`` times (stride 0, no copy)."""
        dim = self._free_dim(dim, "broadcast")
        if self.pattern[dim][1] != 1:
            raise ConstraintError(f"{here()}: broadcast({dim}, {size}) of a dim of size {self.pattern[dim][1]}")
        pat = list(self.pattern)
        pat[dim] = (0, int(size))
        return self._dims_view(pat, "broadcast")

    def reshape_dim(self, dim: int, shape: Any) -> "NkiTensor":
        """Dim ``dim`` split into ``shape`` (one entry may be -1)."""
        dim = int(dim) % self.ndim
        stride, count = self.pattern[dim]
        shape = [int(x) for x in shape]
        if shape.count(-1) == 1:
            known = math.prod(x for x in shape if x != -1)
            shape[shape.index(-1)] = count // known if known else 0
        if math.prod(shape) != count:
            raise ConstraintError(f"{here()}: reshape_dim({dim}, {tuple(shape)}) of a dim of size {count}")
        if dim == 0 and self.buffer.on_chip and shape[0] != count:
            raise ConstraintError(f"{here()}: reshape_dim cannot split the partition dim of an on-chip tensor")
        new, acc = [], stride
        for n in reversed(shape):
            new.append((acc, n))
            acc *= n
        pat = list(self.pattern[:dim]) + list(reversed(new)) + list(self.pattern[dim + 1:])
        return self._dims_view(pat, "reshape_dim")

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        """Dims ``start_dim..end_dim`` (contiguous in storage) merged into one."""
        a, b = int(start_dim) % self.ndim, int(end_dim) % self.ndim
        group = self.pattern[a:b + 1]
        for (s_outer, _), (s_inner, c_inner) in zip(group, group[1:]):
            if s_outer != s_inner * c_inner:
                raise ConstraintError(f"{here()}: flatten_dims({a}, {b}) of dims that are not contiguous in "
                                      f"storage (pattern {self.get_pattern()})")
        merged = (group[-1][0], math.prod(c for _, c in group))
        return self._dims_view(list(self.pattern[:a]) + [merged] + list(self.pattern[b + 1:]), "flatten_dims")

    def _reinterpret_dtype(self, dtype: Any, w: str) -> np.dtype:
        new = np.dtype(dtype)
        total = self.alloc.size * self.alloc.dtype.itemsize
        if total % new.itemsize or (new.itemsize % self.alloc.dtype.itemsize and
                                    self.alloc.dtype.itemsize % new.itemsize):
            raise ConstraintError(f"{w}: cannot reinterpret {self.alloc.dtype.name} storage of {total} bytes "
                                  f"as {new.name}")
        return new

    def view(self, dtype: Any) -> "NkiTensor":
        """The same storage read as ``dtype``: the last dim (contiguous) scales by the ratio of
        the itemsizes ("NkiTensor.view": no data is copied)."""
        w = here("NkiTensor.view")
        new = self._reinterpret_dtype(dtype, w)
        if new == self.dtype:
            return self
        old = self.dtype.itemsize
        if self.ndim == 0 or self.pattern[-1][0] != 1:
            raise ConstraintError(f"{w}: the last dim must be contiguous to reinterpret, pattern {self.get_pattern()}")
        last = self.pattern[-1][1] * old
        if last % new.itemsize or (self.offset * old) % new.itemsize or \
                any((s * old) % new.itemsize for s, _ in self.pattern[:-1]):
            raise ConstraintError(f"{w}: a view of shape {self.shape} {self.dtype.name} does not align to "
                                  f"{new.name} elements")
        pat = tuple((s * old // new.itemsize, c) for s, c in self.pattern[:-1]) + ((1, last // new.itemsize),)
        out = NkiTensor(self.alloc, self.offset * old // new.itemsize, pat)
        out._dtype = new if new != self.alloc.dtype else None
        out._box = tuple((0, n) for n in self.alloc.shape)
        out.lanes, out._dyn = self.lanes, self._dyn
        return out

    reinterpret_cast = view

    def is_indirect(self) -> bool:
        """True for views made by ``indirect`` / ``vector_select`` (not simulated: always False)."""
        return False

    def indirect(self, index: Any, num_elem: Any = None) -> "NkiTensor":
        raise NotImplementedError(f"{here()}: NkiTensor.indirect (tensor indirection, NeuronCore-v4, NKI 0.7) "
                                  f"is not simulated")

    def vector_select(self, dim: int, vector_offset: Any) -> "NkiTensor":
        raise NotImplementedError(f"{here()}: NkiTensor.vector_select (per-partition indirect access, NKI 0.7) "
                                  f"is not simulated")

    def rearrange(self, src_pattern: Any, dst_pattern: Any, fixed_sizes: Any = None) -> "NkiTensor":
        """einops-style: split the dims of ``src_pattern`` groups, reorder, merge ``dst_pattern`` groups."""
        sizes = dict(fixed_sizes or {})
        names: list[str] = []
        view: NkiTensor = self
        d = 0
        for entry in src_pattern:
            if isinstance(entry, (tuple, list)):
                known = math.prod(sizes.get(n, 1) for n in entry if n in sizes)
                split = [sizes.get(n, -1) for n in entry]
                if split.count(-1) == 1:
                    split[split.index(-1)] = view.shape[d] // known
                view = view.reshape_dim(d, tuple(split)) if len(entry) > 1 else view
                names += list(entry)
                d += len(entry)
            else:
                names.append(entry)
                d += 1
        flat_dst = [n for e in dst_pattern for n in (e if isinstance(e, (tuple, list)) else (e,))]
        if sorted(flat_dst) != sorted(names):
            raise ConstraintError(f"{here()}: rearrange {src_pattern} -> {dst_pattern}: names differ")
        view = view.permute(tuple(names.index(n) for n in flat_dst))
        d = 0
        for e in dst_pattern:
            if isinstance(e, (tuple, list)) and len(e) > 1:
                view = view.flatten_dims(d, d + len(e) - 1)
            d += 1
        return view

    def __setitem__(self, key: Any, value: Any) -> None:
        raise NotImplementedError(f"{here()}: assignment into a tensor view (NkiTensor.__setitem__, NKI 0.7) "
                                  f"is not simulated; use nisa.tensor_copy or nisa.dma_copy")

    # --- data access (numerics mode) --------------------------------------------------------
    def _strided(self, flat: np.ndarray) -> np.ndarray:
        item = flat.itemsize
        raw = flat if flat.dtype.isbuiltin == 1 else flat.view(f"u{item}")  # ml_dtypes: via uint
        base = raw[self.offset:] if self.offset else raw
        out = np.lib.stride_tricks.as_strided(
            base, shape=self.shape, strides=tuple(s * item for s, _ in self.pattern), writeable=True)
        return out if raw is flat else out.view(flat.dtype)

    def array(self) -> np.ndarray:
        """The data: a writable numpy view (numerics mode only); a copy for gather views (write
        with ``assign``)."""
        if self._rows is not None:
            return self.alloc.data[self._gather_index()]
        if self._dtype is None:
            return self._strided(self.alloc.data)
        new = self._dtype
        raw = self.alloc.data.view(np.uint8).view(f"u{new.itemsize}")
        return self._strided(raw).view(new) if not new.isbuiltin else self._strided(raw.view(new))

    def _old_index(self) -> np.ndarray:
        """For a reinterpreting view: the allocation elements each view element covers."""
        old, new = self.alloc.dtype.itemsize, self._dtype.itemsize
        idx = self._strided(np.arange(self.alloc.size * old // new, dtype=np.int64))
        if new >= old:
            r = new // old
            return idx[..., None] * r + np.arange(r)
        return (idx * new // old)[..., None]

    def assign(self, value: Any) -> None:
        """Write ``value`` (cast to the view's dtype) into the view's elements."""
        value = np.asarray(value).astype(self.dtype, copy=False)
        if self._rows is not None:
            self.alloc.data[self._gather_index()] = value.reshape(self.shape)
            return
        dst = self.array()
        dst[...] = value.reshape(dst.shape)

    def written_mask(self) -> np.ndarray:
        """Which elements of the view some instruction wrote (a copy for reinterpreting and
        gather views)."""
        if self._rows is not None:
            return self.alloc.written[self._gather_index()]
        if self._dtype is None:
            return self._strided(self.alloc.written)
        return self.alloc.written[self._old_index()].all(axis=-1)

    def set_written(self, value: Any) -> None:
        """Record the view's elements where ``value`` is True as written."""
        if self._rows is not None:
            idx = self._gather_index()
            self.alloc.written[idx[np.broadcast_to(np.asarray(value, dtype=bool), idx.shape)]] = True
            return
        if self._dtype is None:
            self._strided(self.alloc.written)[...] = value
            return
        oi = self._old_index()
        sel = np.broadcast_to(np.asarray(value, dtype=bool).reshape(self.shape)[..., None], oi.shape)
        self.alloc.written[oi[sel]] = True

    # --- dependency box ---------------------------------------------------------------------
    def box(self) -> tuple[tuple[int, int], ...]:
        """Bounding box [lo, hi) per allocation dim of the elements this view touches."""
        if self._box is None:
            if all(ad >= 0 for ad, _, _ in self._dims):
                full = [(0, n) for n in self.alloc.shape]
                for d, idx in self._fixed:
                    full[d] = (idx, idx + 1)
                for (ad, first, step), (_, count) in zip(self._dims, self.pattern):
                    full[ad] = (first, first + step * (count - 1) + 1)
                self._box = tuple(full)
            else:
                self._box = _box_from_pattern(self.alloc.shape, self.alloc.strides, self.offset, self.pattern)
        return self._box


@lru_cache(maxsize=4096)
def _box_from_pattern(shape: tuple[int, ...], astrides: tuple[int, ...], offset: int,
                      pattern: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    exact = _box_without_carry(shape, astrides, offset, pattern)
    if exact is not None:
        return exact
    total = math.prod(c for _, c in pattern)
    if total > (1 << 20) or not shape:
        lo = offset + sum(min(0, s * (c - 1)) for s, c in pattern)
        hi = offset + sum(max(0, s * (c - 1)) for s, c in pattern)
        first = astrides[0] if shape else 1
        return ((lo // first, hi // first + 1),) + tuple((0, n) for n in shape[1:])
    idx = np.full((1,), offset, dtype=np.int64)
    for s, c in pattern:
        idx = (idx[:, None] + np.arange(c, dtype=np.int64)[None, :] * s).ravel()
    out = []
    for st, n in zip(astrides, shape):
        coord = (idx // st) % n
        out.append((int(coord.min()), int(coord.max()) + 1))
    return tuple(out)


def _box_without_carry(shape: tuple[int, ...], astrides: tuple[int, ...], offset: int,
                       pattern: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...] | None:
    """The box in closed form when no index of the pattern carries from one allocation dim into
    the next: the offset and each step written as digits of the allocation's mixed radix, and the
    offset digit plus the largest sum of a dim's step digits still inside that dim. Then every
    coordinate is linear in the pattern's counters and its extremes are those sums. None when a
    step is negative or a carry can happen (the caller enumerates the indices)."""
    if not shape or offset < 0:
        return None
    nd = len(shape)
    lo = [0] * nd
    rem = offset
    for d in range(nd):
        lo[d], rem = divmod(rem, astrides[d])
    if rem or any(lo[d] >= shape[d] for d in range(1, nd)):
        return None
    span = [0] * nd
    for s, c in pattern:
        if c <= 1:
            continue
        if s < 0:
            return None
        r = s
        for d in range(nd):
            digit, r = divmod(r, astrides[d])
            if d and digit >= shape[d]:
                return None
            span[d] += digit * (c - 1)
        if r:
            return None
    for d in range(nd):
        if lo[d] + span[d] >= shape[d]:
            return None
    return tuple((lo[d], lo[d] + span[d] + 1) for d in range(nd))


def boxes_overlap(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return False
    return True


def box_contains(outer: tuple[tuple[int, int], ...], inner: tuple[tuple[int, int], ...]) -> bool:
    for (olo, ohi), (ilo, ihi) in zip(outer, inner):
        if ilo < olo or ihi > ohi:
            return False
    return True


def dynamic_index(v: Any, where: str) -> int:
    """The runtime value of a dynamic index: an int, a register, or a one-element integer tensor."""
    if isinstance(v, NkiTensor):
        if v.size != 1:
            raise ConstraintError(f"{where}: a dynamic index tensor must hold one element, got shape {v.shape}")
        if v.alloc.data is None:
            return 0  # schedule-only run: no data; the view's box covers the whole tensor
        if not v.written_mask().all():
            from .errors import UninitializedReadError
            raise UninitializedReadError(f"{where}: dynamic index tensor {v.alloc.label()} was never written")
        return int(np.asarray(v.array()).reshape(-1)[0])
    return runtime_int(v, "dynamic index")
