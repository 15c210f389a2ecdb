"""The simulator's top-level ``nki`` module: ``jit``, ``simulate`` and the submodules
``language``, ``isa`` (with ``isa.constants``), ``collectives``, ``typing`` and ``dtype``,
as ``import nki`` gives them."""

from __future__ import annotations

from . import collectives, constants, isa, language
from . import nki_dtype as dtype
from . import nki_typing as typing
from .runner import jit as jit
from .runner import simulate_kernel

isa.constants = constants


def simulate(kernel):
    """``nki.simulate(kernel)(*args, **kwargs)`` runs ``kernel`` (``kernel[2]`` for LNC 2, or
    any launch grid) on the CPU: array arguments become HBM tensors, and the outputs come
    back as NumPy arrays ("NKI CPU Simulator" guide)."""
    return simulate_kernel(kernel)


__all__ = ["jit", "simulate", "language", "isa", "collectives", "typing", "dtype"]
