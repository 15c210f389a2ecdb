"""Running kernels: ``run_ranks`` (N ranks in threads), ``nki.jit`` and ``nki.simulate``.

Each rank (each program of a rank under LNC 2) runs the kernel's Python code in its own
thread with its own memory and clock; collectives meet in a ``Rendezvous``. A failure
on one rank stops the others and is re-raised in the caller.

Symmetric runs
--------------
A schedule-only run (numerics=False) of an SPMD kernel spends nearly all its time running
the same Python on every rank to compute the same timeline N times. ``symmetric=True``
simulates only rank 0 (both programs of it under LNC 2) and takes every peer to be
identical to it: a peer reaches each collective with the same ready time as rank 0 (the
same instructions on the same engines before it), so a group collective starts when rank
0 is ready and a ring step when rank 0's channel is ready, exactly as in the full run.
The result is the full run's timeline: ``Timeline.cores`` holds one entry per rank and
program, each a relabelled view of the representative's clock.

It is exact when every rank runs the same instructions with the same dependencies, which
the simulator guarantees or checks:
  * arguments: equal shapes, dtypes and non-tensor values on every rank (checked;
    ``TensorSpec`` or arrays, whose data is not used);
  * control flow: a kernel's Python cannot depend on the rank. Rank ids are registers
    (``registers``): ``if ncc.rank_id() == 2`` or ``ring.index(rank)`` raise TypeError on
    every run, as tracing does on the device; a dynamic loop (``nl.dynamic_range``,
    ``fori_loop``) whose trip count differs between ranks raises SymmetryError. So no rank
    can skip or mismatch a collective, or put a matmul input in PSUM, unless rank 0 does;
  * addresses: a view at a rank-dependent offset (register arithmetic in ``.ap`` or
    ``nl.ds``) keeps every rank's offset; each is bounds-checked (an out-of-bounds access of
    any rank fails, naming it) and its dependency box is the whole tensor on every rank;
  * collectives run on symmetric groups: rank-lists of one size that together hold all
    ranks, or for ``collective_permute`` pairs in which every rank sends once and
    receives once (checked when the collective is issued).
Reads of unwritten memory are found only with numerics; a symmetric run refuses numerics
(``symmetric=True`` raises SymmetryError, the default runs every rank), so no run that
could find such a read is ever replaced by rank 0's.
``symmetric=True`` raises ``SymmetryError`` when a checked condition fails (numerics on,
arguments that differ between ranks, an asymmetric group, a rank-dependent loop).
``symmetric=None`` (the default) chooses: symmetric when numerics=False, more than one
rank, and the arguments agree; if a SymmetryError comes up, it falls back to the full run.
``symmetric=False`` always runs every rank.

What a run cannot see
---------------------
A run says what it could not check in ``SimResult.unseen`` (empty for a full run with
numerics): ``numerics=False`` computes no data, so a read of unwritten memory and a result
written to the wrong (in-bounds) place go unseen (NUMERICS_OFF); a symmetric run simulates
rank 0 only, so such a fault on one other rank, at its rank-dependent offset, goes unseen
too (SYMMETRIC). A caller that needs them runs ``numerics=True`` (which is never symmetric).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import checks, rates, watchdog
from .context import CoreContext
from .lnc import SharedHbm
from .errors import ConstraintError, SimulatorError, SymmetryError, _Aborted
from .rates import LinkModel
from .rendezvous import Rendezvous
from .state import current, set_current
from .tensor import NkiTensor
from .timeline import Timeline


_DEADLINE: ContextVar[float | None] = ContextVar("trnopt_sim_deadline", default=None)


@contextmanager
def time_limit(seconds: float):
    """Every ``run_ranks`` called inside (from this thread) ends within ``seconds`` from now: a run
    still going then raises ``watchdog.RunTimeLimitError`` and its ranks stop at their next
    instruction (a caller's safety stop, e.g. `trnopt kernels --time-limit`). Nested limits
    keep the nearer end."""
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a kernel argument in ``numerics=False`` runs (no data)."""

    shape: tuple[int, ...]
    dtype: Any


@dataclass
class SimResult:
    """``outputs``: per rank, the kernel's return value as NumPy (tuples stay tuples; None
    when numerics=False). ``timeline``: the engine timeline of the run. ``symmetric``: True
    when only rank 0 was simulated (see the module docstring). ``inputs``: per rank, the
    array arguments (positional list, keyword dict) as the kernel left them (numerics only).
    ``unseen``: what the run could not check (module docstring, "What a run cannot see")."""

    outputs: list[Any] | None
    timeline: Timeline
    symmetric: bool = False
    inputs: list[tuple[list, dict]] | None = None  # per rank: the final data of the array arguments
    unseen: tuple[str, ...] = ()  # what this run could not check (module docstring: NUMERICS_OFF, SYMMETRIC)


NUMERICS_OFF = ("values: numerics=False computes no data, so a read of unwritten memory or a result in the "
                "wrong (in-bounds) place is not seen; run with numerics=True")
SYMMETRIC = ("ranks other than rank 0: the symmetric run simulated rank 0 only, so a fault that shows only in "
             "another rank's data (at its rank-dependent offset) is not seen; run with numerics=True")


class Kernel:
    """What ``nki.jit`` returns: the kernel function plus its launch grid.

    ``kernel[2]`` launches two programs (LNC 2: the two physical cores of the rank);
    ``kernel[a, b, ...]`` launches a * b * ... SPMD programs, ``nl.program_id(axis)`` giving
    each its position on every axis ("nki.jit", "nki.language.program_id"). All programs of
    a launch share the rank's shared_hbm (kernel inputs and outputs included).
    """

    def __init__(self, fn: Callable[..., Any], grid: tuple[int, ...] = (1,),
                 options: Mapping[str, Any] | None = None) -> None:
        self.fn, self.grid, self.options = fn, grid, dict(options or {})
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    @property
    def lnc(self) -> int:
        """Programs per rank (the launch grid's size)."""
        return math.prod(self.grid)

    def __getitem__(self, grid: Any) -> "Kernel":
        dims = grid if isinstance(grid, tuple) else (grid,)
        try:
            g = tuple(int(d) for d in dims)
        except (TypeError, ValueError):
            raise ConstraintError(f"{self.__name__}[{grid!r}]: launch grid dimensions must be ints") from None
        if not g or any(d < 1 for d in g):
            raise ConstraintError(f"{self.__name__}[{grid!r}]: launch grid dimensions must be >= 1")
        return Kernel(self.fn, g, self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current() is not None:
            return self.fn(*args, **kwargs)
        return simulate_kernel(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.__name__} grid={list(self.grid)}>"


def jit(fn=None, **kwargs):
    """Decorator marking an NKI kernel (``@nki.jit`` or ``@nki.jit(...)``)."""
    if isinstance(fn, Kernel):
        return Kernel(fn.fn, fn.grid, {**fn.options, **kwargs})
    if fn is None:
        return lambda f: Kernel(f, options=kwargs)
    return Kernel(fn, options=kwargs)


def simulate_kernel(kernel: Any) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*numpy_args)``: one rank, numerics on, returns NumPy outputs;
    NumPy array arguments the kernel wrote are updated in place, as in the official
    simulator ("NKI CPU Simulator" guide, Execution)."""
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel)

    def run(*args: Any, **kwargs: Any) -> Any:
        res = run_ranks(kernel, [args], kwargs=kwargs, keep_inputs=True)
        pos, kw = res.inputs[0]
        for given, final in list(zip(args, pos)) + [(kwargs[k], v) for k, v in kw.items()]:
            if isinstance(given, np.ndarray) and isinstance(final, np.ndarray) and given.flags.writeable \
                    and not np.array_equal(given, final, equal_nan=given.dtype.kind == "f"):
                given[...] = final
        return res.outputs[0]
    return run


def _check_outputs(value: Any, ctx: CoreContext) -> None:
    if isinstance(value, NkiTensor):
        checks.kernel_output(value, ctx.where("kernel return"))
    elif isinstance(value, (tuple, list)):
        for v in value:
            _check_outputs(v, ctx)


def _to_numpy(value: Any, ctx: CoreContext) -> Any:
    if isinstance(value, NkiTensor):
        return np.array(value.array()) if ctx.numerics else None
    if isinstance(value, tuple):
        return tuple(_to_numpy(v, ctx) for v in value)
    if isinstance(value, list):
        return [_to_numpy(v, ctx) for v in value]
    return value


def _is_array_like(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, (np.generic, NkiTensor))


def _arg_key(a: Any) -> Any:
    if _is_array_like(a):
        return ("tensor", tuple(int(d) for d in a.shape), np.dtype(a.dtype))
    return ("value", a)


def _uniform_args(args_per_rank: Sequence[Sequence[Any]]) -> str | None:
    """None when every rank's arguments have equal shapes, dtypes and values, else why not."""
    first = [_arg_key(a) for a in args_per_rank[0]]
    for r, args in enumerate(args_per_rank[1:], start=1):
        keys = [_arg_key(a) for a in args]
        try:
            same = len(keys) == len(first) and all(bool(x == y) for x, y in zip(keys, first))
        except Exception:  # noqa: BLE001 - values that do not compare count as different
            same = False
        if not same:
            return f"rank {r}'s arguments differ from rank 0's ({keys} vs {first})"
    return None


def run_ranks(kernel: Any, args_per_rank: Sequence[Sequence[Any]], *, link: LinkModel | Mapping[int, LinkModel] | None = None,
              numerics: bool = True, lnc: int | None = None, sbuf_bytes_per_partition: int | None = None,
              timeout_s: float = 10.0, kwargs: Mapping[str, Any] | None = None,
              symmetric: bool | None = None, keep_inputs: bool = False) -> SimResult:
    """Run ``len(args_per_rank)`` ranks of ``kernel``; rank i gets ``args_per_rank[i]``.

    ``keep_inputs``: also return the array arguments as the kernel left them
    (``SimResult.inputs``; numerics only). ``lnc``: programs per rank (default: the kernel's launch grid, ``kernel[2]`` -> 2;
    ``lnc=2`` launches a one-dimensional grid of 2). Array arguments, positional or keyword
    (``kwargs``), become HBM tensors of the kernel; other values pass through.
    ``link``: LinkModel of every channel, or channel id -> LinkModel (default
    ``rates.DEFAULT_LINK``), the rank's: its programs share it (``CoreContext.link``).
    ``numerics=False`` records the schedule and runs every check
    without allocating or computing data (arguments may be ``TensorSpec``).
    ``sbuf_bytes_per_partition``: SBUF capacity (default Trn2, 224 KiB; Trn3:
    ``rates.SBUF_BYTES_PER_PARTITION['trn3']``). A rank waiting at a collective fails with
    CollectiveMismatchError at once when the collective cannot complete (mismatch, a peer
    that finished, deadlock), and after ``timeout_s`` seconds during which the peers it
    waits for issued no instruction (a stall; busy peers never time out). The whole run is
    bounded the same way: when no rank has issued an instruction or finished for
    ``timeout_s`` seconds (a rank stuck in its Python), the run fails naming the stalled
    ranks, the line each is on and how long it has stalled.
    ``symmetric``: simulate rank 0 only and take the other ranks to be identical (True),
    every rank (False), or decide (None: symmetric for schedule-only runs whose ranks get
    equal arguments); see the module docstring for when this is exact.
    """
    world = len(args_per_rank)
    if world < 1:
        raise SimulatorError("run_ranks needs at least one rank")
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise watchdog.RunTimeLimitError("not started: its time limit had passed")
    if lnc is None:
        grid = kernel.grid if isinstance(kernel, Kernel) else (1,)
    else:
        if int(lnc) < 1:
            raise ConstraintError(f"lnc must be >= 1, got {lnc}")
        grid = (int(lnc),)
    why = _uniform_args(args_per_rank) if world > 1 else None
    if symmetric:
        if numerics:
            raise SymmetryError("run_ranks(symmetric=True) needs numerics=False: with data, every rank "
                                "computes its own values")
        if why is not None:
            raise SymmetryError(f"run_ranks(symmetric=True) needs the same argument shapes, dtypes and "
                                f"values on every rank: {why}")
    auto = symmetric is None
    if auto:
        symmetric = not numerics and world > 1 and why is None
    if symmetric:
        try:
            return _run(kernel, args_per_rank, link, numerics, grid, sbuf_bytes_per_partition, timeout_s,
                        kwargs, symmetric=True, keep_inputs=keep_inputs)
        except SymmetryError:
            if not auto:
                raise
    return _run(kernel, args_per_rank, link, numerics, grid, sbuf_bytes_per_partition, timeout_s, kwargs,
                symmetric=False, keep_inputs=keep_inputs)


def _run(kernel: Any, args_per_rank: Sequence[Sequence[Any]], link: Any, numerics: bool, grid: tuple[int, ...],
         sbuf_bytes_per_partition: int | None, timeout_s: float, kwargs: Mapping[str, Any] | None,
         symmetric: bool, keep_inputs: bool = False) -> SimResult:
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    world = len(args_per_rank)
    lnc = math.prod(grid)
    if isinstance(link, LinkModel) or link is None:
        links, default_link = {}, link or rates.DEFAULT_LINK
    else:
        links, default_link = dict(link), rates.DEFAULT_LINK
    sbuf_limit = sbuf_bytes_per_partition or rates.active().sbuf_bytes_per_partition  # rates.generation
    ranks = [0] if symmetric else list(range(world))
    participants = [(r, p) for r in ranks for p in range(lnc)]
    contexts: dict[tuple[int, int], CoreContext] = {}
    rdv = Rendezvous(participants, timeout_s, progress=lambda who: contexts[who].timeline.issued,
                     symmetric=symmetric, last=lambda who: contexts[who].last_instruction())
    shared = {r: SharedHbm(lnc) for r in ranks}
    contexts.update({(r, p): CoreContext(rank=r, program=p, lnc=lnc, world=world, numerics=numerics,
                                         sbuf_limit=sbuf_limit, links=links, default_link=default_link,
                                         rendezvous=rdv, shared_hbm=shared[r], grid=grid)
                     for r, p in participants})
    results: dict[tuple[int, int], Any] = {}
    errors: list[BaseException] = []
    input_allocs: dict[int, tuple[list[Any], dict[str, Any]]] = {}
    lock = threading.Lock()

    def body(who: tuple[int, int]) -> None:
        ctx = contexts[who]
        set_current(ctx)
        try:
            rank, program = who
            with lock:
                if rank not in input_allocs:
                    pos = [ctx.input_tensor(a, i) if _is_array_like(a) else a
                           for i, a in enumerate(args_per_rank[rank])]
                    kw = {k: ctx.input_tensor(v, k) if _is_array_like(v) else v for k, v in (kwargs or {}).items()}
                    input_allocs[rank] = (pos, kw)
                args, kw = input_allocs[rank]
            for a in list(args) + list(kw.values()):
                if isinstance(a, NkiTensor):
                    ctx.inputs.add(a.alloc.id)
            out = fn(*args, **kw)
            ctx.check_capacity()
            _check_outputs(out, ctx)
            results[who] = out
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            with lock:
                errors.append(exc)
            rdv.abort(exc)
        finally:
            rdv.finish(who)
            set_current(None)

    threads = {p: threading.Thread(target=body, args=(p,), name=f"nki-rank{p[0]}-prog{p[1]}", daemon=True)
               for p in participants}
    for t in threads.values():
        t.start()
    watchdog.wait(threads, contexts, rdv, timeout_s, deadline=_DEADLINE.get())
    if errors:
        first = rdv.error if rdv.error is not None and rdv.error in errors else errors[0]
        raise first
    if rdv.error is not None:
        raise rdv.error
    for r in ranks:
        shared[r].check_unwritten()  # reads of shared tensors still unwritten at the end
    if symmetric:
        reps = [contexts[(0, p)].timeline for p in range(lnc)]
        timeline = Timeline.from_cores(reps)
        timeline.cores = [_relabel(reps[p], r) for r in range(world) for p in range(lnc)]
        timeline.symmetric = True
        return SimResult(None, timeline, symmetric=True, unseen=(NUMERICS_OFF, SYMMETRIC))
    timeline = Timeline.from_cores([contexts[p].timeline for p in participants])
    # converted after every program finished: the programs of a rank share the output
    outputs = [_to_numpy(results.get((r, 0)), contexts[(r, 0)]) for r in range(world)] if numerics else None
    finals = None
    if numerics and keep_inputs:
        finals = [([_to_numpy(a, contexts[(r, 0)]) for a in input_allocs[r][0]],
                   {k: _to_numpy(v, contexts[(r, 0)]) for k, v in input_allocs[r][1].items()})
                  for r in range(world) if r in input_allocs]
    return SimResult(outputs, timeline, inputs=finals, unseen=() if numerics else (NUMERICS_OFF,))


def _relabel(core: Any, rank: int) -> Any:
    """The representative's clock seen as rank ``rank`` (shares its lists; read-only)."""
    if core.rank == rank:
        return core
    view = copy.copy(core)
    view.rank = rank
    return view
