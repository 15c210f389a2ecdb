"""``neuronxcc.nki`` (the pre-0.6 NKI API): ``jit``, ``simulate_kernel``, ``language``,
``isa``, ``typing`` and the ``baremetal`` / ``benchmark`` / ``profile`` decorators.

"nki.simulate_kernel" (Neuron SDK 2.2x NKI API reference): ``simulate_kernel(kernel,
*args, **kwargs)`` runs the kernel on the CPU with NumPy arrays and returns its outputs;
"nki.jit": the decorator, whose ``mode="simulation"`` (and a call with NumPy arrays) runs
the simulator. The timing decorators run the kernel once in the simulator here.
"""

from __future__ import annotations

from typing import Any

from .. import nki_typing as typing  # noqa: F401
from ..runner import Kernel
from ..runner import jit as _jit
from ..runner import simulate_kernel as _simulate
from . import compiler, isa, language  # noqa: F401

__path__: list[str] = []  # a package: neuronxcc.nki.language, .isa, .compiler import as submodules


def jit(fn=None, mode=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: a kernel the simulator runs when called with arrays."""
    return _jit(fn, **kwargs) if fn is not None else (lambda f: _jit(f, **kwargs))


baremetal = benchmark = profile = trace = jit


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``kernel`` on NumPy ``args`` in the simulator; returns its outputs as NumPy."""
    if not isinstance(kernel, Kernel):
        kernel = Kernel(getattr(kernel, "fn", kernel))
    return _simulate(kernel)(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "tensor":
        from ..tensor import NkiTensor
        return NkiTensor
    raise AttributeError(f"neuronxcc.nki has no attribute {name!r}")
