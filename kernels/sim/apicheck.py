"""Compare the simulator's public API with the NKI 0.7 reference table.

The table (``trnopt/kernels/nki_signatures.json``: the NKI 0.6 table of
``/work/shared/nki-api/signatures.json`` extended to 0.7 and its submodules) maps module ->
{"functions": {name: [params]}, "classes": ..., "names": ...}; a param is
{"name": ..., "default": "<repr>"}. ``api_differences`` lists every reference function the
simulator lacks, every public function it has that the reference does not, every
signature that differs (names, order, kind, defaults) and every missing class or name.
A function the simulator does not implement is still present with the reference's
signature and raises NotImplementedError (``unimplemented``); ``implemented_counts``
counts the others.
"""

from __future__ import annotations

import inspect
import json
from enum import Enum
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .tensor import MemoryRegion


# Names the real package provides beyond the reference table, with the public code that
# uses them: checked present (``beyond_table_missing``), not reported as differences.
BEYOND_TABLE = {
    "nki.language": {"range": "nki-library experimental/mxfp_subkernels/mxfp_load_utils.py (loops)",
                     "bool": "nki-library core/utils/kernel_helpers.py (dtype of 'bool')"},
    "nki.typing": {"mutable_tensor": "nki-library core/router_topk/router_topk.py (output arguments)"},
}


def beyond_table_missing() -> list[str]:
    """The BEYOND_TABLE names the simulator lacks."""
    mods = modules()
    return [f"{m}.{n}" for m, names in BEYOND_TABLE.items() for n in names if not hasattr(mods[m], n)]


def modules() -> dict[str, ModuleType]:
    """Reference module name -> the simulator module that stands for it."""
    from . import collectives, constants, isa, language, nki, nki_dtype, nki_typing

    return {"nki": nki, "nki.language": language, "nki.isa": isa, "nki.isa.constants": constants,
            "nki.collectives": collectives, "nki.typing": nki_typing, "nki.dtype": nki_dtype}


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
        if module.__name__.endswith(".nki") and name not in ("jit", "simulate"):
            continue
        if obj.__module__.startswith("trnopt.kernels.sim"):
            out[name] = obj
    return out


def is_implemented(fn: Any) -> bool:
    return not getattr(fn, "not_implemented", False)


def implemented_counts(reference: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Module -> (reference functions the simulator implements, reference functions)."""
    out = {}
    for mod_name, module in modules().items():
        ref_funcs = reference.get(mod_name, {}).get("functions", {})
        funcs = provided_functions(module)
        out[mod_name] = (sum(1 for n in ref_funcs if n in funcs and is_implemented(funcs[n])), len(ref_funcs))
    return out


def format_default(value: Any) -> str:
    """A default as the reference writes it: enums as ``cls.member`` (buffers bare), else repr."""
    if isinstance(value, MemoryRegion):
        return value.name
    if value is Ellipsis:
        return "..."
    if isinstance(value, np.dtype):
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
    for mod_name, module in modules().items():
        ref = reference.get(mod_name, {})
        ref_funcs = ref.get("functions", {})
        provided = provided_functions(module)
        for name in sorted(set(ref_funcs) - set(provided)):
            problems.append(f"{mod_name}.{name}: in the reference but not in the simulator")
        for name, fn in sorted(provided.items()):
            if name not in ref_funcs:
                problems.append(f"{mod_name}.{name}: provided by the simulator but not in the reference")
                continue
            ours, theirs = signature_entries(fn), ref_funcs[name]
            if ours != theirs:
                problems.append(f"{mod_name}.{name}: simulator {ours} != reference {theirs}")
        for kind in ("classes", "names"):
            for name in sorted(ref.get(kind, {})):
                if not hasattr(module, name):
                    problems.append(f"{mod_name}.{name}: reference {kind[:-1] if kind == 'names' else 'class'} "
                                    f"missing from the simulator")
        for cls, spec in ref.get("classes", {}).items():
            for member in spec.get("members", {}):
                if hasattr(module, cls) and not hasattr(getattr(module, cls), member):
                    problems.append(f"{mod_name}.{cls}.{member}: reference member missing from the simulator")
    return problems
