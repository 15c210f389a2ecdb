"""``neuronxcc.nki.isa`` (the pre-0.6 NKI API): instructions that return a new tile.

Follows the "nki.isa" API reference of Neuron SDK 2.2x (aws-neuron-sdk, nki/api/nki.isa.rst
at the pre-0.6 docs): ``nisa.nc_matmul(stationary, moving)`` returns the PSUM tile
[M, N] (FP32), ``nisa.activation(op, data, ...)`` / ``tensor_tensor`` / ``tensor_scalar`` /
``tensor_copy`` return an SBUF tile of the data's shape, ``tensor_reduce`` the reduced
shape, ``nc_transpose`` the transposed tile (PSUM on the Tensor engine, SBUF on Vector),
``bn_stats`` [P, 6], ``bn_aggr`` [P, 2], ``max8`` / ``nc_find_index8`` [P, 8],
``memset(shape, value, dtype)`` and ``iota(expr, dtype)`` new tiles. Each allocates its
result and calls the dst-first instruction of ``kernels.sim.isa`` (same engine, same rules,
same timing). Every one takes ``mask=`` (the box of its operands it runs on) and ``dtype=``.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from .. import isa as _isa
from .. import language as _nl
from ..constants import dge_mode, engine, nc_version, oob_mode, reduce_cmd  # noqa: F401
from ..errors import ConstraintError
from ..state import here
from ..tensor import MemoryRegion, NkiTensor
from . import index as _ix
from .language import resolve

tensor_engine, vector_engine, scalar_engine, gpsimd_engine = engine.tensor, engine.vector, engine.scalar, engine.gpsimd
unknown_engine = engine.unknown
get_nc_version = _isa.get_nc_version
_NP_OPS = {np.add: _nl.add, np.subtract: _nl.subtract, np.multiply: _nl.multiply, np.maximum: _nl.maximum,
           np.minimum: _nl.minimum, np.divide: _nl.divide, np.max: _nl.maximum, np.min: _nl.minimum,
           # the reductions nl.max / nl.min name the ALU's max / min as an instruction's op
           # (the API reference's tensor_scalar_cumulative examples pass op1=nl.max)
           _nl.max: _nl.maximum, _nl.min: _nl.minimum}


def _op(o: Any) -> Any:
    """A NumPy ufunc or a (mask-taking) legacy nl function as the simulator's nl function."""
    import inspect
    o = inspect.unwrap(o) if callable(o) and hasattr(o, "__wrapped__") else o
    return _NP_OPS.get(o, o)


def _run(name: str, shape: tuple, dtype: Any, buffer: MemoryRegion, call: Any, mask: Any, operands: dict) -> NkiTensor:
    """Allocate the result, then ``call(dst, **operands)`` on the mask's box (all of it without one)."""
    w = here(f"nisa.{name}")
    out = _nl.ndarray(tuple(int(s) for s in shape), dtype, buffer)
    if mask is None:
        call(out, **{k: resolve(v, f"nisa.{name}") for k, v in operands.items()})
        return out
    first = next((v for v in operands.values() if isinstance(v, (NkiTensor, _ix.OutOfBounds))), out)
    space = tuple(first.shape)  # the mask ranges over the operands' index space
    box = _ix.mask_box(mask, space, w)
    if builtins.all(b.stop > b.start for b in box):
        obox = tuple(box[d] if d < len(space) and n == space[d] else slice(0, n) for d, n in enumerate(out.shape))
        call(out[obox], **{k: resolve(v, f"nisa.{name}", box, space) for k, v in operands.items()})
    return out


def _dt(dtype: Any, x: Any) -> Any:
    return dtype if dtype is not None else x.dtype


def nc_matmul(stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, mask=None,
              is_transpose=False, tile_position=(), tile_size=(), perf_mode=None, **kwargs):
    """[M, N] FP32 PSUM tile = stationary[K, M].T @ moving[K, N] ("nki.isa.nc_matmul")."""
    if perf_mode is not None and str(getattr(perf_mode, "name", perf_mode)).startswith("double_row"):
        return _double_row(stationary, moving, mask)
    m = int(math.prod(stationary.shape[1:]))
    n = int(math.prod(moving.shape[1:]))
    dtype = stationary.dtype if is_transpose else np.float32
    return _run("nc_matmul", (m, n) if not is_transpose else (m, stationary.shape[0]), dtype, MemoryRegion.psum,
                lambda dst, **o: _isa.nc_matmul(dst, o["s"], o["m"], is_transpose=is_transpose,
                                                tile_position=tile_position, tile_size=tile_size, accumulate=False),
                mask, {"s": stationary, "m": moving})


def _double_row(stationary, moving, mask):
    """FP8 double-row mode: stationary [K, 2, M] and moving [K, 2, N] hold two rows per PE
    ("matmul_perf_mode.double_row": two FP8 element pairs packed, twice the throughput), so
    the [M, N] result contracts over K and the pair: sum_l stationary[:, l].T @ moving[:, l]
    (the API reference's example, einsum "kli,klj->ij"). Run as two accumulating matmuls at
    the double-row rate."""
    w = here("nisa.nc_matmul")
    if len(stationary.shape) != 3 or len(moving.shape) != 3 or stationary.shape[1] != 2 or moving.shape[1] != 2:
        raise ConstraintError(f"{w}: perf_mode double_row needs stationary [K, 2, M] and moving [K, 2, N], got "
                              f"{tuple(stationary.shape)} and {tuple(moving.shape)}")
    if np.dtype(stationary.dtype).itemsize != 1 or np.dtype(moving.dtype).itemsize != 1:
        raise ConstraintError(f"{w}: perf_mode double_row takes FP8 operands, got {stationary.dtype} and "
                              f"{moving.dtype}")
    fast = _isa.matmul_perf_mode.double_row

    def call(dst, **o):
        for row in range(2):
            _isa.nc_matmul(dst, o["s"][:, row, :], o["m"][:, row, :], accumulate=row > 0, perf_mode=fast)
    return _run("nc_matmul", (stationary.shape[2], moving.shape[2]), np.float32, MemoryRegion.psum, call, mask,
                {"s": stationary, "m": moving})


def nc_transpose(data, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """The 2-D tile transposed: PSUM on the Tensor engine, SBUF on Vector ("nki.isa.nc_transpose")."""
    p, f = data.shape[0], int(math.prod(data.shape[1:]))
    buf = MemoryRegion.sbuf if engine is globals()["engine"].vector else MemoryRegion.psum
    return _run("nc_transpose", (f, p), _dt(dtype, data), buf,
                lambda dst, **o: _isa.nc_transpose(dst, o["d"], engine=engine), mask, {"d": data})


def activation(op, data, bias=None, scale=1.0, mask=None, dtype=None, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, **kwargs):
    """``op(data * scale + bias)`` into a new SBUF tile ("nki.isa.activation")."""
    ops = {"d": data, "b": bias, "s": scale}
    return _run("activation", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.activation(dst, op, o["d"], bias=o["b"], scale=o["s"],
                                                 reduce_op=_op(reduce_op), reduce_res=reduce_res,
                                                 reduce_cmd=reduce_cmd), mask, ops)


def activation_reduce(op, data, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, **kwargs):
    return activation(op, data, bias=bias, scale=scale, mask=mask, dtype=dtype, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=reduce_cmd.reset_reduce)


def tensor_tensor(data1, data2, op, dtype=None, mask=None, engine=engine.unknown, **kwargs):
    """``op(data1, data2)`` element-wise into a new SBUF tile ("nki.isa.tensor_tensor")."""
    return _run("tensor_tensor", data1.shape, _dt(dtype, data1), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_tensor(dst, o["a"], o["b"], _op(op), engine=engine), mask,
                {"a": data1, "b": data2})


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, dtype=None,
                  mask=None, engine=engine.unknown, **kwargs):
    """``(data op0 operand0) op1 operand1`` into a new SBUF tile ("nki.isa.tensor_scalar")."""
    return _run("tensor_scalar", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_scalar(dst, o["d"], _op(op0), o["o0"], reverse0, _op(op1), o["o1"],
                                                    reverse1, engine=engine),
                mask, {"d": data, "o0": operand0, "o1": operand1})


def tensor_copy(src, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """A copy of the on-chip tile ``src`` in SBUF ("nki.isa.tensor_copy")."""
    return _run("tensor_copy", src.shape, _dt(dtype, src), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_copy(dst, o["s"], engine=engine), mask, {"s": src})


def tensor_reduce(op, data, axis, mask=None, dtype=None, negate=False, keepdims=False, **kwargs):
    """``op`` over the free ``axis`` of ``data`` into a new SBUF tile ("nki.isa.tensor_reduce")."""
    axes = tuple(int(a) % len(data.shape) for a in (axis if isinstance(axis, (list, tuple)) else (axis,)))
    shape = tuple(1 if d in axes else n for d, n in enumerate(data.shape)) if keepdims else \
        tuple(n for d, n in enumerate(data.shape) if d not in axes)
    return _run("tensor_reduce", shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_reduce(dst, _op(op), o["d"], list(axes), negate=negate,
                                                    keepdims=keepdims), mask, {"d": data})


def tensor_partition_reduce(op, data, mask=None, dtype=None, **kwargs):
    """``op`` over the partitions of ``data``: a [1, ...] tile ("nki.isa.tensor_partition_reduce")."""
    return _run("tensor_partition_reduce", (1,) + tuple(data.shape[1:]), _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_partition_reduce(dst, _op(op), o["d"]), mask, {"d": data})


def reciprocal(data, dtype=None, mask=None, **kwargs):
    return _run("reciprocal", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.reciprocal(dst, o["d"]), mask, {"d": data})


def dropout(data, prob, mask=None, dtype=None, **kwargs):
    return _run("dropout", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.dropout(dst, o["d"], o["p"]), mask, {"d": data, "p": prob})


def memset(shape, value, dtype, mask=None, engine=engine.unknown, **kwargs):
    """A new SBUF tile of ``shape`` filled with ``value`` ("nki.isa.memset")."""
    return _run("memset", shape, dtype, MemoryRegion.sbuf, lambda dst, **o: _isa.memset(dst, value, engine=engine),
                mask, {})


def iota(expr, dtype, mask=None, **kwargs):
    """A new SBUF tile holding the values of the index expression ``expr`` ("nki.isa.iota")."""
    e = expr if isinstance(expr, _ix.Idx) else _ix.Idx(expr)
    shape = e.shape if len(e.shape) >= 2 else (e.shape[0] if e.shape else 1, 1)
    vals = np.broadcast_to(e.v.reshape(shape) if e.v.ndim < 2 else e.v, shape)

    def call(dst, **o):
        from ..state import current
        ctx = current()
        if ctx.numerics:
            ctx.write(dst, vals[tuple(slice(0, n) for n in dst.shape)] if dst.shape != shape else vals)
        from .. import rates
        ctx.issue("iota", None, "GpSimd", rates.elementwise_seconds(int(math.prod(dst.shape[1:]))), [], [dst])
    return _run("iota", shape, dtype, MemoryRegion.sbuf, call, mask, {})


def bn_stats(data, mask=None, dtype=None, **kwargs):
    return _run("bn_stats", (data.shape[0], 6), _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.bn_stats(dst, o["d"]), mask, {"d": data})


def bn_aggr(data, mask=None, dtype=None, **kwargs):
    return _run("bn_aggr", (data.shape[0], 2), _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.bn_aggr(dst, o["d"]), mask, {"d": data})


def max8(src, mask=None, dtype=None, **kwargs):
    return _run("max8", (src.shape[0], 8), _dt(dtype, src), MemoryRegion.sbuf,
                lambda dst, **o: _isa.max8(dst, o["s"]), mask, {"s": src})


def nc_find_index8(data, vals, mask=None, dtype=np.uint32, **kwargs):
    return _run("nc_find_index8", (data.shape[0], 8), dtype or np.uint32, MemoryRegion.sbuf,
                lambda dst, **o: _isa.nc_find_index8(dst, o["d"], o["v"]), mask, {"d": data, "v": vals})


def nc_match_replace8(data, vals, imm, dst_idx=None, mask=None, dtype=None, **kwargs):
    return _run("nc_match_replace8", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.nc_match_replace8(dst, o["d"], o["v"], imm, dst_idx=dst_idx), mask,
                {"d": data, "v": vals})


def scalar_tensor_tensor(data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None, mask=None,
                         **kwargs):
    return _run("scalar_tensor_tensor", data.shape, _dt(dtype, data), MemoryRegion.sbuf,
                lambda dst, **o: _isa.scalar_tensor_tensor(dst, o["d"], _op(op0), o["o0"], _op(op1), o["o1"],
                                                           reverse0=reverse0, reverse1=reverse1),
                mask, {"d": data, "o0": operand0, "o1": operand1})


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, dtype=None, mask=None,
                       **kwargs):
    return _run("tensor_tensor_scan", data0.shape, _dt(dtype, data0), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_tensor_scan(dst, o["a"], o["b"], o["i"], _op(op0), _op(op1),
                                                         reverse0=reverse0, reverse1=reverse1),
                mask, {"a": data0, "b": data1, "i": initial})


def dma_copy(dst, src, mask=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, **kwargs):
    """Copy ``src`` into ``dst`` by DMA (pre-0.6: keyword ``dst``/``src``; "nki.isa.dma_copy")."""
    if mask is not None:
        box = _ix.mask_box(mask, tuple(dst.shape), here("nisa.dma_copy"))
        return _isa.dma_copy(resolve(dst, "nisa.dma_copy", box, dst.shape), resolve(src, "nisa.dma_copy", box,
                                                                                     src.shape))
    dst, src = resolve(dst, "nisa.dma_copy"), resolve(src, "nisa.dma_copy")
    rmw = kwargs.get("dst_rmw_op")
    if rmw is not None:  # dst = rmw(dst, src) in the DMA engine: the 0.6+ dma_compute (add only)
        return _isa.dma_compute(dst, [dst, src], _op(rmw))
    return _isa.dma_copy(dst, src, dge_mode=dge_mode, oob_mode=oob_mode)


def dma_transpose(src, axes=None, mask=None, dtype=None, dge_mode=dge_mode.unknown, **kwargs):
    """``src`` transposed by DMA into a new SBUF tile ("nki.isa.dma_transpose")."""
    perm = tuple(axes) if axes is not None else tuple(reversed(range(len(src.shape)))) if len(src.shape) != 4 \
        else (3, 1, 2, 0)
    shape = tuple(src.shape[a] for a in perm)
    return _run("dma_transpose", shape, _dt(dtype, src), MemoryRegion.sbuf,
                lambda dst, **o: _isa.dma_transpose(dst, o["s"], axes=perm), mask, {"s": src})


def tensor_copy_predicated(src, dst, predicate, mask=None, reverse_pred=False, **kwargs):
    """Copy ``src`` into ``dst`` where ``predicate`` is non-zero (in place; "nki.isa.tensor_copy_predicated").
    A bool predicate (the API reference's example passes ``np.less_equal(a, 0.8)``) is one byte
    of 0 or 1 per element, read here as the uint8 the instruction takes."""
    pred = resolve(predicate, "nisa.tensor_copy_predicated")
    if isinstance(pred, NkiTensor) and pred.dtype == np.bool_:
        pred = pred.view(np.uint8)
    return _isa.tensor_copy_predicated(resolve(dst, "nisa.tensor_copy_predicated"),
                                       resolve(src, "nisa.tensor_copy_predicated"), pred, reverse_pred=reverse_pred)


def nc_stream_shuffle(src, dst, shuffle_mask, mask=None, **kwargs):
    """Shuffle partitions of ``src`` into ``dst`` (in place; "nki.isa.nc_stream_shuffle")."""
    return _isa.nc_stream_shuffle(resolve(dst, "nisa.nc_stream_shuffle"), resolve(src, "nisa.nc_stream_shuffle"),
                                  shuffle_mask)


def affine_select(pred, on_true_tile, on_false_value, mask=None, dtype=None, **kwargs):
    """``on_true_tile`` where the index predicate ``pred`` holds, else ``on_false_value``
    ("nki.isa.affine_select", pre-0.6: ``pred`` an affine comparison of index expressions)."""
    t = on_true_tile
    cond = np.broadcast_to(pred.v, tuple(t.shape))

    def call(dst, **o):
        from ..state import current
        from .. import rates
        ctx = current()
        if ctx.numerics:
            vals = np.asarray(ctx.read(o["t"], "affine_select", None, "on_true_tile")).astype(np.float32)
            ctx.write(dst, np.where(cond, vals, np.float32(on_false_value)))
        ctx.issue("affine_select", None, "GpSimd", rates.elementwise_seconds(int(math.prod(dst.shape[1:]))),
                  [o["t"]], [dst])
    return _run("affine_select", t.shape, _dt(dtype, t), MemoryRegion.sbuf, call, mask, {"t": t})


from .. import constants  # noqa: E402 - neuronxcc.nki.isa.constants
from .dynamic import local_gather, tensor_copy_dynamic_dst, tensor_copy_dynamic_src  # noqa: E402,F401

__path__: list[str] = []  # a package, so that ``neuronxcc.nki.isa.constants`` imports

_SHAPES = {"sequence_bounds": lambda a: (a.shape[0], 2) + tuple(a.shape[1:])}


def _returning(name: str, fn: Any) -> Any:
    """The pre-0.6 form of a dst-first instruction not listed above: the result takes the
    shape of the first tensor operand ("nki.isa": the element-wise instructions return a
    tile of their input's shape) and ``dtype`` (or the operand's dtype)."""
    import inspect
    params = [p for p in inspect.signature(fn).parameters if p != "dst"]

    def wrapper(*args: Any, mask: Any = None, dtype: Any = None, **kw: Any) -> Any:
        if "dst" in kw:
            return fn(**{k: _op(v) if callable(v) and not isinstance(v, NkiTensor) else resolve(v, f"nisa.{name}")
                         for k, v in kw.items()})
        bound = dict(zip(params, args), **kw)
        first = next(v for v in bound.values() if isinstance(v, NkiTensor))
        shape = _SHAPES.get(name, lambda a: a.shape)(first)
        return _run(name, shape, _dt(dtype, first), MemoryRegion.sbuf,
                    lambda dst, **o: fn(dst, **{k: _op(v) if callable(v) and not isinstance(v, NkiTensor) else v
                                                for k, v in o.items()}), mask, bound)
    wrapper.__name__ = name
    wrapper.__doc__ = f"``nisa.{name}`` returning its result tile (pre-0.6 form of the dst-first instruction)."
    return wrapper


def __getattr__(name: str) -> Any:
    fn = getattr(_isa, name, None)
    if fn is None:
        raise AttributeError(f"neuronxcc.nki.isa has no attribute {name!r}")
    import inspect
    try:
        first = next(iter(inspect.signature(fn).parameters), None)
    except (TypeError, ValueError):
        first = None
    return _returning(name, fn) if first == "dst" else fn
