"""nki.isa instructions of the Vector, Scalar and GpSimd engines beyond the basic ones:

Over ~450 lines: one module per NKI reference page group (vector/scalar/gpsimd
instructions), each instruction short; splitting further would scatter their shared checks.
reductions, scans, selects, pattern generation, sorting helpers and statistics.

Semantics from the NKI 0.7 reference page of each instruction ("nki.isa.<name>"): inputs
are cast to FP32, computed in FP32 and cast to the dst dtype (bitvec operators work on the
integers); the partition dim is the parallel dim; free-axis reductions run over the last
contiguous free dims. The accumulator registers that ``reduce_cmd`` controls (shared by
tensor_scalar_reduce, tensor_scalar_cumulative, select_reduce, range_select and exponential
on the Vector engine) are kept per program. Durations: ``rates.elementwise_seconds`` of
the free size on the instruction's engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import checks, rates
from . import language as nl
from .constants import engine as _engine
from .constants import reduce_cmd
from .errors import ConstraintError, SimulatorError
from .instruction import NkiInstruction
from .state import current
from .tensor import MemoryRegion, NkiTensor

_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "max": -np.inf,
             "minimum": np.inf, "min": np.inf}


def _ctx(op: str) -> Any:
    ctx = current()
    if ctx is None:
        raise SimulatorError(f"nisa.{op} called outside a simulated kernel (use nki.simulate or run_ranks)")
    return ctx


class _Op:
    """Checks, reads and the issue of one instruction."""

    def __init__(self, op: str, name: str | None) -> None:
        self.ctx, self.op, self.name = _ctx(op), op, name
        self.w = self.ctx.where(op, name)
        self.reads: list[NkiTensor] = []
        self.writes: list[NkiTensor] = []

    def tile(self, v: Any, role: str, write: bool = False, on_chip: bool = True) -> NkiTensor:
        v = checks.tensor_arg(v, self.w, role)
        if on_chip:
            checks.on_chip(v, self.w, role)
        (self.writes if write else self.reads).append(v)
        return v

    def value(self, v: NkiTensor, integer: bool = False) -> np.ndarray:
        a = np.asarray(self.ctx.read(v, self.op, self.name, "operand"))
        return a if integer else a.astype(np.float32)

    def scalar_or_column(self, v: Any, p: int, role: str, ndim: int = 2) -> Any:
        """A scalar, or a [P, 1] tile broadcast along the free dims."""
        if isinstance(v, NkiTensor):
            self.tile(v, role)
            if v.shape[0] != p or checks.free_size(v) != 1:
                raise ConstraintError(f"{self.w}: {role} must be a scalar or a [{p}, 1] tile, got {v.shape}")
            return self.value(v).reshape((p,) + (1,) * (ndim - 1)) if self.ctx.numerics else None
        return None if v is None else np.float32(v)

    def write(self, dst: NkiTensor, value: Any) -> None:
        if self.ctx.numerics:
            self.ctx.write(dst, np.asarray(value).reshape(dst.shape))

    def issue(self, engine_name: str, free: int) -> NkiInstruction:
        t = self.ctx.issue(self.op, self.name, engine_name, engine_seconds(engine_name, free, self.reads, self.writes),
                           self.reads, self.writes)
        return NkiInstruction(self.op, self.name, t[0], t[1])


def engine_seconds(engine_name: str, free: int, reads: list, writes: list) -> float:
    """``rates.elementwise_seconds`` of an instruction: its full-size input tiles (scalar
    columns [P, 1] do not count) and the widest element of its operands.

    A full-size input read from PSUM does not add a pass: "max(MIN_II, N) [cycles]: one input
    tile is in PSUM and the other is in SBUF", "max(MIN_II, 2N): otherwise" (nki.isa.tensor_tensor,
    "Estimated instruction cost"), so inputs = max(1, full-size inputs in SBUF)."""
    full = [v for v in reads if v.size and checks.free_size(v) >= free]
    inputs = sum(1 for v in full if v.buffer is not MemoryRegion.psum)
    if inputs < len(full):
        inputs = max(1, inputs)
    itemsize = max((v.dtype.itemsize for v in list(reads) + list(writes)), default=4)
    return rates.elementwise_seconds(free, engine_name, itemsize, inputs)


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def _op_name(op: Any) -> str:
    return getattr(op, "__name__", repr(op))


def _accumulator(ctx: Any, p: int, cmd: Any, op_name: str, init: Any) -> np.ndarray:
    acc = getattr(ctx, "vector_acc", None)
    if cmd in (reduce_cmd.reset_reduce, reduce_cmd.reset) or acc is None or acc.shape[0] != p:
        acc = np.full((p,), _IDENTITY.get(op_name, 0.0), dtype=np.float32)
    if cmd is reduce_cmd.load_reduce:
        acc = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)).copy()
    return acc


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """``dst = op-reduce(data)`` over the free ``axis`` (the last contiguous free dims)."""
    o = _Op("tensor_reduce", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    axes = tuple(sorted(int(a) % data.ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,))))
    if 0 in axes or axes != tuple(range(data.ndim - len(axes), data.ndim)):
        raise ConstraintError(f"{o.w}: axis {axis} must be the last contiguous free dims of data {data.shape}")
    if o.ctx.numerics:
        integer = _op_name(op).startswith("bitwise")
        x = o.value(data, integer)
        fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
              "bitwise_xor": np.bitwise_xor, "max": np.maximum, "min": np.minimum}.get(_op_name(op))
        if fn is None:
            raise ConstraintError(f"{o.w}: op must be an arithmetic or bitvec operator, got {op!r}")
        r = fn.reduce(x, axis=axes, keepdims=keepdims)
        o.write(dst, -r if negate and not integer else r)
    return o.issue("Vector", checks.free_size(data))


def tensor_partition_reduce(dst, op, data, name=None):
    """``dst[0, ...] = op-reduce(data)`` across the partitions (GpSimd engine)."""
    o = _Op("tensor_partition_reduce", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    if o.ctx.numerics:
        x = o.value(data, _op_name(op).startswith("bitwise"))
        fn = {"add": np.sum, "maximum": np.max, "max": np.max, "minimum": np.min, "average": np.mean,
              "bitwise_or": np.bitwise_or.reduce, "bitwise_and": np.bitwise_and.reduce}.get(_op_name(op))
        if fn is None:
            raise ConstraintError(f"{o.w}: op must be add, average, max, bitwise_or or bitwise_and, got {op!r}")
        o.write(dst, fn(x, axis=0))
    return o.issue("GpSimd", checks.free_size(data) * data.shape[0])


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` element-wise."""
    o = _Op("reciprocal", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    checks.same_partitions(dst, data, o.w, "dst", "data")
    if o.ctx.numerics:
        o.write(dst, 1.0 / o.value(data))
    return o.issue("Vector", checks.free_size(data))


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operand0 a scalar or [P, 1] tile, operand1 a tile."""
    o = _Op("scalar_tensor_tensor", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    o0 = o.scalar_or_column(operand0, data.shape[0], "operand0", data.ndim)
    operand1 = o.tile(operand1, "operand1")
    checks.same_partitions(operand1, data, o.w, "operand1", "data")
    if o.ctx.numerics:
        x = o.value(data)
        t = op0(o0, x) if reverse0 else op0(x, o0)
        y = o.value(operand1).reshape(t.shape)
        o.write(dst, op1(y, t) if reverse1 else op1(t, y))
    return o.issue("Vector", checks.free_size(data))


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data op0 operand0`` and ``reduce_res = reduce_op`` over all free dims of dst
    (through the Vector accumulator, see the module docstring)."""
    o = _Op("tensor_scalar_reduce", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    p = data.shape[0]
    o0 = o.scalar_or_column(operand0, p, "operand0", data.ndim)
    if reduce_res is not None:
        reduce_res = o.tile(reduce_res, "reduce_res", write=True)
    if o.ctx.numerics:
        x = o.value(data)
        r = op0(o0, x) if reverse0 else op0(x, o0)
        o.write(dst, r)
        acc = _accumulator(o.ctx, p, reduce_cmd, _op_name(reduce_op), reduce_init)
        flat = _flat(np.asarray(r, np.float32))
        step = {"add": lambda: acc + flat.sum(1), "multiply": lambda: acc * flat.prod(1),
                "maximum": lambda: np.maximum(acc, flat.max(1)), "max": lambda: np.maximum(acc, flat.max(1)),
                "minimum": lambda: np.minimum(acc, flat.min(1)), "min": lambda: np.minimum(acc, flat.min(1))}
        if _op_name(reduce_op) not in step:
            raise ConstraintError(f"{o.w}: reduce_op must be nl.add, nl.multiply, nl.maximum or nl.minimum")
        acc = step[_op_name(reduce_op)]()
        o.ctx.vector_acc = acc.astype(np.float32)
        if reduce_res is not None:
            o.write(reduce_res, -acc if reduce_res_negate else acc)
    return o.issue("Vector", checks.free_size(data))


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """Running ``reg = op1(op0(src[i], imm0), reg)`` along the free dims, ``dst[i] = reg``."""
    o = _Op("tensor_scalar_cumulative", name)
    src, dst = o.tile(src, "src"), o.tile(dst, "dst", write=True)
    p = src.shape[0]
    i0 = o.scalar_or_column(imm0, p, "imm0", 2)
    i1 = o.scalar_or_column(imm1, p, "imm1", 2) if imm1 is not None else None
    if o.ctx.numerics:
        x = _flat(o.value(src))
        reg = _accumulator(o.ctx, p, reduce_cmd, _op_name(op1), i1 if i1 is not None else 0.0)
        out = np.empty_like(x)
        t = op0(x, i0 if i0 is not None else 0.0)
        for i in range(x.shape[1]):
            reg = np.asarray(op1(np.asarray(t)[:, i], reg), dtype=np.float32)
            out[:, i] = reg
        o.ctx.vector_acc = reg
        o.write(dst, out)
    return o.issue("Vector", checks.free_size(src))


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])``, ``r[:, -1] = initial``."""
    o = _Op("tensor_tensor_scan", name)
    data0, data1, dst = o.tile(data0, "data0"), o.tile(data1, "data1"), o.tile(dst, "dst", write=True)
    checks.same_partitions(data0, data1, o.w, "data0", "data1")
    p = data0.shape[0]
    init = o.scalar_or_column(initial, p, "initial", 2)
    if o.ctx.numerics:
        a, b = _flat(o.value(data0)), _flat(o.value(data1))
        prev = np.broadcast_to(np.asarray(init, np.float32).reshape(-1, 1) if np.ndim(init) else init, (p, 1))[:, 0]
        out = np.empty_like(a)
        for i in range(a.shape[1]):
            t = op0(prev, a[:, i]) if reverse0 else op0(a[:, i], prev)
            prev = np.asarray(op1(b[:, i], t) if reverse1 else op1(t, b[:, i]), dtype=np.float32)
            out[:, i] = prev
        o.write(dst, out)
    return o.issue("Vector", checks.free_size(data0))


def _affine(p: int, pattern: Any, offset: Any, channel_multiplier: Any, free: int, w: str) -> np.ndarray:
    pat = [(int(s), int(n)) for s, n in pattern]
    total = int(np.prod([n for _, n in pat])) if pat else 1
    if total != free:
        raise ConstraintError(f"{w}: pattern {pat} has {total} elements per partition but the tile has {free}")
    v = np.zeros((1,), dtype=np.int64)
    for s, n in pat:
        v = (v[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return int(offset) + np.arange(p, dtype=np.int64)[:, None] * int(channel_multiplier) + v[None, :]


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[c, ...] = offset + c * channel_multiplier + sum(index_k * step_k)`` (int32 arithmetic)."""
    o = _Op("iota", name)
    dst = o.tile(dst, "dst", write=True)
    checks.in_buffer(dst, [MemoryRegion.sbuf], o.w, "dst")
    vals = _affine(dst.shape[0], pattern, offset, channel_multiplier, checks.free_size(dst), o.w)
    if o.ctx.numerics:
        o.write(dst, vals.astype(np.int32).astype(np.float64) if dst.dtype.kind == "f" or "float" in dst.dtype.name
                else vals.astype(np.int32))
    return o.issue("GpSimd", checks.free_size(dst))


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=nl.equal, offset=0, name=None):
    """``dst = on_true_tile where cmp_op(affine value, 0) else on_false_value``."""
    o = _Op("affine_select", name)
    dst, on_true_tile = o.tile(dst, "dst", write=True), o.tile(on_true_tile, "on_true_tile")
    vals = _affine(dst.shape[0], pattern, offset, channel_multiplier, checks.free_size(dst), o.w)
    if o.ctx.numerics:
        pred = np.asarray(cmp_op(vals.astype(np.float32), np.float32(0))) != 0
        o.write(dst, np.where(pred, _flat(o.value(on_true_tile)), np.float32(on_false_value)))
    return o.issue("GpSimd", checks.free_size(dst))


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src`` where ``predicate`` (uint) is non-zero (zero with reverse_pred); else unchanged."""
    o = _Op("tensor_copy_predicated", name)
    dst, predicate = o.tile(dst, "dst", write=True), o.tile(predicate, "predicate")
    s = o.tile(src, "src") if isinstance(src, NkiTensor) else None
    if predicate.dtype.kind != "u":
        raise ConstraintError(f"{o.w}: predicate must be uint8, uint16 or uint32, got {predicate.dtype.name}")
    o.reads.append(dst)  # unselected elements keep their value
    if o.ctx.numerics:
        pred = o.value(predicate, integer=True).reshape(dst.shape) != 0
        if reverse_pred:
            pred = ~pred
        old = np.where(dst.written_mask(), dst.array().astype(np.float32), np.float32(0))
        new = o.value(s).reshape(dst.shape) if s is not None else np.float32(src)
        dst.assign(np.where(pred, new, old))
        dst.set_written(np.asarray(dst.written_mask()) | pred)
    return o.issue("Vector", checks.free_size(dst))


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=nl.maximum,
                  reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)``; with reduce_res the running max per partition."""
    o = _Op("select_reduce", name)
    dst, predicate, on_true = o.tile(dst, "dst", write=True), o.tile(predicate, "predicate"), o.tile(on_true, "on_true")
    p = on_true.shape[0]
    f = o.scalar_or_column(on_false, p, "on_false", 2)
    if reduce_res is not None:
        reduce_res = o.tile(reduce_res, "reduce_res", write=True)
    if o.ctx.numerics:
        pred = _flat(o.value(predicate, integer=True)) != 0
        if reverse_pred:
            pred = ~pred
        r = np.where(pred, _flat(o.value(on_true)), f if f is not None else 0)
        o.write(dst, r)
        if reduce_cmd is not reduce_cmd.idle or reduce_res is not None:
            acc = _accumulator(o.ctx, p, reduce_cmd, "maximum", 0.0)
            acc = np.maximum(acc, r.max(1)).astype(np.float32)
            o.ctx.vector_acc = acc
            if reduce_res is not None:
                o.write(reduce_res, acc)
    return o.issue("Vector", checks.free_size(on_true))


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=nl.maximum, range_start=0, on_false_value=..., name=None):
    """Keep ``on_true_tile`` where ``comp_op0(i, bound0) & comp_op1(i, bound1)`` for the free
    index i (+ range_start), else ``on_false_value`` (default: the lowest float32, the
    page's FP32_MIN fill); reduce (max) into reduce_res."""
    if on_false_value is ...:
        on_false_value = float(np.finfo(np.float32).min)
    o = _Op("range_select", name)
    dst, t = o.tile(dst, "dst", write=True), o.tile(on_true_tile, "on_true_tile")
    p = t.shape[0]
    b0, b1 = o.scalar_or_column(bound0, p, "bound0", 2), o.scalar_or_column(bound1, p, "bound1", 2)
    if reduce_res is not None:
        reduce_res = o.tile(reduce_res, "reduce_res", write=True)
    if o.ctx.numerics:
        idx = np.float32(range_start) + np.arange(checks.free_size(t), dtype=np.float32)[None, :]
        mask = (np.asarray(comp_op0(idx, b0)) != 0) & (np.asarray(comp_op1(idx, b1)) != 0)
        r = np.where(mask, _flat(o.value(t)), np.float32(on_false_value))
        o.write(dst, r)
        acc = _accumulator(o.ctx, p, reduce_cmd, "maximum", 0.0)
        acc = np.maximum(acc, r.max(1)).astype(np.float32)
        o.ctx.vector_acc = acc
        if reduce_res is not None:
            o.write(reduce_res, acc)
    return o.issue("Vector", checks.free_size(t))


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)``; with reduce_cmd the running sum per partition."""
    o = _Op("exponential", name)
    src, dst = o.tile(src, "src"), o.tile(dst, "dst", write=True)
    p = src.shape[0]
    m = o.scalar_or_column(max_value, p, "max_value", 2)
    if reduce_res is not None:
        reduce_res = o.tile(reduce_res, "reduce_res", write=True)
    if o.ctx.numerics:
        e = np.exp(_flat(o.value(src)) - m)
        o.write(dst, e)
        if reduce_cmd is not reduce_cmd.idle:
            acc = _accumulator(o.ctx, p, reduce_cmd, "add", reduce_init) + e.sum(1)
            o.ctx.vector_acc = acc.astype(np.float32)
            if reduce_res is not None:
                o.write(reduce_res, acc)
    return o.issue("Vector", checks.free_size(src))


def max8(dst, src, name=None):
    """The 8 largest values of each partition, descending."""
    o = _Op("max8", name)
    src, dst = o.tile(src, "src"), o.tile(dst, "dst", write=True)
    n = checks.free_size(src)
    if not 8 <= n <= 16384 or checks.free_size(dst) != 8:
        raise ConstraintError(f"{o.w}: src needs 8..16384 elements per partition ({n}) and dst 8 ({dst.shape})")
    if o.ctx.numerics:
        o.write(dst, -np.sort(-_flat(o.value(src)), axis=1)[:, :8])
    return o.issue("Vector", n)


def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` in each partition of ``data``
    (all ones when absent); duplicate vals take successive occurrences."""
    o = _Op("nc_find_index8", name)
    data, vals, dst = o.tile(data, "data"), o.tile(vals, "vals"), o.tile(dst, "dst", write=True)
    if o.ctx.numerics:
        d, v = _flat(o.value(data)), _flat(o.value(vals))
        sentinel = np.iinfo(dst.dtype).max if dst.dtype.kind in "iu" else 0xFFFFFFFF
        out = np.full(v.shape, sentinel, dtype=np.int64)
        for p in range(d.shape[0]):
            used: set[int] = set()
            for j in range(v.shape[1]):
                hits = [i for i in np.flatnonzero(d[p] == v[p, j]) if i not in used]
                if hits:
                    out[p, j] = hits[0]
                    used.add(hits[0])
        o.write(dst, out.astype(dst.dtype))
    return o.issue("Vector", checks.free_size(data))


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` replaced by ``imm``
    (vals taken from the last to the first); their indices into ``dst_idx``."""
    o = _Op("nc_match_replace8", name)
    data, vals, dst = o.tile(data, "data"), o.tile(vals, "vals"), o.tile(dst, "dst", write=True)
    if dst_idx is not None:
        dst_idx = o.tile(dst_idx, "dst_idx", write=True)
    if o.ctx.numerics:
        d, v = _flat(o.value(data)).copy(), _flat(o.value(vals))
        idx = np.zeros(v.shape, dtype=np.int64)
        for p in range(d.shape[0]):
            matched = np.zeros(d.shape[1], dtype=bool)
            for j in reversed(range(v.shape[1])):
                hits = np.flatnonzero((d[p] == v[p, j]) & ~matched)
                if hits.size:
                    matched[hits[0]] = True
                    idx[p, j] = hits[0]
            d[p, matched] = np.float32(imm)
        o.write(dst, d)
        if dst_idx is not None:
            o.write(dst_idx, idx.astype(dst_idx.dtype))
    return o.issue("Vector", checks.free_size(data))


def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, var*count) of the even and of the odd elements."""
    o = _Op("bn_stats", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    n = checks.free_size(data)
    if n > 512 or checks.free_size(dst) != 6:
        raise ConstraintError(f"{o.w}: data needs <= 512 elements per partition ({n}) and dst 6 ({dst.shape})")
    if o.ctx.numerics:
        x = _flat(o.value(data))
        parts = []
        for half in (x[:, 0::2], x[:, 1::2]):
            c = half.shape[1]
            mean = half.mean(1) if c else np.zeros(x.shape[0], np.float32)
            parts += [np.full(x.shape[0], c, np.float32), mean, ((half - mean[:, None]) ** 2).sum(1)]
        o.write(dst, np.stack(parts, axis=1))
    return o.issue("Vector", n)


def bn_aggr(dst, data, name=None):
    """Mean and variance per partition from (count, mean, var*count) triples."""
    o = _Op("bn_aggr", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    if checks.free_size(data) % 3 or checks.free_size(dst) != 2:
        raise ConstraintError(f"{o.w}: data needs a multiple of 3 elements per partition and dst 2")
    if o.ctx.numerics:
        t = _flat(o.value(data)).reshape(data.shape[0], -1, 3)
        cnt, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
        total = cnt.sum(1)
        mu = (cnt * mean).sum(1) / total
        var = (m2 + cnt * (mean - mu[:, None]) ** 2).sum(1) / total
        o.write(dst, np.stack([mu, var], axis=1))
    return o.issue("Vector", checks.free_size(data))


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """On partitions 0, 16, ..., 112: indices (+index_offset) of the non-zero elements, then
    padding_val, then the count in the last slot; other partitions of dst unchanged."""
    o = _Op("nonzero_with_count", name)
    src, dst = o.tile(src, "src"), o.tile(dst, "dst", write=True)
    t = checks.free_size(src)
    if checks.free_size(dst) != t + 1 or dst.shape[0] != src.shape[0]:
        raise ConstraintError(f"{o.w}: dst must have one more element per partition than src: {dst.shape} vs {src.shape}")
    if o.ctx.numerics:
        # a partition nothing wrote yields an unwritten result row (refused where it is used)
        rows = _flat(np.asarray(src[0::16].written_mask()))
        live = [i * 16 for i in range(rows.shape[0]) if rows[i].any()]
        x = np.zeros((src.shape[0], t), np.float32)
        for p in live:
            x[p] = _flat(np.asarray(o.ctx.read(src[p:p + 1], o.op, name, f"src partition {p}")).astype(np.float32))[0]
        view = np.array(dst.array()).reshape(dst.shape[0], -1)
        mask = np.array(dst.written_mask()).reshape(dst.shape[0], -1)
        for p in live:
            nz = np.flatnonzero(x[p] != 0)
            row = np.full(t + 1, int(padding_val), dtype=np.int64)
            row[:nz.size] = nz + int(index_offset)
            row[t] = nz.size
            view[p] = row.astype(dst.dtype)
            mask[p] = True
        dst.assign(view.reshape(dst.shape))
        dst.set_written(mask.reshape(dst.shape))
    return o.issue("GpSimd", t)


def sequence_bounds(dst, segment_ids, name=None):
    """Per element: the [start, end) of the run of equal segment ids it belongs to; padding
    (segment id 0) gets start n and end -1, n the ids per partition ("nki.isa.sequence_bounds")."""
    o = _Op("sequence_bounds", name)
    segment_ids, dst = o.tile(segment_ids, "segment_ids"), o.tile(dst, "dst", write=True)
    if o.ctx.numerics:
        s = _flat(o.value(segment_ids))
        n = s.shape[1]
        start, end = np.zeros_like(s), np.zeros_like(s)
        for p in range(s.shape[0]):
            i = 0
            while i < n:
                j = i
                while j < n and s[p, j] == s[p, i]:
                    j += 1
                start[p, i:j], end[p, i:j] = (i, j) if s[p, i] != 0 else (n, -1)
                i = j
        o.write(dst, np.stack([start, end], axis=1))
    return o.issue("GpSimd", checks.free_size(segment_ids))


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each group of 32 partitions, output partition i takes input partition
    ``shuffle_mask[i]`` (255: unchanged)."""
    o = _Op("nc_stream_shuffle", name)
    src, dst = o.tile(src, "src"), o.tile(dst, "dst", write=True)
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or src.dtype != dst.dtype or checks.free_size(src) != checks.free_size(dst):
        raise ConstraintError(f"{o.w}: shuffle_mask must have 32 entries and src/dst the same dtype and free size")
    if o.ctx.numerics:
        vals, defined = o.ctx.read_moved(src, o.op, name, "src")  # moves data: unwritten stays unwritten
        x = _flat(vals)
        xd = np.ones(x.shape, bool) if defined is None else _flat(defined)
        out = np.array(dst.array()).reshape(dst.shape[0], -1)
        written = np.array(dst.written_mask()).reshape(dst.shape[0], -1)
        for base in range(0, dst.shape[0], 32):
            for i, m in enumerate(mask):
                if m != 255 and base + i < dst.shape[0] and base + m < x.shape[0]:
                    out[base + i] = x[base + m]
                    written[base + i] = xd[base + m]
        dst.assign(out.reshape(dst.shape))
        dst.set_written(written.reshape(dst.shape))
    return o.issue("Vector", checks.free_size(src))


def nc_n_gather(dst, data, indices, name=None):
    """Per partition: ``dst[p, j] = data[p, indices[p, j]]`` over the flattened free dims."""
    o = _Op("nc_n_gather", name)
    data, indices, dst = o.tile(data, "data"), o.tile(indices, "indices"), o.tile(dst, "dst", write=True)
    if o.ctx.numerics:
        d = _flat(np.asarray(o.ctx.read(data, o.op, name, "data")))
        i = _flat(o.value(indices, integer=True)).astype(np.int64)
        if (i < 0).any() or (i >= d.shape[1]).any():
            raise ConstraintError(f"{o.w}: indices outside [0, {d.shape[1]})")
        o.write(dst, np.take_along_axis(d, i, axis=1))
    return o.issue("GpSimd", checks.free_size(indices))


LOCAL_GATHER_ELEMS = (1, 2, 4, 8, 16, 32)  # num_elem_per_idx values "nki.isa.local_gather" allows
LOCAL_GATHER_PARTITIONS = 16  # SBUF partitions each of the eight GpSimd cores connects to


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Gather within groups of 16 partitions on the GpSimd engine ("nki.isa.local_gather"):
    the GpSimd core of partitions [16c, 16c + 16) flattens its slice of ``index`` partition
    dim first, keeps the first ``num_valid_indices`` (all by default) and, for each partition
    p of the slice, ``dst[p] = concat_j src[p, i_j : i_j + num_elem_per_idx]``, ``i_j`` an
    element offset into p's flattened free dims. Rules of the reference: uint16 indices;
    src and index with the same partitions, a multiple of 16; ``num_elem_per_idx`` in
    1, 2, 4, ..., 32; at most 4096 indices per core; no dtype cast. Out-of-bounds indices
    (undefined on the device) are refused."""
    o = _Op("local_gather", name)
    src, index, dst = o.tile(src_buffer, "src_buffer"), o.tile(index, "index"), o.tile(dst, "dst", write=True)
    p, n, group = src.shape[0], int(num_elem_per_idx), LOCAL_GATHER_PARTITIONS
    if index.shape[0] != p or p % group:
        raise ConstraintError(f"{o.w}: src_buffer and index need the same partitions, a multiple of {group}; "
                              f"got {src.shape[0]} and {index.shape[0]}")
    if index.dtype != np.uint16:
        raise ConstraintError(f"{o.w}: index must be uint16, got {index.dtype}")
    if n not in LOCAL_GATHER_ELEMS:
        raise ConstraintError(f"{o.w}: num_elem_per_idx must be one of {LOCAL_GATHER_ELEMS}, got {n}")
    per_core = index.size // (p // group)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, 4096):
        raise ConstraintError(f"{o.w}: num_valid_indices {valid} outside [1, min({per_core} indices per core, 4096)]")
    if dst.dtype != src.dtype or dst.shape[0] != p or checks.free_size(dst) != valid * n:
        raise ConstraintError(f"{o.w}: dst must be {src.dtype} with {p} partitions of {valid * n} elements, "
                              f"got {dst.dtype} {dst.shape}")
    if o.ctx.numerics:
        data = _flat(np.asarray(o.ctx.read(src, o.op, name, "src_buffer")))
        idx = _flat(o.value(index, integer=True)).astype(np.int64)
        out = np.empty((p, valid * n), dtype=data.dtype)
        for lo in range(0, p, group):
            offsets = idx[lo:lo + group].flatten(order="F")[:valid]
            if (offsets + n > data.shape[1]).any():
                raise ConstraintError(f"{o.w}: an index of partitions {lo}..{lo + group - 1} reads past the "
                                      f"{data.shape[1]} elements of a partition")
            out[lo:lo + group] = data[lo:lo + group][:, (offsets[:, None] + np.arange(n)).reshape(-1)]
        o.write(dst, out)
    return o.issue("GpSimd", valid * n)


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on the Scalar engine (nl.bypass skips a stage);
    with reduce_op the result is also reduced into reduce_res."""
    o = _Op("activate2", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    checks.same_partitions(dst, data, o.w, "dst", "data")
    p = data.shape[0]
    i0, i1 = o.scalar_or_column(imm0, p, "imm0", data.ndim), o.scalar_or_column(imm1, p, "imm1", data.ndim)
    if reduce_res is not None:
        reduce_res = o.tile(reduce_res, "reduce_res", write=True)
    if o.ctx.numerics:
        x = o.value(data)
        for fn, imm, rev in ((op0, i0, reverse0), (op1, i1, reverse1)):
            if fn is not None and _op_name(fn) != "bypass":
                x = fn(imm, x) if rev else fn(x, imm)
        y = np.asarray(op(x, relu_param) if _op_name(op) == "prelu" else op(x), dtype=np.float32)
        o.write(dst, y)
        if reduce_res is not None and reduce_op is not None:
            flat = _flat(y)
            red = {"add": flat.sum(1), "maximum": flat.max(1), "minimum": flat.min(1)}.get(_op_name(reduce_op))
            if red is None:
                raise ConstraintError(f"{o.w}: reduce_op must be nl.add, nl.maximum or nl.minimum")
            o.write(reduce_res, red)
    return o.issue("Scalar", checks.free_size(data))


# --- random numbers ----------------------------------------------------------------------------
# The device's generators (XORWOW on the Vector engine, "nki.isa.rand2"; per-engine states,
# "nki.isa.rand_set_state") are not reproduced: the simulator draws from NumPy's PCG64,
# seeded per program by set_rng_seed / rand_set_state (default seed 0). Distributions and
# shapes follow the pages; the values differ from the device's.
def _rng(ctx: Any) -> np.random.Generator:
    if getattr(ctx, "isa_rng", None) is None:
        ctx.isa_rng = np.random.default_rng(0)
    return ctx.isa_rng


def set_rng_seed(src_seeds, name=None):
    """Seed the random number generator from the values of ``src_seeds``."""
    o = _Op("set_rng_seed", name)
    src_seeds = o.tile(src_seeds, "src_seeds", on_chip=False)
    seed = o.value(src_seeds, integer=True).reshape(-1).astype(np.int64).tolist() if o.ctx.numerics else [0]
    o.ctx.isa_rng = np.random.default_rng([int(s) & 0xFFFFFFFF for s in seed])
    return o.issue("GpSimd", 1)


def rand_set_state(src_seeds, engine=_engine.gpsimd, name=None):
    """Set the generator state from ``src_seeds`` (see set_rng_seed)."""
    return set_rng_seed(src_seeds, name=name)


def rand_get_state(dst, engine=_engine.gpsimd, name=None):
    """Write a snapshot of the generator state (32-bit words) into ``dst``."""
    o = _Op("rand_get_state", name)
    dst = o.tile(dst, "dst", write=True, on_chip=False)
    if o.ctx.numerics:
        words = _rng(o.ctx).bit_generator.state["state"]["state"]
        vals = np.array([(words >> (32 * i)) & 0xFFFFFFFF for i in range(dst.size)], dtype=np.uint64)
        o.write(dst, vals.astype(dst.dtype))
    return o.issue("GpSimd", 1)


def rng(dst, engine=_engine.vector, name=None):
    """32 random bits per element, truncated to the integer dtype of ``dst``."""
    o = _Op("rng", name)
    dst = o.tile(dst, "dst", write=True)
    if dst.dtype.kind not in "iu":
        raise ConstraintError(f"{o.w}: dst must be an integer dtype, got {dst.dtype.name}")
    if o.ctx.numerics:
        bits = _rng(o.ctx).integers(0, 2 ** 32, size=dst.shape, dtype=np.uint64)
        o.write(dst, (bits & ((1 << (8 * dst.dtype.itemsize)) - 1)).astype(np.uint64).astype(dst.dtype, casting="unsafe"))
    return o.issue("Vector", checks.free_size(dst))


def rand2(dst, min, max, name=None):  # noqa: A002 - the reference names
    """Uniform random numbers in [min, max] (scalars or [P, 1] tiles), cast to dst's dtype."""
    o = _Op("rand2", name)
    dst = o.tile(dst, "dst", write=True)
    p = dst.shape[0]
    lo, hi = o.scalar_or_column(min, p, "min", dst.ndim), o.scalar_or_column(max, p, "max", dst.ndim)
    if o.ctx.numerics:
        u = _rng(o.ctx).random(dst.shape, dtype=np.float32)
        o.write(dst, lo + u * (hi - lo))
    return o.issue("Vector", checks.free_size(dst))


def dropout(dst, data, prob, name=None):
    """Elements of ``data`` replaced by zero with probability ``prob`` (a scalar or [P, 1] tile)."""
    o = _Op("dropout", name)
    data, dst = o.tile(data, "data"), o.tile(dst, "dst", write=True)
    if dst.dtype != data.dtype:
        raise ConstraintError(f"{o.w}: dst dtype {dst.dtype.name} must match data dtype {data.dtype.name}")
    pr = o.scalar_or_column(prob, data.shape[0], "prob", data.ndim)
    if o.ctx.numerics:
        keep = _rng(o.ctx).random(data.shape, dtype=np.float32) >= pr
        o.write(dst, np.where(keep, o.value(data), 0))
    return o.issue("Vector", checks.free_size(data))


def topk(val_dst, idx_dst, src, n, name=None):
    """The K largest of the ``n`` BF16 elements of a 16-partition snake (element i in partition
    i % 16, column i // 16 of each 16-partition group), ascending, and their indices."""
    o = _Op("topk", name)
    src, val_dst, idx_dst = o.tile(src, "src"), o.tile(val_dst, "val_dst", write=True), o.tile(idx_dst, "idx_dst", write=True)
    n, k = int(n), checks.free_size(val_dst)
    if src.shape[0] % 16 or not 8 <= n < 65536 or not 1 <= k <= n or checks.free_size(src) * 16 < n:
        raise ConstraintError(f"{o.w}: needs partitions a multiple of 16, 8 <= n < 65536, 1 <= K <= n and "
                              f"src free size >= ceil(n / 16); got src {src.shape}, n={n}, K={k}")
    if o.ctx.numerics:
        x = _flat(o.value(src))
        vals = np.zeros((src.shape[0], k), np.float32)
        idxs = np.zeros((src.shape[0], k), np.int64)
        for g in range(0, src.shape[0], 16):
            snake = x[g:g + 16].T.reshape(-1)[:n]
            top = np.argsort(snake, kind="stable")[-k:]
            vals[g:g + 16], idxs[g:g + 16] = snake[top], top
        o.write(val_dst, vals)
        o.write(idx_dst, idxs.astype(idx_dst.dtype))
    return o.issue("GpSimd", 4 * n + k)
