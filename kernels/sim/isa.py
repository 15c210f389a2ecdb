"""The simulator's ``nki.isa`` (nisa): the instructions trnopt kernels use.

Over ~450 lines: the core nki.isa instructions share one operand-checking path; the
additional ones live in isa_vector.py.

Names, parameters and defaults follow the "nki.isa" API reference (NKI 0.6/0.7). Each
instruction checks its rules (``checks``), computes with NumPy in numerics mode (FP32
arithmetic, FP32 PSUM accumulation, results cast to the dst dtype through ml_dtypes),
and is placed on its engine's timeline with a duration from ``rates``.

nc_matmul: ``dst[M, N] = stationary[K, M].T @ moving[K, N]``. ``accumulate=None`` (the
default) adds into the PSUM elements already written and starts from zero on elements
nothing has written, which is how a fresh PSUM tile accumulates over K tiles;
``accumulate=True`` adds (the dst must be written); ``False`` overwrites.
``tile_position``/``tile_size`` (PE tiling) are accepted and do not change the timing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import checks, rates
from . import registers as _registers
from . import unimplemented as _unimplemented
from . import language as nl
from .errors import ConstraintError, SimulatorError
from .instruction import NkiInstruction
from .isa_vector import engine_seconds as _engine_seconds
from .rendezvous import Deposit
from .state import BLAS_LOCK
from .state import current as _current
from .tensor import MemoryRegion, NkiTensor


from .constants import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class NkiValidationError(Exception):
    """Raised by the reference on invalid instructions (the simulator raises ConstraintError)."""


_ENGINE_NAMES = {engine.vector: "Vector", engine.scalar: "Scalar", engine.gpsimd: "GpSimd",
                 engine.tensor: "Tensor"}


def _ctx(op: str) -> Any:
    ctx = _current()
    if ctx is None:
        raise SimulatorError(f"nisa.{op} called outside a simulated kernel (use nki.simulate or run_ranks)")
    return ctx


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _done(op: str, name: str | None, t: tuple[float, float]) -> NkiInstruction:
    return NkiInstruction(op, name, t[0], t[1])


_TARGETS = {"trn1": nc_version.gen2, "inf2": nc_version.gen2, "gen2": nc_version.gen2,
            "trn2": nc_version.gen3, "gen3": nc_version.gen3, "trn3": nc_version.gen4, "gen4": nc_version.gen4}


def get_nc_version():
    """The simulated NeuronCore generation: NEURON_PLATFORM_TARGET_OVERRIDE (trn1|inf2|gen2,
    trn2|gen3, trn3|gen4, as "nki.jit" reads it), else gen3 (Trn2, the simulator's rates)."""
    import os

    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip().lower()
    if target and target not in _TARGETS:
        raise ConstraintError(f"NEURON_PLATFORM_TARGET_OVERRIDE={target!r}: expected one of {sorted(_TARGETS)}")
    return _TARGETS.get(target, nc_version.gen3)


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             engine=engine.unknown, name=None):
    """Copy ``src`` to ``dst`` by DMA (HBM<->SBUF, HBM<->HBM, SBUF<->SBUF; never PSUM).
    Equal element counts; different dtypes convert src -> float32 -> dst ("nki.isa.dma_copy")."""
    ctx = _ctx("dma_copy")
    w = ctx.where("dma_copy", name)
    dst, src = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(src, w, "src")
    checks.dma(dst, src, w)
    if getattr(oob_mode, "name", oob_mode) == "skip" and (src._oob is not None or dst._oob is not None):
        return _dma_copy_skipping(ctx, w, dst, src, name)
    if ctx.numerics:
        # a DMA moves bytes, written or not (HBM holds whatever was there; an HBM fence copies a
        # tensor onto itself): unwritten elements move along as unwritten, refused where used
        data, mask = ctx.read_moved(src, "dma_copy", name, "src")
        if src.dtype != dst.dtype:
            data = _f32(data)
        ctx.write_moved(dst, data.reshape(dst.shape), None if mask is None else mask.reshape(dst.shape))
    return _done("dma_copy", name, ctx.issue_dma("dma_copy", name, src.nbytes, [src], [dst]))


def _dma_copy_skipping(ctx, w: str, dst, src, name):
    """dma_copy with oob_mode.skip and a gather (src) or scatter (dst) view holding
    out-of-bounds indices: those partitions transfer nothing ("nki.isa.dma_copy": "skip the DMA
    transfer for a given dynamic address or index when it is out of bound"); the other side's
    partitions correspond one to one."""
    side, other = (src, dst) if src._oob is not None else (dst, src)
    if other._oob is not None:
        raise NotImplementedError(f"{w}: out-of-bounds indices in both src and dst are not simulated")
    if other.shape[0] != side.shape[0]:
        raise NotImplementedError(f"{w}: skipping out-of-bounds rows needs the other side's first dim to be the "
                                  f"{side.shape[0]} indexed partitions, got shape {other.shape}")
    keep = ~side._oob[0]
    runs, p = [], 0
    while p < keep.size:
        if keep[p]:
            q = p
            while q < keep.size and keep[q]:
                q += 1
            runs.append((p, q))
            p = q
        else:
            p += 1
    pairs = []
    for p0, p1 in runs:
        s_, o_ = side._gather_partitions(p0, p1), other[p0:p1]
        pairs.append((s_, o_) if side is src else (o_, s_))
    if ctx.numerics:
        for s_, d_ in pairs:
            data = ctx.read(s_, "dma_copy", name, "src")
            if s_.dtype != d_.dtype:
                data = _f32(data)
            ctx.write(d_, data.reshape(d_.shape))
    nbytes = sum(s_.nbytes for s_, _ in pairs)
    return _done("dma_copy", name, ctx.issue_dma("dma_copy", name, nbytes, [s_ for s_, _ in pairs],
                                                 [d_ for _, d_ in pairs]))


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] (PSUM) = stationary[K, M].T @ moving[K, N]`` on the Tensor engine."""
    ctx = _ctx("nc_matmul")
    w = ctx.where("nc_matmul", name)
    dst = checks.tensor_arg(dst, w, "dst")
    stationary, moving = checks.tensor_arg(stationary, w, "stationary"), checks.tensor_arg(moving, w, "moving")
    if is_transpose:
        return _matmul_transpose(ctx, w, dst, stationary, moving, name)
    k, m, n = checks.matmul(dst, stationary, moving, w)
    reads = [stationary, moving]
    if ctx.numerics:
        a = _f32(ctx.read(stationary, "nc_matmul", name, "stationary").reshape(k, m))
        b = _f32(ctx.read(moving, "nc_matmul", name, "moving").reshape(k, n))
        with BLAS_LOCK:
            r = a.T @ b
        if accumulate is None or accumulate:
            if accumulate:
                prev = _f32(ctx.read(dst, "nc_matmul", name, "accumulating dst"))
            else:
                prev = np.where(dst.written_mask(), _f32(dst.array()), np.float32(0))
            r = prev.reshape(m, n) + r
        ctx.write(dst, r.reshape(dst.shape))
    if accumulate is None or accumulate:
        reads = reads + [dst]
    dur = rates.matmul_seconds(m, n, stationary.dtype, perf_mode is matmul_perf_mode.double_row)
    return _done("nc_matmul", name, ctx.issue("nc_matmul", name, "Tensor", dur, reads, [dst]))


def _matmul_transpose(ctx, w, dst, stationary, moving, name):
    """``is_transpose=True``: the PE array transposes the stationary tile bit-accurately
    (moving is the identity; "nki.isa.nc_matmul", NeuronCore-v3+): dst[M, K] = stationary.T."""
    checks.in_buffer(stationary, [MemoryRegion.sbuf], w, "matmul stationary")
    checks.in_buffer(moving, [MemoryRegion.sbuf], w, "matmul moving")
    checks.in_buffer(dst, [MemoryRegion.psum], w, "matmul result (dst)")
    k, m = stationary.partitions, checks.free_size(stationary)
    if dst.partitions != m or checks.free_size(dst) != k:
        raise ConstraintError(f"{w}: transpose of stationary {stationary.shape} needs dst [{m}, {k}], got {dst.shape}")
    if ctx.numerics:
        eye = ctx.read(moving, "nc_matmul", name, "moving").astype(np.float32).reshape(moving.partitions, -1)
        if eye.shape != (k, k) or not np.array_equal(eye, np.eye(k, dtype=np.float32)):
            raise ConstraintError(f"{w}: is_transpose=True needs the identity [{k}, {k}] as moving, got "
                                  f"{moving.shape} that is not the identity")
        data, mask = ctx.read_moved(stationary, "nc_matmul", name, "stationary")
        ctx.write_moved(dst, data.reshape(k, m).T, None if mask is None else mask.reshape(k, m).T)
    dur = rates.matmul_seconds(m, k, stationary.dtype)
    return _done("nc_matmul", name, ctx.issue("nc_matmul", name, "Tensor", dur, [stationary, moving], [dst]))


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """``dst = data.T`` for a 2-D tile: on the Tensor engine into PSUM (default), or on the
    Vector engine SBUF->SBUF for tiles up to 32x32."""
    ctx = _ctx("nc_transpose")
    w = ctx.where("nc_transpose", name)
    dst, data = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(data, w, "data")
    checks.on_chip(data, w, "data")
    checks.on_chip(dst, w, "dst")
    p, f = data.shape[0], checks.free_size(data)
    if dst.shape[0] != f or checks.free_size(dst) != p:
        raise ConstraintError(f"{w}: transpose of {data.shape} needs dst [{f}, {p}], got {dst.shape}")
    on_vector = engine is globals()["engine"].vector
    if on_vector:
        if p > 32 or f > 32:
            raise ConstraintError(f"{w}: Vector-engine transpose is limited to 32x32, got {data.shape}")
    else:
        checks.in_buffer(data, [MemoryRegion.sbuf], w, "transpose input (data)")
        checks.in_buffer(dst, [MemoryRegion.psum], w, "Tensor-engine transpose result (dst)")
        if f > rates.GEMM_STATIONARY_FMAX:
            raise ConstraintError(f"{w}: transpose input free size {f} > {rates.GEMM_STATIONARY_FMAX}")
    if ctx.numerics:
        vals, mask = ctx.read_moved(data, "nc_transpose", name, "data")
        ctx.write_moved(dst, vals.reshape(p, f).T, None if mask is None else mask.reshape(p, f).T)
    if on_vector:
        dur, eng = rates.elementwise_seconds(f), "Vector"
    else:
        dur, eng = rates.matmul_seconds(p, f, data.dtype), "Tensor"
    return _done("nc_transpose", name, ctx.issue("nc_transpose", name, eng, dur, [data], [dst]))


def _elementwise_engine(e: Any, default: str) -> str:
    return _ENGINE_NAMES.get(e, default)


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """Copy an on-chip tile (SBUF/PSUM) to another, converting to the dst dtype."""
    ctx = _ctx("tensor_copy")
    w = ctx.where("tensor_copy", name)
    dst, src = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(src, w, "src")
    checks.on_chip(src, w, "src")
    checks.on_chip(dst, w, "dst")
    checks.same_partitions(dst, src, w, "dst", "src")
    if ctx.numerics:
        vals, mask = ctx.read_moved(src, "tensor_copy", name, "src")
        ctx.write_moved(dst, _f32(vals), mask)
    eng = _elementwise_engine(engine, "Vector")
    dur = _engine_seconds(eng, checks.free_size(src), [src], [dst])
    return _done("tensor_copy", name, ctx.issue("tensor_copy", name, eng, dur, [src], [dst]))


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """``dst = op(data1, data2)`` element-wise, computed in FP32 (Vector engine by default)."""
    ctx = _ctx("tensor_tensor")
    w = ctx.where("tensor_tensor", name)
    dst = checks.tensor_arg(dst, w, "dst")
    data1, data2 = checks.tensor_arg(data1, w, "data1"), checks.tensor_arg(data2, w, "data2")
    for role, v in (("dst", dst), ("data1", data1), ("data2", data2)):
        checks.on_chip(v, w, role)
    checks.same_partitions(data1, data2, w, "data1", "data2")
    checks.same_partitions(dst, data1, w, "dst", "data1")
    if not callable(op):
        raise ConstraintError(f"{w}: op must be an nl function such as nl.add, got {op!r}")
    if ctx.numerics:
        a = _f32(ctx.read(data1, "tensor_tensor", name, "data1"))
        b = _f32(ctx.read(data2, "tensor_tensor", name, "data2")).reshape(a.shape)
        ctx.write(dst, np.asarray(op(a, b)).reshape(dst.shape))
    eng = _elementwise_engine(engine, "Vector")
    dur = _engine_seconds(eng, checks.free_size(dst), [data1, data2], [dst])
    return _done("tensor_tensor", name, ctx.issue("tensor_tensor", name, eng, dur, [data1, data2], [dst]))


def _operand(ctx: Any, v: Any, shape: tuple[int, ...], op: str, name: str | None, role: str,
             reads: list[NkiTensor]) -> Any:
    """A scalar, or a [P, 1] tile broadcast along the free dims."""
    if isinstance(v, NkiTensor):
        checks.on_chip(v, ctx.where(op, name), role)
        if v.shape[0] != shape[0] or checks.free_size(v) != 1:
            raise ConstraintError(f"{ctx.where(op, name)}: {role} must be a scalar or a [{shape[0]}, 1] "
                                  f"tile, got shape {v.shape}")
        reads.append(v)
        if not ctx.numerics:
            return None
        return _f32(ctx.read(v, op, name, role)).reshape((shape[0],) + (1,) * (len(shape) - 1))
    return np.float32(v)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operands are scalars or [P, 1] tiles."""
    ctx = _ctx("tensor_scalar")
    w = ctx.where("tensor_scalar", name)
    dst, data = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(data, w, "data")
    checks.on_chip(data, w, "data")
    checks.on_chip(dst, w, "dst")
    checks.same_partitions(dst, data, w, "dst", "data")
    reads = [data]
    o0 = _operand(ctx, operand0, data.shape, "tensor_scalar", name, "operand0", reads)
    o1 = _operand(ctx, operand1, data.shape, "tensor_scalar", name, "operand1", reads) if op1 else None
    if ctx.numerics:
        x = _f32(ctx.read(data, "tensor_scalar", name, "data"))
        x = op0(o0, x) if reverse0 else op0(x, o0)
        if op1 is not None:
            x = op1(o1, x) if reverse1 else op1(x, o1)
        ctx.write(dst, np.asarray(x).reshape(dst.shape))
    eng = _elementwise_engine(engine, "Vector")
    dur = _engine_seconds(eng, checks.free_size(data), reads, [dst])
    return _done("tensor_scalar", name, ctx.issue("tensor_scalar", name, eng, dur, reads, [dst]))


def memset(dst, value, engine=engine.unknown, name=None):
    """Fill an on-chip tile with ``value`` (Vector engine by default)."""
    ctx = _ctx("memset")
    w = ctx.where("memset", name)
    dst = checks.tensor_arg(dst, w, "dst")
    checks.on_chip(dst, w, "dst")
    if ctx.numerics:
        ctx.write(dst, np.full(dst.shape, value, dtype=np.float32 if dst.dtype.kind not in "iub" else dst.dtype))
    eng = _elementwise_engine(engine, "Vector")
    dur = _engine_seconds(eng, checks.free_size(dst), [], [dst])
    return _done("memset", name, ctx.issue("memset", name, eng, dur, [], [dst]))


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op(data * scale + bias)`` on the Scalar engine; ``bias`` is a [P, 1] tile,
    ``scale`` a scalar or [P, 1] tile; with ``reduce_op``/``reduce_res`` the result is also
    reduced along the free dims into ``reduce_res`` [P, 1]."""
    ctx = _ctx("activation")
    w = ctx.where("activation", name)
    dst, data = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(data, w, "data")
    checks.on_chip(data, w, "data")
    checks.on_chip(dst, w, "dst")
    checks.same_partitions(dst, data, w, "dst", "data")
    reads, writes = [data], [dst]
    s = _operand(ctx, scale, data.shape, "activation", name, "scale", reads)
    b = _operand(ctx, bias, data.shape, "activation", name, "bias", reads) if bias is not None else None
    if reduce_res is not None:
        reduce_res = checks.tensor_arg(reduce_res, w, "reduce_res")
        checks.on_chip(reduce_res, w, "reduce_res")
        writes.append(reduce_res)
        if reduce_op is None:
            raise ConstraintError(f"{w}: reduce_res given without reduce_op")
    if ctx.numerics:
        x = _f32(ctx.read(data, "activation", name, "data")) * s
        if b is not None:
            x = x + b
        y = np.asarray(op(x), dtype=np.float32)
        ctx.write(dst, y.reshape(dst.shape))
        if reduce_res is not None:
            flat = y.reshape(y.shape[0], -1)
            red = {nl.add: np.sum, nl.maximum: np.max, nl.minimum: np.min}.get(reduce_op)
            if red is None:
                raise ConstraintError(f"{w}: reduce_op must be nl.add, nl.maximum or nl.minimum")
            ctx.write(reduce_res, red(flat, axis=1).reshape(reduce_res.shape))
    dur = _engine_seconds("Scalar", checks.free_size(data), reads, writes)
    return _done("activation", name, ctx.issue("activation", name, "Scalar", dur, reads, writes))


# --- registers ("nki.isa.register_alloc" and siblings; see ``registers``) --------------------
VirtualRegister = _registers.VirtualRegister


def register_alloc(x=None):
    """A new engine register, holding ``x`` (an int) or unset (None)."""
    if isinstance(x, VirtualRegister):
        raise ConstraintError("nisa.register_alloc: x must be an int or None; copy a register with "
                              "nisa.register_move")
    return VirtualRegister(None if x is None else int(x))


def register_move(dst, src):
    """``dst = src``: a compile-time int or another register."""
    _reg_arg(dst, "register_move", "dst").set(_registers.runtime_int(src, "register_move src"))


def register_load(dst, src):
    """Load the one 32-bit value of ``src`` (an HBM or SBUF tensor of one element) into ``dst``."""
    ctx = _ctx("register_load")
    w = ctx.where("register_load")
    reg = _reg_arg(dst, "register_load", "dst")
    src = checks.tensor_arg(src, w, "src")
    if src.size != 1 or src.dtype.itemsize > 4 or src.buffer is MemoryRegion.psum:
        raise ConstraintError(f"{w}: src must be one element of at most 32 bits in HBM or SBUF, got shape "
                              f"{src.shape} {src.dtype.name} in {src.buffer.name}")
    ctx.issue("register_load", None, "Sync", rates.elementwise_seconds(1), [src], [])
    if ctx.numerics:
        reg.set(int(np.asarray(ctx.read(src, "register_load", None, "src")).reshape(-1)[0]))
    else:
        reg.set(0)  # schedule-only run: no data; the value only moves dynamic views (boxes are whole tensors)


def register_store(dst, src):
    """Store register ``src`` into ``dst`` (an HBM or SBUF tensor of one element)."""
    ctx = _ctx("register_store")
    w = ctx.where("register_store")
    reg = _reg_arg(src, "register_store", "src")
    dst = checks.tensor_arg(dst, w, "dst")
    if dst.size != 1 or dst.buffer is MemoryRegion.psum:
        raise ConstraintError(f"{w}: dst must be one element in HBM or SBUF, got shape {dst.shape} in "
                              f"{dst.buffer.name}")
    if ctx.numerics:
        ctx.write(dst, np.array(reg.value("register_store src")).reshape(dst.shape))
    ctx.issue("register_store", None, "Sync", rates.elementwise_seconds(1), [], [dst])


def _reg_arg(v, op: str, role: str) -> VirtualRegister:
    if not isinstance(v, VirtualRegister):
        raise ConstraintError(f"nisa.{op}: {role} must be a register from nisa.register_alloc, got {type(v).__name__}")
    return v


# --- ordering between the programs of a rank (see ``lnc``) ----------------------------------
def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """Every program in ``cores`` (only (0, 1) is supported) waits here until all have
    arrived; the accesses of ``data`` (shared HBM) before it are ordered before those after
    it on every program. Starts on ``engine`` when this program's earlier accesses of
    ``data`` are done and ends when the last program's do ("nki.isa.core_barrier")."""
    ctx = _ctx("core_barrier")
    w = ctx.where("core_barrier", name)
    data = checks.tensor_arg(data, w, "data")
    core_set = tuple(int(c) for c in cores) if isinstance(cores, (tuple, list)) else (int(cores),)
    if core_set == (0,) and ctx.lnc == 1:
        return NkiInstruction("core_barrier", name, 0.0, 0.0)  # a barrier of one core waits for no one
    if core_set != (0, 1):
        raise ConstraintError(f"{w}: cores must be (0, 1), got {cores!r}")
    if ctx.lnc != 2:
        raise ConstraintError(f"{w}: core_barrier needs LNC 2 (kernel[2]); this launch runs {ctx.lnc} program(s)")
    if data.buffer is MemoryRegion.psum:
        # the page asks for shared HBM data; nki-library's own kernels (bwmm_shard_on_I) also
        # synchronise on SBUF tensors, which the compiler accepts: only PSUM is refused
        raise ConstraintError(f"{w}: data must be in shared_hbm (or SBUF), got {data.buffer.name}")
    eng = _ENGINE_NAMES.get(engine, "GpSimd")
    ready = max(ctx.timeline.ready([data], []), ctx.timeline.engine_free.get(eng, 0.0))
    got = ctx.rendezvous.exchange(
        Deposit(ctx.who, f"core_barrier(name={name!r})" if name else "core_barrier", ("core_barrier", data.shape), ready),
        ((ctx.rank, 0), (ctx.rank, 1)), on_complete=lambda _: ctx.shared_hbm.synchronised())
    end = max(d.payload for d in got.values()) + rates.CORE_BARRIER_S
    ctx.timeline.occupy(eng, ready, end, "core_barrier", name)
    ctx.timeline.record([data], [data], end, end)
    return NkiInstruction("core_barrier", name, ready, end)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Send SBUF ``src`` to program ``send_to_rank``'s ``dst`` and receive program
    ``recv_from_rank``'s ``src`` into this ``dst``; the pair completes together, ordering
    both programs as a barrier does ("nki.isa.sendrecv")."""
    ctx = _ctx("sendrecv")
    w = ctx.where("sendrecv", name)
    src, dst = checks.tensor_arg(src, w, "src"), checks.tensor_arg(dst, w, "dst")
    checks.in_buffer(src, [MemoryRegion.sbuf], w, "src")
    checks.in_buffer(dst, [MemoryRegion.sbuf], w, "dst")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ConstraintError(f"{w}: src {src.shape} {src.dtype.name} and dst {dst.shape} {dst.dtype.name} must "
                              f"have the same shape and dtype")
    to, frm = int(send_to_rank), int(recv_from_rank)
    if ctx.lnc != 2 or {to, frm} - {0, 1}:
        raise ConstraintError(f"{w}: sendrecv runs between the two programs of an LNC 2 rank (ranks 0 and 1); "
                              f"got send_to_rank={to}, recv_from_rank={frm} with {ctx.lnc} program(s)")
    ready = ctx.timeline.ready([src], [dst])
    data = np.array(ctx.read(src, "sendrecv", name, "src")) if ctx.numerics else None
    members = tuple(sorted({(ctx.rank, ctx.program), (ctx.rank, to), (ctx.rank, frm)}))
    got = ctx.rendezvous.exchange(
        Deposit(ctx.who, f"sendrecv(name={name!r})" if name else "sendrecv",
                ("sendrecv", int(pipe_id), src.shape, src.dtype.name), (ready, data, to)),
        members, on_complete=lambda _: ctx.shared_hbm.synchronised())
    peer = got[(ctx.rank, frm)]
    if peer.payload[2] != ctx.program:
        raise ConstraintError(f"{w}: receives from program {frm}, which sends to program {peer.payload[2]}")
    if ctx.numerics:
        ctx.write(dst, peer.payload[1])
    start = max(d.payload[0] for d in got.values())
    end = start + rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S + rates.dma_transfer_seconds(src.nbytes)
    ctx.timeline.occupy("DMA", start, end, "sendrecv", name)
    ctx.timeline.record([src], [dst], end, end)
    return NkiInstruction("sendrecv", name, start, end)


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``nisa.activation`` with ``reduce_res = reduce_op`` over the free dims of the result."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, name=name)


_DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    """``dst = src`` transposed by DMA: 2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0] (or ``axes``);
    with dge_mode.hwdge 2-byte dtypes only ("nki.isa.dma_transpose")."""
    ctx = _ctx("dma_transpose")
    w = ctx.where("dma_transpose", name)
    dst, src = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(src, w, "src")
    perm = tuple(int(a) for a in axes) if axes is not None else _DMA_TRANSPOSE_AXES.get(src.ndim)
    if perm is None or sorted(perm) != list(range(src.ndim)):
        raise ConstraintError(f"{w}: cannot transpose a {src.ndim}-D src {src.shape} with axes {axes}")
    if dge_mode is globals()["dge_mode"].hwdge and src.dtype.itemsize != 2:
        raise ConstraintError(f"{w}: a hardware-DGE dma_transpose needs a 2-byte dtype, got {src.dtype.name}")
    want = tuple(src.shape[a] for a in perm)
    if dst.size != src.size:
        raise ConstraintError(f"{w}: dst {dst.shape} must hold the transposed src {want}")
    if src.buffer is MemoryRegion.psum or dst.buffer is MemoryRegion.psum:
        raise ConstraintError(f"{w}: DMA cannot read or write PSUM")
    if ctx.numerics:
        data = ctx.read(src, "dma_transpose", name, "src")
        ctx.write(dst, np.transpose(data, perm).reshape(dst.shape))
    return _done("dma_transpose", name, ctx.issue_dma("dma_transpose", name, src.nbytes, [src], [dst]))


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = reduce_op(srcs[0] * scales[0], ...)`` in the DMA engines, FP32; only nl.add and
    scales of 1.0 ("nki.isa.dma_compute"); a src with vector_offset makes it a gather or
    scatter read-modify-write (exactly two srcs, unique indices)."""
    ctx = _ctx("dma_compute")
    w = ctx.where("dma_compute", name)
    dst = checks.tensor_arg(dst, w, "dst")
    srcs = [checks.tensor_arg(x, w, "srcs entry") for x in srcs]
    if getattr(reduce_op, "__name__", "") != "add":
        raise ConstraintError(f"{w}: reduce_op must be nl.add, got {reduce_op!r}")
    if scales is not None and any(float(x) != 1.0 for x in scales):
        raise ConstraintError(f"{w}: scales must all be 1.0, got {list(scales)}")
    if any(x._rows is not None for x in srcs + [dst]) and (len(srcs) != 2 or not unique_indices):
        raise ConstraintError(f"{w}: a read-modify-write with vector_offset needs exactly 2 srcs and unique indices")
    for x in srcs:
        if x.size != dst.size:
            raise ConstraintError(f"{w}: src of {x.size} elements {x.shape} for a dst of {dst.size} {dst.shape}")
        if x.buffer is MemoryRegion.psum:
            raise ConstraintError(f"{w}: DMA cannot read PSUM")
    if ctx.numerics:
        total = sum(_f32(ctx.read(x, "dma_compute", name, "src")).reshape(dst.shape) for x in srcs)
        ctx.write(dst, total)
    return _done("dma_compute", name, ctx.issue_dma("dma_compute", name, sum(x.nbytes for x in srcs), srcs, [dst]))


def get_nc_sub_version():
    """The NeuronCore sub-version of the simulated target (Trn2: 0)."""
    return 0


from .isa_vector import (activate2, affine_select, bn_aggr, bn_stats, dropout, exponential, iota,  # noqa: E402,F401
                         local_gather, max8, nc_find_index8, nc_match_replace8, rand2, rand_get_state, rand_set_state, rng,
                         set_rng_seed, topk, nc_n_gather, nc_stream_shuffle, nonzero_with_count, range_select,
                         reciprocal, scalar_tensor_tensor, select_reduce, sequence_bounds, tensor_copy_predicated,
                         tensor_partition_reduce, tensor_reduce, tensor_scalar_cumulative, tensor_scalar_reduce,
                         tensor_tensor_scan)
from .isa_mx import nc_matmul_mx, quantize_mx  # noqa: E402,F401

_unimplemented.fill(globals(), "nki.isa")
