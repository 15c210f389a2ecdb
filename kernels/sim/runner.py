"""Running kernels: ``run_ranks`` (N ranks in threads), ``nki.jit`` and ``nki.simulate``.

Each rank (each program of a rank under LNC 2) runs the kernel's Python code in its own
thread with its own memory and clock; collectives meet in a ``Rendezvous``. A failure
on one rank stops the others and is re-raised in the caller.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import checks, rates
from .context import CoreContext, SharedHbm
from .errors import ConstraintError, SimulatorError, _Aborted
from .rates import LinkModel
from .rendezvous import Rendezvous
from .state import current, set_current
from .tensor import NkiTensor
from .timeline import Timeline


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a kernel argument in ``numerics=False`` runs (no data)."""

    shape: tuple[int, ...]
    dtype: Any


@dataclass
class SimResult:
    """``outputs``: per rank, the kernel's return value as NumPy (tuples stay tuples; None
    when numerics=False). ``timeline``: the engine timeline of the run."""

    outputs: list[Any] | None
    timeline: Timeline


class Kernel:
    """What ``nki.jit`` returns: the kernel function plus its launch grid (``kernel[2]``)."""

    def __init__(self, fn: Callable[..., Any], lnc: int = 1, options: Mapping[str, Any] | None = None) -> None:
        self.fn, self.lnc, self.options = fn, lnc, dict(options or {})
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __getitem__(self, grid: Any) -> "Kernel":
        g = grid[0] if isinstance(grid, tuple) else grid
        if int(g) not in (1, 2):
            raise ConstraintError(f"{self.__name__}[{grid}]: the simulator runs LNC 1 or 2")
        return Kernel(self.fn, int(g), self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current() is not None:
            return self.fn(*args, **kwargs)
        return simulate_kernel(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.__name__} lnc={self.lnc}>"


def jit(fn=None, **kwargs):
    """Decorator marking an NKI kernel (``@nki.jit`` or ``@nki.jit(...)``)."""
    if fn is None:
        return lambda f: Kernel(f, options=kwargs)
    return Kernel(fn, options=kwargs)


def simulate_kernel(kernel: Any) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*numpy_args)``: one rank, numerics on, returns NumPy outputs."""
    def run(*args: Any, **kwargs: Any) -> Any:
        lnc = getattr(kernel, "lnc", 1)
        return run_ranks(kernel, [args], lnc=lnc, kwargs=kwargs).outputs[0]
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


def run_ranks(kernel: Any, args_per_rank: Sequence[Sequence[Any]], *, link: LinkModel | Mapping[int, LinkModel] | None = None,
              numerics: bool = True, lnc: int = 1, sbuf_bytes_per_partition: int | None = None,
              timeout_s: float = 10.0, kwargs: Mapping[str, Any] | None = None) -> SimResult:
    """Run ``len(args_per_rank)`` ranks of ``kernel``; rank i gets ``args_per_rank[i]``.

    ``link``: LinkModel of every channel, or channel id -> LinkModel (default
    ``rates.DEFAULT_LINK``). ``numerics=False`` records the schedule and runs every check
    without allocating or computing data (arguments may be ``TensorSpec``).
    ``sbuf_bytes_per_partition``: SBUF capacity (default Trn2, 224 KiB; Trn3:
    ``rates.SBUF_BYTES_PER_PARTITION['trn3']``). A rank blocked longer than ``timeout_s``
    fails with CollectiveMismatchError.
    """
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    world = len(args_per_rank)
    if world < 1:
        raise SimulatorError("run_ranks needs at least one rank")
    if lnc not in (1, 2):
        raise ConstraintError(f"lnc must be 1 or 2, got {lnc}")
    if isinstance(link, LinkModel) or link is None:
        links, default_link = {}, link or rates.DEFAULT_LINK
    else:
        links, default_link = dict(link), rates.DEFAULT_LINK
    sbuf_limit = sbuf_bytes_per_partition or rates.DEFAULT_SBUF_BYTES_PER_PARTITION
    participants = [(r, p) for r in range(world) for p in range(lnc)]
    rdv = Rendezvous(participants, timeout_s)
    shared = [SharedHbm() for _ in range(world)]
    contexts = {(r, p): CoreContext(rank=r, program=p, lnc=lnc, world=world, numerics=numerics,
                                    sbuf_limit=sbuf_limit, links=links, default_link=default_link,
                                    rendezvous=rdv, shared_hbm=shared[r]) for r, p in participants}
    results: dict[tuple[int, int], Any] = {}
    errors: list[BaseException] = []
    input_allocs: dict[int, list[Any]] = {}
    lock = threading.Lock()

    def body(who: tuple[int, int]) -> None:
        ctx = contexts[who]
        set_current(ctx)
        try:
            rank, program = who
            with lock:
                if rank not in input_allocs:
                    input_allocs[rank] = [ctx.input_tensor(a, i) if _is_array_like(a) else a
                                          for i, a in enumerate(args_per_rank[rank])]
                args = input_allocs[rank]
            for a in args:
                if isinstance(a, NkiTensor):
                    ctx.inputs.add(a.alloc.id)
            out = fn(*args, **dict(kwargs or {}))
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

    if len(participants) == 1:
        body(participants[0])
    else:
        threads = [threading.Thread(target=body, args=(p,), name=f"nki-rank{p[0]}-prog{p[1]}", daemon=True)
                   for p in participants]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        first = rdv.error if rdv.error is not None and rdv.error in errors else errors[0]
        raise first
    timeline = Timeline.from_cores([contexts[p].timeline for p in participants])
    # converted after every program finished: under LNC 2 both write the shared output
    outputs = [_to_numpy(results.get((r, 0)), contexts[(r, 0)]) for r in range(world)] if numerics else None
    return SimResult(outputs, timeline)
