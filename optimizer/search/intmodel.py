"""Integer expressions for CP-SAT with bounds and a rounding bound, and the arithmetic on them.

The layout model (solver.py) composes its cost tables with these helpers so that every
variable's domain is known, stays inside what CP-SAT handles soundly (CAP), and carries
``error``: how far rounding table entries to whole ticks can have moved it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ortools.sat.python import cp_model

# Magnitudes. CP-SAT propagates products and bounds in int64 and bounds the objective
# with doubles; with values near 2^52 it was seen to prove a wrong optimum (a test found
# it). So every time and memory variable stops at 2^44: a time past 2^44 ticks (a million
# times the best compute) or a memory past 2^44 bytes (16 TiB per chip) is far from any
# optimum and any HBM. Every product pairs such a variable with a multiplier below 2^17.
CAP = 2**44

Value = Callable[[object], float]  # the solver's value of an expression in a solution


def _exact(value: Value) -> float:
    return 0.0


@dataclass(frozen=True)
class Term:
    """An integer expression with known bounds, and ``error``: given the solution's values, a
    bound on how far it is from the exact real value because table entries were rounded."""

    expr: object
    lo: int
    hi: int
    error: Callable[[Value], float] = _exact

    @property
    def constant(self) -> bool:
        return self.lo == self.hi


def _fixed(err: float) -> Callable[[Value], float]:
    return (lambda value: err) if err else _exact


def const(v: int, err: float = 0.0) -> Term:
    return Term(int(v), int(v), int(v), _fixed(err))


class IntModel:
    """A CpModel with the arithmetic helpers; every helper returns a Term."""

    def __init__(self):
        self.model = cp_model.CpModel()
        self._count = 0
        self.indexed: list[tuple[cp_model.IntVar, object]] = []  # (a table's index variable, its key)

    def _name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def var(self, lo: int, hi: int, name: str, cap: int = CAP, error=_exact) -> Term:
        hi = min(hi, cap)
        term = Term(self.model.new_int_var(min(lo, hi), hi, self._name(name)), min(lo, hi), hi, error)
        return term

    def materialise(self, a: Term, name: str) -> Term:
        if isinstance(a.expr, (int, cp_model.IntVar)):
            return a
        v = self.var(a.lo, a.hi, name, error=a.error)
        self.model.add(v.expr == a.expr)
        return v

    def table(self, index: Term, values: list[int], name: str, err: float = 0.0, key: object = None) -> Term:
        """values[index]; ``err`` 0.5 for entries rounded to whole ticks, 0 for exact integers.
        Entries saturate at CAP: every table feeds a sum or product that only grows with it.
        ``key`` (what the index enumerates) is kept with the index variable in ``indexed``."""
        values = [min(v, CAP) for v in values]
        if len(set(values)) == 1:
            return const(values[0], err)
        v = self.var(min(values), max(values), name, error=_fixed(err))
        at = self.materialise(index, name + "_index")
        self.model.add_element(at.expr, values, v.expr)
        if key is not None and isinstance(at.expr, cp_model.IntVar):
            self.indexed.append((at.expr, key))
        return v

    def mul(self, a: Term, b: Term, name: str, cap: int = CAP) -> Term:
        ea, eb = a.error, b.error

        def error(value: Value) -> float:
            da, db = ea(value), eb(value)
            return da * value(b.expr) + db * value(a.expr) + da * db

        if a.constant and b.constant:
            return Term(a.lo * b.lo, a.lo * b.lo, a.lo * b.lo, error)
        if a.constant or b.constant:
            k, x = (a.lo, b) if a.constant else (b.lo, a)
            # a zero constant keeps the product at 0, but not its rounding: a table whose entries all
            # rounded to 0 ticks still carries their error times the other factor
            return Term(k * x.expr, k * x.lo, k * x.hi, error) if k else Term(0, 0, 0, error)
        v = self.var(a.lo * b.lo, a.hi * b.hi, name, cap, error)
        self.model.add_multiplication_equality(v.expr, [self.materialise(a, name + "_a").expr,
                                                        self.materialise(b, name + "_b").expr])
        return v

    def div(self, a: Term, b: Term, name: str) -> Term:
        if b.constant and b.lo == 1:
            return a
        ea = a.error

        def error(value: Value) -> float:
            return ea(value) / max(value(b.expr), 1) + 1  # the division truncates

        if a.constant and b.constant:
            return Term(a.lo // b.lo, a.lo // b.lo, a.lo // b.lo, error)
        v = self.var(a.lo // max(b.hi, 1), a.hi // max(b.lo, 1), name, error=error)
        self.model.add_division_equality(v.expr, self.materialise(a, name + "_n").expr,
                                         self.materialise(b, name + "_d").expr)
        return v

    def add(self, *terms: Term) -> Term:
        errors = [t.error for t in terms if t.error is not _exact]
        return Term(sum(t.expr for t in terms), sum(t.lo for t in terms), sum(t.hi for t in terms),
                    (lambda value: sum(e(value) for e in errors)) if errors else _exact)

    def maximum(self, a: Term, b: Term, name: str) -> Term:
        ea, eb = a.error, b.error
        v = self.var(max(a.lo, b.lo), max(a.hi, b.hi), name, error=lambda value: max(ea(value), eb(value)))
        self.model.add_max_equality(v.expr, [a.expr, b.expr])
        return v

    def minimum(self, a: Term, b: Term, name: str) -> Term:
        ea, eb = a.error, b.error
        v = self.var(min(a.lo, b.lo), min(a.hi, b.hi), name, error=lambda value: max(ea(value), eb(value)))
        self.model.add_min_equality(v.expr, [a.expr, b.expr])
        return v

    def one_hot(self, values: tuple, name: str) -> list:
        bools = [self.model.new_bool_var(f"{name}={v}") for v in values]
        self.model.add_exactly_one(bools)
        return bools

    def value(self, bools: list, values: tuple) -> Term:
        if len(values) == 1:
            return const(values[0])
        return Term(sum(v * b for v, b in zip(values, bools)), min(values), max(values))

    def index(self, bools: list) -> Term:
        if len(bools) == 1:
            return const(0)
        return Term(sum(i * b for i, b in enumerate(bools)), 0, len(bools) - 1)

    def pair_index(self, first: list, second: list) -> Term:
        return self.add(self.mul(self.index(first), const(len(second)), "pair"), self.index(second))

    def select(self, literal, var: Term, if_true, if_false) -> None:
        """var == if_true when the literal holds, else if_false (the literal may be a constant)."""
        if literal is True or literal is False:
            self.model.add(var.expr == (if_true if literal else if_false))
            return
        self.model.add(var.expr == if_true).only_enforce_if(literal)
        self.model.add(var.expr == if_false).only_enforce_if(literal.Not())
