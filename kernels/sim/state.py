"""The thread-local "which core am I simulating" pointer shared by the API modules, and the
one lock on numpy's BLAS that the simulated cores' threads share."""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()

# numpy's OpenBLAS keeps per-thread buffers for at most MAX_THREADS threads (64 in the PyPI
# wheels: numpy.show_config()); more simulated cores multiplying at once overrun them
# ("precompiled NUM_THREADS exceeded", then "double free or corruption" and an abort), so
# every product the simulated engines compute takes this lock
BLAS_LOCK = threading.Lock()


def current() -> Any:
    """The CoreContext of the calling thread, or None outside a simulated kernel."""
    return getattr(_local, "ctx", None)


def set_current(ctx: Any) -> None:
    _local.ctx = ctx


def here(op: str = "", name: str | None = None) -> str:
    """Message prefix naming the rank (and instruction) of the calling thread; a view built
    before its instruction is named by the kernel line that builds it."""
    from .errors import where

    label = op or f"tensor access at {_kernel_line()}"
    ctx = current()
    if ctx is None:
        return where(None, label, name)
    return where(ctx.rank, label, name, ctx.program)


def _kernel_line() -> str:
    """file:line of the innermost caller outside the simulator (only on error paths)."""
    import sys

    frame = sys._getframe(2)
    while frame is not None and "/kernels/sim/" in frame.f_code.co_filename.replace("\\", "/"):
        frame = frame.f_back
    if frame is None:
        return "an unknown line"
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
