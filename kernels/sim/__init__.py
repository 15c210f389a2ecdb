"""A multi-rank CPU simulator for the subset of NKI that trnopt kernels use, nki.collectives included.

Public API::

    from trnopt.kernels.sim import run_ranks, LinkModel, TensorSpec
    res = run_ranks(kernel, [(x0, w0), (x1, w1)], link=LinkModel(256e9, 1.5e-6))
    res.outputs[rank]; res.timeline.total_s; res.timeline.summary()

Kernels import ``nki, nl, nisa, ncc`` from ``trnopt.kernels.nki_api`` (the real package when
installed, these modules otherwise): ``nki`` is ``trnopt.kernels.sim.nki``, ``nl``
``.language``, ``nisa`` ``.isa``, ``ncc`` ``.collectives``.
"""

from __future__ import annotations

from . import collectives, isa, language, nki, rates
from .errors import (CollectiveMismatchError, ConstraintError, SimulatorError, SymmetryError,
                     UninitializedReadError)
from .rates import DEFAULT_LINK, LinkModel
from .runner import Kernel, SimResult, TensorSpec, run_ranks
from .tensor import MemoryRegion, NkiTensor
from .timeline import Timeline

__all__ = [
    "run_ranks", "SimResult", "Timeline", "LinkModel", "DEFAULT_LINK", "TensorSpec", "Kernel",
    "SimulatorError", "ConstraintError", "UninitializedReadError", "CollectiveMismatchError", "SymmetryError",
    "MemoryRegion", "NkiTensor", "nki", "language", "isa", "collectives", "rates",
]
