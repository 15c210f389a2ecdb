"""``install()``: make ``import nki`` (and its submodules) load this simulator, so that
unmodified NKI 0.7 kernels run on it.

Maps nki, nki.language, nki.isa, nki.isa.constants, nki.collectives, nki.typing and
nki.dtype onto the simulator's modules in ``sys.modules``. A real ``nki`` package already
imported is replaced only with ``force=True`` (the empty PyPI placeholder always is).
``uninstall()`` restores what was there.

``install_legacy()`` does the same for the pre-0.6 API: neuronxcc, neuronxcc.nki,
neuronxcc.nki.language, neuronxcc.nki.isa and neuronxcc.nki.typing (``kernels.sim.legacy``),
and gives the simulator's tensors the operators and index-expression subscripts of that API.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

# What sys.modules held under each routed name before ``install`` ("nki") and
# ``install_legacy`` ("neuronxcc.nki"), keyed by that top module; absent: not installed.
_saved: dict[str, dict[str, Any]] = {}


def _route(mods: dict[str, ModuleType], top: str, force: bool, again: str) -> None:
    """Put ``mods`` in sys.modules, keeping what they replace; a real ``top`` package already
    imported (one with ``jit``, not the empty PyPI placeholder) only with ``force``."""
    current = sys.modules.get(top)
    if current is not None and current is not mods[top] and hasattr(current, "jit") and not force:
        raise RuntimeError(f"a real {top.split('.')[0]} package is already imported; {again}(force=True) replaces it")
    _saved.setdefault(top, {name: sys.modules.get(name) for name in mods})
    sys.modules.update(mods)


def _restore(top: str) -> bool:
    """Put back what ``_route`` replaced for ``top``; False when it was not routed."""
    saved = _saved.pop(top, None)
    if saved is None:
        return False
    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    return True


def _mapping() -> dict[str, ModuleType]:
    from . import collectives, constants, isa, language, nki, nki_dtype, nki_typing

    return {"nki": nki, "nki.language": language, "nki.isa": isa, "nki.isa.constants": constants,
            "nki.collectives": collectives, "nki.typing": nki_typing, "nki.dtype": nki_dtype}


def install(force: bool = False) -> ModuleType:
    """Route ``import nki`` and its submodules to the simulator; returns the ``nki`` module."""
    mods = _mapping()
    _route(mods, "nki", force, "install")
    return mods["nki"]


def uninstall() -> None:
    """Undo ``install``."""
    _restore("nki")


def _legacy_mapping() -> dict[str, ModuleType]:
    from . import legacy
    from .legacy import compiler, isa, language, nki, typing

    nki.typing = typing
    legacy.nki = nki
    return {"neuronxcc": legacy, "neuronxcc.nki": nki, "neuronxcc.nki.language": language,
            "neuronxcc.nki.isa": isa, "neuronxcc.nki.isa.constants": isa.constants,
            "neuronxcc.nki.typing": typing, "neuronxcc.nki.compiler": compiler}


def install_legacy(force: bool = False) -> ModuleType:
    """Route ``import neuronxcc.nki`` (the pre-0.6 API) to the simulator; returns ``neuronxcc.nki``."""
    mods = _legacy_mapping()
    _route(mods, "neuronxcc.nki", force, "install_legacy")
    mods["neuronxcc.nki.language"].install_operators()
    return mods["neuronxcc.nki"]


def uninstall_legacy() -> None:
    """Undo ``install_legacy``."""
    if "neuronxcc.nki" in _saved:
        sys.modules["neuronxcc.nki.language"].uninstall_operators()
    _restore("neuronxcc.nki")
