"""``neuronxcc.nki.compiler``: the compiler directives pre-0.6 kernels use ("nki.compiler"
API reference, Neuron SDK 2.2x): ``skip_middle_end_transformations`` (a decorator),
``no_reorder()`` (a loop directive), ``sbuf.mod_alloc`` / ``psum.mod_alloc`` (direct
allocation: a tensor at a base address, rotating over ``num_free_tiles`` buffers).

The simulator runs every instruction in program order, so the directives change nothing
here; a direct allocation is taken as its buffer (SBUF or PSUM) and placed by the
simulator's own allocator (ASSUMPTION: the address and rotation do not change the values).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..tensor import MemoryRegion


def skip_middle_end_transformations(fn: Any) -> Any:
    return fn


def enable_stack_allocator(*args: Any, **kwargs: Any) -> Any:
    return args[0] if args and callable(args[0]) else (lambda f: f)


def no_reorder() -> Any:
    return contextlib.nullcontext()


class DirectAllocation:
    """What ``mod_alloc`` returns: used as ``buffer=`` of ``nl.ndarray``."""

    def __init__(self, buffer: MemoryRegion, **kwargs: Any) -> None:
        self.buffer, self.kwargs = buffer, kwargs


class _Space:
    def __init__(self, buffer: MemoryRegion) -> None:
        self.buffer = buffer

    def mod_alloc(self, *args: Any, **kwargs: Any) -> DirectAllocation:
        return DirectAllocation(self.buffer, **kwargs)

    def alloc(self, *args: Any, **kwargs: Any) -> DirectAllocation:
        return DirectAllocation(self.buffer, **kwargs)


sbuf = _Space(MemoryRegion.sbuf)
psum = _Space(MemoryRegion.psum)
