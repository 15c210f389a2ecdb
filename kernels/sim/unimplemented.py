"""Reference functions the simulator does not implement: each raises NotImplementedError
naming the function and the NKI version, with the reference's exact signature (so that
``inspect.signature`` and the API check see the real parameters and defaults)."""

from __future__ import annotations

import inspect
from typing import Any

NKI_VERSION = "NKI 0.7 (Neuron SDK 2.33)"


class _Default:
    """A default value as the reference writes it (the stub never evaluates it)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def stub(module: str, name: str, params: list[dict[str, str]], why: str = "") -> Any:
    """A function ``module.name(params)`` that raises NotImplementedError when called."""
    label = f"{module}.{name}"

    def fn(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{label} ({NKI_VERSION}) is not implemented by the trnopt simulator"
                                  + (f": {why}" if why else ""))
    kinds = []
    for p in params:
        pname = p["name"]
        if pname.startswith("**"):
            kinds.append(inspect.Parameter(pname[2:], inspect.Parameter.VAR_KEYWORD))
        elif pname.startswith("*"):
            kinds.append(inspect.Parameter(pname[1:], inspect.Parameter.VAR_POSITIONAL))
        elif "default" in p:
            kinds.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_Default(p["default"])))
        else:
            kinds.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    fn.__signature__ = inspect.Signature(kinds)  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Not implemented by the simulator ({NKI_VERSION} reference function {label})."
    fn.not_implemented = True  # type: ignore[attr-defined]
    return fn


def fill(namespace: dict[str, Any], module: str, why: dict[str, str] | None = None) -> None:
    """Add a stub to ``namespace`` for every function of ``module`` in the reference table
    that the namespace does not define."""
    from .apicheck import load_reference

    funcs = load_reference().get(module, {}).get("functions", {})
    for name, params in funcs.items():
        if name not in namespace:
            namespace[name] = stub(module, name, params, (why or {}).get(name, ""))
