"""``install()``: make ``import nki`` (and its submodules) load this simulator, so that
unmodified NKI 0.7 kernels run on it.

Maps nki, nki.language, nki.isa, nki.isa.constants, nki.collectives, nki.typing and
nki.dtype onto the simulator's modules in ``sys.modules``. A real ``nki`` package already
imported is replaced only with ``force=True`` (the empty PyPI placeholder always is).
``uninstall()`` restores what was there.
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
