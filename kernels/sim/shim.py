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

_saved: dict[str, Any] | None = None


def _mapping() -> dict[str, ModuleType]:
    from . import collectives, constants, isa, language, nki, nki_dtype, nki_typing

    return {"nki": nki, "nki.language": language, "nki.isa": isa, "nki.isa.constants": constants,
            "nki.collectives": collectives, "nki.typing": nki_typing, "nki.dtype": nki_dtype}


def install(force: bool = False) -> ModuleType:
    """Route ``import nki`` and its submodules to the simulator; returns the ``nki`` module."""
    global _saved
    mods = _mapping()
    current = sys.modules.get("nki")
    if current is not None and current is not mods["nki"] and hasattr(current, "jit") and not force:
        raise RuntimeError("a real nki package is already imported; install(force=True) replaces it")
    if _saved is None:
        _saved = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    return mods["nki"]


def uninstall() -> None:
    """Undo ``install``."""
    global _saved
    if _saved is None:
        return
    for name, mod in _saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    _saved = None


_saved_legacy: dict[str, Any] | None = None


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
    global _saved_legacy
    mods = _legacy_mapping()
    current = sys.modules.get("neuronxcc.nki")
    if current is not None and current is not mods["neuronxcc.nki"] and hasattr(current, "jit") and not force:
        raise RuntimeError("a real neuronxcc package is already imported; install_legacy(force=True) replaces it")
    if _saved_legacy is None:
        _saved_legacy = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    mods["neuronxcc.nki.language"].install_operators()
    return mods["neuronxcc.nki"]


def uninstall_legacy() -> None:
    """Undo ``install_legacy``."""
    global _saved_legacy
    if _saved_legacy is None:
        return
    sys.modules["neuronxcc.nki.language"].uninstall_operators()
    for name, mod in _saved_legacy.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    _saved_legacy = None
