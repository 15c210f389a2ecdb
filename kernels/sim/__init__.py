"""A multi-rank CPU simulator of NKI 0.7 (Neuron SDK 2.33), nki.collectives included.

Public API::

    from trnopt.kernels.sim import run_ranks, LinkModel, TensorSpec
    res = run_ranks(kernel, [(x0, w0), (x1, w1)], link=LinkModel(256e9, 1.5e-6))
    res.outputs[rank]; res.timeline.total_s; res.timeline.summary()

Kernels import ``nki, nl, nisa, ncc`` from ``trnopt.kernels.nki_api`` (the real package when
installed, these modules otherwise): ``nki`` is ``trnopt.kernels.sim.nki``, ``nl``
``.language``, ``nisa`` ``.isa``, ``ncc`` ``.collectives``. Unmodified kernels that
``import nki`` run after ``trnopt.kernels.sim.install()``, or from the command line::

    python -m trnopt.kernels.sim run kernel.py::my_kernel --input 128x512:float32 --ranks 4 --lnc 2

Modules: ``language`` / ``tiles`` (nl), ``isa`` / ``isa_vector`` / ``isa_mx`` (nisa), ``constants``
(nisa.constants), ``collectives`` (ncc), ``registers`` (runtime scalars), ``tensor``
(views and access patterns), ``context`` (one core's memory and instruction issue), ``onchip``
(on-chip addresses as the compiler assigns them: rotation, reuse hazards),
``lnc`` (the programs of a logical core: shared HBM, barriers, races), ``runner`` (ranks,
grids, symmetric runs), ``rendezvous`` / ``watchdog`` (meeting and time bounds),
``timeline`` / ``rates`` (engines, DMA and link timing), ``checks`` (hardware rules),
``apicheck`` / ``unimplemented`` (the reference table), ``shim`` / ``__main__`` (drop-in).
"""

from __future__ import annotations

# The simulator's version: every number it produces is "simulated" with this version, and the
# overlap table records the version that wrote it (provenance.simulator_version); the reports
# name it and say when it is older than this. Raise it with any change to the clock (timeline,
# rates) or numerics that moves a simulated number, and regenerate the table
# (benchmarks/overlap_table.py). 1.1: per-generation rates (Vector at trn2's 0.96 GHz), DMA by
# contiguous pieces, rotating loop-body buffers, SBUF spilling. 1.2: a Vector instruction reading
# one input from PSUM costs N cycles, one reading its predecessor's output 100 fixed cycles (the
# nki.isa cost tables and the VectorE cost model), PSUM over capacity spills to SBUF. The shipped
# table was written by 1.2 (tests/kernels/test_provenance.py holds the two equal).
__version__ = "1.2"

from . import collectives, isa, language, nki, rates
from .errors import (CollectiveMismatchError, ConstraintError, SimulatorError, SymmetryError,
                     UninitializedReadError)
from .rates import DEFAULT_LINK, LinkModel
from .runner import Kernel, SimResult, TensorSpec, run_ranks
from .shim import install, uninstall
from .tensor import MemoryRegion, NkiTensor
from .timeline import Timeline

__all__ = [
    "__version__", "run_ranks", "install", "uninstall", "SimResult", "Timeline", "LinkModel", "DEFAULT_LINK", "TensorSpec", "Kernel",
    "SimulatorError", "ConstraintError", "UninitializedReadError", "CollectiveMismatchError", "SymmetryError",
    "MemoryRegion", "NkiTensor", "nki", "language", "isa", "collectives", "rates",
]
