"""Engine registers: runtime scalars the kernel's Python cannot look at.

"nki.isa.VirtualRegister" (NKI 0.7): a 32-bit register of an engine sequencer, made by
``nisa.register_alloc`` / ``register_move`` / ``register_load`` and returned by
``ncc.rank_id`` and ``ncc.collective_permute_implicit_current_processing_rank_id`` ("The
returned rank ID is a scalar register. To determine the offset of the received data
chunk within a tensor, use register ALU operations (e.g., multiply the rank ID by chunk
size), then use dynamic access pattern (tensor.ap())").

The simulator knows the value (it runs the kernel), but the kernel's Python does not:
a register's value is known only when the instructions run, so using it in Python
control flow or as a Python index (``if reg``, ``int(reg)``, ``my_list[reg]``,
``my_list.index(reg)``, ``range(reg)``) raises TypeError, as tracing does ("Under the
tracer frontend ... using a register in Python control flow (if/while) or converting it
with int() / range() raises TypeError"). Register ALU arithmetic (+ - * // % with ints
or registers, shifts, bitwise ops, comparisons giving 0/1 registers) gives registers,
with int32 wrap-around. Registers are accepted where the reference takes a dynamic
value: ``tensor.ap(scalar_offset=reg)``, ``nl.ds(reg, size)`` and slices of HBM tensors.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np


def _wrap(v: int) -> int:
    return int(np.int64(v).astype(np.int32))


class VirtualRegister:
    """A 32-bit engine register. ``VirtualRegister(state)`` holds ``state`` (None: unset)."""

    __slots__ = ("_value", "frozen", "lanes")

    def __init__(self, state: Any = None, frozen: bool = False) -> None:
        self.lanes: tuple[int, ...] | None = None  # every rank's value, in a symmetric run
        if isinstance(state, VirtualRegister):
            self.lanes = state.lanes
            state = state._value
        self._value = None if state is None else _wrap(int(state))
        self.frozen = frozen

    @classmethod
    def per_rank(cls, values: list[int], rank: int, symmetric: bool) -> "VirtualRegister":
        """A read-only register holding ``values[rank]``; a symmetric run (one rank simulated
        for all) keeps every rank's value so that rank-dependent uses can be checked."""
        reg = cls(values[rank], frozen=True)
        if symmetric and len(set(values)) > 1:
            reg.lanes = tuple(_wrap(v) for v in values)
        return reg

    # --- the simulator's side -----------------------------------------------------------------
    def value(self, what: str = "register") -> int:
        """The value the hardware would hold (simulator internals only)."""
        if self._value is None:
            raise TypeError(f"{what}: register read before anything was moved or loaded into it "
                            f"(nisa.register_alloc() without a value)")
        return self._value

    def set(self, v: int) -> None:
        if self.frozen:
            raise TypeError("register is read-only (returned by an instruction); copy it with "
                            "nisa.register_move into a register from nisa.register_alloc")
        self._value = _wrap(int(v))

    def __repr__(self) -> str:
        return "VirtualRegister(<runtime value>)" if self._value is not None else "VirtualRegister(<unset>)"

    # --- what Python may not do -------------------------------------------------------------
    def _opaque(self, what: str) -> TypeError:
        return TypeError(f"{what} of a VirtualRegister: a register's value is known only when the kernel "
                         f"runs on the device, not while its Python builds the program (use register "
                         f"arithmetic and tensor.ap(scalar_offset=...) / nl.ds(reg, size) instead)")

    def __bool__(self) -> bool:
        raise self._opaque("truth value (if/while/and/or/list.index)")

    def __index__(self) -> int:
        raise self._opaque("use as a Python index (list[reg], range(reg))")

    def __int__(self) -> int:
        raise self._opaque("int()")

    def __float__(self) -> float:
        raise self._opaque("float()")

    __hash__ = None  # type: ignore[assignment]  # not a dict key: its value is not known

    # --- register ALU ---------------------------------------------------------------------------
    def _bin(self, other: Any, fn: Any, sym: str, swap: bool = False) -> "VirtualRegister":
        if isinstance(other, VirtualRegister):
            b, lb = other.value(f"register {sym}"), other.lanes
        elif isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            b, lb = int(other), None
        else:
            return NotImplemented
        a, la = self.value(f"register {sym}"), self.lanes
        out = VirtualRegister(fn(b, a) if swap else fn(a, b), frozen=True)
        if la is not None or lb is not None:
            n = len(la if la is not None else lb)
            xs, ys = la or (a,) * n, lb or (b,) * n
            out.lanes = tuple(_wrap(fn(y, x) if swap else fn(x, y)) for x, y in zip(xs, ys))
        return out


def _method(fn: Any, sym: str, swap: bool = False) -> Any:
    def m(self: VirtualRegister, other: Any) -> Any:
        return self._bin(other, fn, sym, swap)
    return m


for _name, _fn, _sym in [("add", operator.add, "+"), ("sub", operator.sub, "-"), ("mul", operator.mul, "*"),
                         ("floordiv", operator.floordiv, "//"), ("mod", operator.mod, "%"),
                         ("lshift", operator.lshift, "<<"), ("rshift", operator.rshift, ">>"),
                         ("and", operator.and_, "&"), ("or", operator.or_, "|"), ("xor", operator.xor, "^")]:
    setattr(VirtualRegister, f"__{_name}__", _method(_fn, _sym))
    setattr(VirtualRegister, f"__r{_name}__", _method(_fn, _sym, swap=True))
for _name, _fn in [("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge)]:
    setattr(VirtualRegister, f"__{_name}__", _method(lambda a, b, f=_fn: int(f(a, b)), _name))
VirtualRegister.__neg__ = lambda self: 0 - self  # type: ignore


def is_register(v: Any) -> bool:
    return isinstance(v, VirtualRegister)


def runtime_int(v: Any, what: str) -> int:
    """The value of an int or a register operand (for the simulator's own use)."""
    if isinstance(v, VirtualRegister):
        return v.value(what)
    return int(v)
