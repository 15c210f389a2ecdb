"""The one place kernels import NKI from: the real ``nki`` package when it is installed
(Trainium hosts, from the AWS Neuron pip repository), trnopt's CPU simulator otherwise.

    from trnopt.kernels.nki_api import nki, nl, nisa, ncc, USING_REAL_NKI

Kernel source is the same in both cases. Under the simulator's import shim
(`trnopt.kernels.sim.install()`, which AWS's kernels run through) ``import nki`` finds the
simulator's modules, the same ones as the fallback, and ``USING_REAL_NKI`` stays False.
Set ``TRNOPT_FORCE_SIM=1`` to use the simulator even where the real package is installed
(the multi-rank tests need it: the real CPU simulator does not run nki.collectives).
"""

from __future__ import annotations

import os

USING_REAL_NKI = False
if os.environ.get("TRNOPT_FORCE_SIM", "") not in ("1", "true", "yes"):
    try:  # the PyPI placeholder named "nki" is empty: require the real submodules
        import nki  # type: ignore[no-redef]
        import nki.collectives as ncc  # type: ignore[no-redef]
        import nki.isa as nisa  # type: ignore[no-redef]
        import nki.language as nl  # type: ignore[no-redef]

        # with `trnopt.kernels.sim.install()` in effect, ``import nki`` is the simulator itself
        USING_REAL_NKI = (hasattr(nki, "jit") and hasattr(nisa, "nc_matmul")
                          and not nki.__name__.startswith("trnopt.kernels.sim"))
    except ImportError:
        USING_REAL_NKI = False

if not USING_REAL_NKI:
    from trnopt.kernels.sim import collectives as ncc  # noqa: F811
    from trnopt.kernels.sim import isa as nisa  # noqa: F811
    from trnopt.kernels.sim import language as nl  # noqa: F811
    from trnopt.kernels.sim import nki  # noqa: F811

__all__ = ["nki", "nl", "nisa", "ncc", "USING_REAL_NKI"]
