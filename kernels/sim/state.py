"""The thread-local "which core am I simulating" pointer shared by the API modules."""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()


def current() -> Any:
    """The CoreContext of the calling thread, or None outside a simulated kernel."""
    return getattr(_local, "ctx", None)


def set_current(ctx: Any) -> None:
    _local.ctx = ctx


def here(op: str = "", name: str | None = None) -> str:
    """Message prefix naming the rank (and instruction) of the calling thread."""
    from .errors import where

    ctx = current()
    if ctx is None:
        return where(None, op or "tensor access", name)
    return where(ctx.rank, op or "tensor access", name, ctx.program)
