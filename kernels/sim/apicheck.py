"""Compare the simulator's public API with the NKI reference table (signatures.json).

The table (``/work/shared/nki-api/signatures.json``, copied in part into the package as
``trnopt/kernels/nki_signatures.json``) maps module -> {"functions": {name: [params]},
"classes": ..., "names": ...}; a param is {"name": ..., "default": "<repr>"}.
``api_differences`` lists every function the simulator provides that is missing from the
table or differs in parameter names, order, kind or defaults.
"""

from __future__ import annotations

import inspect
import json
from enum import Enum
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from . import collectives, isa, language, nki
from .tensor import MemoryRegion

MODULES: dict[str, ModuleType] = {"nki": nki, "nki.language": language, "nki.isa": isa,
                                  "nki.collectives": collectives}


def load_reference(path: str | Path | None = None) -> dict[str, Any]:
    """The reference table: ``path``, or the copy shipped in ``trnopt.kernels``."""
    if path is not None:
        return json.loads(Path(path).read_text())
    return json.loads(resources.files("trnopt.kernels").joinpath("nki_signatures.json").read_text())


def provided_functions(module: ModuleType) -> dict[str, Any]:
    """Public functions defined by (or re-exported as API from) a simulator module."""
    out = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(obj):
            continue
        if module is nki and name not in ("jit", "simulate"):
            continue
        if obj.__module__.startswith("trnopt.kernels.sim"):
            out[name] = obj
    return out


def format_default(value: Any) -> str:
    """A default as the reference writes it: enums as ``cls.member`` (buffers bare), else repr."""
    if isinstance(value, MemoryRegion):
        return value.name
    if isinstance(value, Enum):
        return f"{type(value).__name__}.{value.name}"
    if inspect.isfunction(value):
        return value.__name__
    return repr(value)


def signature_entries(fn: Any) -> list[dict[str, str]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        name = {p.VAR_KEYWORD: "**", p.VAR_POSITIONAL: "*"}.get(p.kind, "") + p.name
        entry = {"name": name}
        if p.default is not p.empty:
            entry["default"] = format_default(p.default)
        out.append(entry)
    return out


def api_differences(reference: dict[str, Any]) -> list[str]:
    problems = []
    for mod_name, module in MODULES.items():
        ref_funcs = reference.get(mod_name, {}).get("functions", {})
        for name, fn in sorted(provided_functions(module).items()):
            if name not in ref_funcs:
                problems.append(f"{mod_name}.{name}: provided by the simulator but not in the reference")
                continue
            ours, theirs = signature_entries(fn), ref_funcs[name]
            if ours != theirs:
                problems.append(f"{mod_name}.{name}: simulator {ours} != reference {theirs}")
    return problems


def implemented_subset(reference: dict[str, Any]) -> dict[str, Any]:
    """The part of the reference the simulator implements (for the packaged copy)."""
    out: dict[str, Any] = {}
    for mod_name, module in MODULES.items():
        ref = reference.get(mod_name, {})
        funcs = provided_functions(module)
        out[mod_name] = {
            "functions": {n: ref["functions"][n] for n in sorted(funcs) if n in ref.get("functions", {})},
            "classes": {n: c for n, c in ref.get("classes", {}).items() if hasattr(module, n)},
            "names": {n: c for n, c in ref.get("names", {}).items() if hasattr(module, n)},
        }
    return out
