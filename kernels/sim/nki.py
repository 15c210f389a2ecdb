"""The simulator's top-level ``nki`` module: ``jit``, ``simulate`` and the submodules
``language``, ``isa`` and ``collectives`` (as ``import nki`` gives them)."""

from __future__ import annotations

from . import collectives, isa, language
from .runner import jit as jit
from .runner import simulate_kernel


def simulate(kernel):
    """``nki.simulate(kernel)(*numpy_args)`` runs one rank of ``kernel`` (``kernel[2]`` for
    LNC 2) on the CPU and returns its outputs as NumPy arrays."""
    return simulate_kernel(kernel)


__all__ = ["jit", "simulate", "language", "isa", "collectives"]
