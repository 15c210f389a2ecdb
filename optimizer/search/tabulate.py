"""The cost model's factor trees (cost/factors.py) as CP-SAT integer expressions.

Each ``Factor`` becomes a table over its decision's values, indexed by the decision's
variable (``add_element``); products become ``add_multiplication_equality``, ratios
``add_division_equality``, maxima and minima ``add_max_equality`` / ``add_min_equality``.
Quantities with units are integers in the caller's unit (``scale`` units per second or
per byte), rounded once per table entry: each Term carries the bound on what that
rounding moved it (intmodel.Term.error), which the search checks against the float
evaluation of the same tree.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.search.intmodel import CAP, IntModel, Term, const

# decision name -> (index Term, the values in index order)
Domain = tuple[Term, Sequence[Any]]


class Tabulator:
    """Compiles factor trees into one IntModel, sharing what several trees reuse."""

    def __init__(self, model: IntModel, domain: Callable[[str], Domain], direct: Callable[[str], Term]):
        self.model, self.domain, self.direct = model, domain, direct
        self._memo: dict[tuple[int, float], Term] = {}
        self._keep: list[f.Expr] = []  # the memo is by id: keep the trees alive

    def compile(self, expr: f.Expr, scale: float) -> Term:
        """The integer form of ``expr`` in units of 1/scale (seconds or bytes)."""
        key = (id(expr), scale)
        if key not in self._memo:
            self._keep.append(expr)
            self._memo[key] = self._compile(expr, scale, 1.0)
        return self._memo[key]

    # -- nodes -------------------------------------------------------------------------------
    def _compile(self, expr: f.Expr, scale: float, coef: float) -> Term:
        md = self.model
        if isinstance(expr, f.Const):
            return self._number(expr.number * coef, expr.exact and float(coef).is_integer(), scale)
        if isinstance(expr, f.Factor):
            return self._factor(expr, scale, coef)
        if isinstance(expr, f.Prod):
            return self._prod(expr, scale, coef)
        assert coef == 1.0, f"{expr.name}: a coefficient reaches a {type(expr).__name__}"
        if isinstance(expr, f.Sum):
            parts = [self.compile(i, scale) for i in expr.items]
            return _signed_sum(md, parts, expr.signs)
        if isinstance(expr, f.Ratio):
            return md.div(self.compile(expr.num, scale), self.compile(expr.den, 1.0), expr.name or "ratio")
        if isinstance(expr, f.Extremum):
            a, b = self.compile(expr.a, scale), self.compile(expr.b, scale)
            return md.maximum(a, b, expr.name or "max") if expr.largest else md.minimum(a, b, expr.name or "min")
        raise TypeError(f"no integer form for {type(expr).__name__}")

    def _number(self, value: float, exact: bool, scale: float) -> Term:
        if exact:
            return const(int(value))
        return const(min(CAP, int(round(value * scale))), err=0.5)

    def _factor(self, factor: f.Factor, scale: float, coef: float) -> Term:
        if factor.direct:
            assert coef == 1.0 and factor.exact, f"{factor.name}: a direct factor takes no coefficient"
            return self.direct(factor.key)
        index, values = self._index(factor.keys)
        entries = []
        for v in values:
            x = factor.fn(*v)
            if factor.exact and float(coef).is_integer():
                assert float(x).is_integer(), f"{factor.name}: expected an integer for {v}, got {x}"
                entries.append(int(x * coef))
            else:
                entries.append(int(round(x * coef * scale)))
        exact = factor.exact and float(coef).is_integer()
        return self.model.table(index, entries, factor.name or "factor", err=0.0 if exact else 0.5,
                                key=(factor.keys, values))

    def _prod(self, expr: f.Prod, scale: float, coef: float) -> Term:
        coef *= expr.coef
        counts = [i for i in expr.items if i.exact]
        carriers = [i for i in expr.items if not i.exact]
        if carriers:
            carrier = carriers[0]
            if isinstance(carrier, (f.Factor, f.Const)):
                unit = self._compile(carrier, scale, coef)  # the coefficient folds into its table
            else:
                unit = self.compile(carrier, scale)
                if coef != 1.0:
                    assert float(coef).is_integer(), f"{expr.name}: a fractional coefficient on a composite"
                    unit = self.model.mul(const(int(coef)), unit, "coef")
        elif float(coef).is_integer():
            unit = const(int(coef))
        else:  # counts times a constant with units
            unit = self._number(coef, False, scale)
        terms = [self.compile(i, 1.0) for i in counts]
        # indicators and small counts first: a zero gate keeps every later product in range
        terms.sort(key=lambda t: t.hi)
        out = terms[0] if terms else unit
        for t in terms[1:]:
            out = self.model.mul(out, t, expr.name or "prod")
        if terms:
            out = self.model.mul(out, unit, expr.name or "prod")
        return out

    def _index(self, keys: tuple[str, ...]) -> Domain:
        """Mixed-radix index of a tuple of decisions (last fastest) and their combined values."""
        domains = [self.domain(k) for k in keys]
        if len(domains) == 1:
            index, values = domains[0]
            return index, [(v,) for v in values]
        parts, stride = [], 1
        for index, values in reversed(domains):
            parts.append(self.model.mul(index, const(stride), "pair"))
            stride *= len(values)
        return self.model.add(*parts), list(itertools.product(*(values for _, values in domains)))


def _signed_sum(md: IntModel, parts: list[Term], signs: Sequence[int]) -> Term:
    positive = [p for p, s in zip(parts, signs) if s > 0]
    negative = [p for p, s in zip(parts, signs) if s < 0]
    total = md.add(*positive)
    if not negative:
        return total
    minus = md.add(*negative)
    both = md.add(total, minus)
    return Term(total.expr - minus.expr, total.lo - minus.hi, total.hi - minus.lo, both.error)
