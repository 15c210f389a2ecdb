"""Lower and upper bounds of the cost model's factor trees when each decision ranges over a set.

Interval arithmetic on the trees of cost/factors.py: a ``Factor`` ranges over its table's
entries on the allowed values; a product, sum, ratio, maximum or minimum of ranges ranges
within the interval rule of that operation (Moore, *Interval Analysis*, 1966, ch. 2: for
[a, b] * [c, d] the extremes are among ac, ad, bc, bd; for a sum, lo = sum of the lows
of the added items less the highs of the subtracted ones). The bound is valid, not tight:
two factors of one decision are bounded apart, as if they could take different values.

The search (search/branch.py) bounds each degree tuple's step time and memory this way,
before any CP-SAT model is solved for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from trnopt.optimizer.cost import factors as f

Interval = tuple[float, float]


class Ranges:
    """The values each decision may take, and a tag per decision naming its set (equal tags,
    equal sets) so that a factor's range is computed once per set, however many trees share it."""

    def __init__(self, values: Mapping[str, Sequence[Any]], tags: Mapping[str, Hashable]):
        self.values, self.tags = values, tags
        self.empty = any(len(v) == 0 for v in values.values())


class FactorEntries:
    """Each factor's value at each combination of its decisions' values, computed once (the
    factors' functions are pure) and shared by the Bounder and the PointBounder of a space."""

    def __init__(self):
        self._values: dict[tuple, float] = {}
        self._keep: dict[int, f.Factor] = {}  # keyed by id: keep the factors alive

    def __call__(self, factor: f.Factor, args: tuple) -> float:
        key = (id(factor), args)
        found = self._values.get(key)
        if found is None:
            self._keep.setdefault(id(factor), factor)
            found = self._values[key] = factor.fn(*args)
        return found


class Bounder:
    """Intervals of trees over Ranges. A node's interval depends only on the sets of the
    decisions below it, so it is kept by (node, those sets' tags) across calls: bounding
    many tuples of decisions recomputes only the nodes whose decisions changed."""

    def __init__(self, entries: FactorEntries | None = None):
        self._memo: dict[tuple, Interval] = {}
        self._deps: dict[int, tuple[str, ...]] = {}
        self._keep: list[f.Expr] = []  # the caches are keyed by id: keep the nodes alive
        self.entries = entries or FactorEntries()

    def interval(self, expr: f.Expr, ranges: Ranges) -> Interval:
        """(lo, hi) of ``expr`` over every point of ``ranges``."""
        key = (id(expr), *map(ranges.tags.__getitem__, self.decisions(expr)))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._node(expr, ranges)
        return found

    def decisions(self, expr: f.Expr) -> tuple[str, ...]:
        """The decisions ``expr`` depends on."""
        found = self._deps.get(id(expr))
        if found is None:
            if isinstance(expr, f.Factor):
                keys = set(expr.keys)
            else:
                keys = set().union(*(self.decisions(c) for c in _children(expr)))
            found = self._deps[id(expr)] = tuple(sorted(keys))
            self._keep.append(expr)
        return found

    def _node(self, expr: f.Expr, ranges: Ranges) -> Interval:
        if isinstance(expr, f.Const):
            return expr.number, expr.number
        if isinstance(expr, f.Factor):
            entries = [self.entries(expr, v) for v in itertools.product(*(ranges.values[k] for k in expr.keys))]
            return min(entries), max(entries)
        if isinstance(expr, f.Prod):
            lo = hi = expr.coef
            for item in expr.items:
                lo, hi = _times((lo, hi), self.interval(item, ranges))
            return lo, hi
        if isinstance(expr, f.Sum):
            lo = hi = 0.0
            for sign, item in zip(expr.signs, expr.items):
                a, b = self.interval(item, ranges)
                lo, hi = (lo + a, hi + b) if sign > 0 else (lo - b, hi - a)
            return lo, hi
        if isinstance(expr, f.Ratio):
            a, b = self.interval(expr.num, ranges)
            c, d = self.interval(expr.den, ranges)
            assert c > 0, f"{expr.name}: expected a positive denominator, got a range from {c}"
            return _times((a, b), (1 / d, 1 / c))
        if isinstance(expr, f.Extremum):
            (a, b), (c, d) = self.interval(expr.a, ranges), self.interval(expr.b, ranges)
            return (max(a, c), max(b, d)) if expr.largest else (min(a, c), min(b, d))
        raise TypeError(f"no interval form for {type(expr).__name__}")


def _children(expr: f.Expr) -> tuple[f.Expr, ...]:
    if isinstance(expr, (f.Prod, f.Sum)):
        return expr.items
    if isinstance(expr, f.Ratio):
        return expr.num, expr.den
    if isinstance(expr, f.Extremum):
        return expr.a, expr.b
    return ()


def _times(x: Interval, y: Interval) -> Interval:
    corners = (x[0] * y[0], x[0] * y[1], x[1] * y[0], x[1] * y[1])
    return min(corners), max(corners)


class PointBounder:
    """The same intervals at many points at once (NumPy): each point fixes some decisions to one
    value each (``index``: per decision, the position of each point's value in ``lists``) and
    leaves the others to range over ``ranged``. A factor becomes a table over its fixed
    decisions' values, of its least and greatest entry over the ranged ones; the operations
    apply elementwise. Factor entries are kept across calls (the functions are pure).

    Where a point fixes every decision of a factor, its least and greatest entries are one
    number: the interval is then returned as one array twice (``lo is hi``), and each operation
    on two such intervals computes it once, the same numbers at half the NumPy work."""

    def __init__(self, entries: FactorEntries | None = None):
        self._tables: dict[tuple, tuple] = {}
        self._keep: dict[int, f.Factor] = {}  # the tables are keyed by id: keep the factors alive
        self.entries = entries or FactorEntries()

    def intervals(self, exprs: Sequence[f.Expr], lists: Mapping[str, Sequence[Any]],
                  ranged: Mapping[str, Sequence[Any]], index: Mapping[str, np.ndarray],
                  tags: Mapping[str, Hashable]) -> list[tuple]:
        """(lo, hi) arrays (or scalars) of each expression at every point. ``tags`` names each
        decision's list or range (equal tags, equal sets), so a factor's table is built once per
        combination of sets."""
        memo: dict[int, tuple] = {}
        return [self._node(e, (lists, ranged, index, tags), memo) for e in exprs]

    def _node(self, expr: f.Expr, sets, memo) -> tuple:
        key = id(expr)
        if key in memo:
            return memo[key]
        if isinstance(expr, f.Const):
            out = (expr.number, expr.number)
        elif isinstance(expr, f.Factor):
            out = self._factor(expr, *sets, memo)
        elif isinstance(expr, f.Prod):
            out = (expr.coef, expr.coef)
            for item in expr.items:
                out = _times_array(out, self._node(item, sets, memo))
        elif isinstance(expr, f.Sum):
            lo = hi = 0.0
            for sign, item in zip(expr.signs, expr.items):
                a, b = self._node(item, sets, memo)
                if lo is hi and a is b:  # one number each: computed once
                    lo = hi = lo + a if sign > 0 else lo - a
                else:
                    lo, hi = (lo + a, hi + b) if sign > 0 else (lo - b, hi - a)
            out = (lo, hi)
        elif isinstance(expr, f.Ratio):
            a, b = self._node(expr.num, sets, memo)
            c, d = self._node(expr.den, sets, memo)
            assert np.all(np.asarray(c) > 0), f"{expr.name}: expected a positive denominator"
            out = _times_array((a, b), _once((d, c), lambda v: 1 / v))
        elif isinstance(expr, f.Extremum):
            (a, b), (c, d) = (self._node(x, sets, memo) for x in (expr.a, expr.b))
            pick = np.maximum if expr.largest else np.minimum
            out = (pick(a, c),) * 2 if a is b and c is d else (pick(a, c), pick(b, d))
        else:
            raise TypeError(f"no interval form for {type(expr).__name__}")
        memo[key] = out
        return out

    def _factor(self, factor: f.Factor, lists, ranged, index, tags, memo) -> tuple:
        fixed = [k for k in factor.keys if k in index]
        key = (id(factor), tuple(tags[k] for k in factor.keys), tuple(fixed))
        table = self._tables.get(key)
        if table is None:
            self._keep.setdefault(id(factor), factor)
            lo, hi = [], []
            for combo in itertools.product(*(lists[k] for k in fixed)):
                chosen = dict(zip(fixed, combo))
                values = [(chosen[k],) if k in chosen else ranged[k] for k in factor.keys]
                entries = [self.entries(factor, args) for args in itertools.product(*values)]
                lo.append(min(entries))
                hi.append(max(entries))
            table = self._tables[key] = (np.asarray(lo), np.asarray(hi), lo == hi)
        if not fixed:
            return _once((table[0], table[1]) if not table[2] else (table[0],) * 2, lambda t: float(t[0]))
        flat = memo.get(tuple(fixed))  # each point's row of the table, shared by the factors of the same decisions
        if flat is None:
            flat = index[fixed[0]]
            for k in fixed[1:]:  # mixed radix, last key fastest (itertools.product order)
                flat = flat * len(lists[k]) + index[k]
            memo[tuple(fixed)] = flat
        return (table[0][flat],) * 2 if table[2] else (table[0][flat], table[1][flat])


def _once(x: tuple, fn) -> tuple:
    """(fn(lo), fn(hi)) of an interval, computed once when it is one number (``lo is hi``)."""
    return (fn(x[0]),) * 2 if x[0] is x[1] else (fn(x[0]), fn(x[1]))


def _times_array(x: tuple, y: tuple) -> tuple:
    if x[0] is x[1] and y[0] is y[1]:  # one number each: every corner is the same product
        return (x[0] * y[0],) * 2
    if _nonnegative(x[0]) and _nonnegative(y[0]):  # the common case: two extremes, not four corners
        return x[0] * y[0], x[1] * y[1]
    corners = (x[0] * y[0], x[0] * y[1], x[1] * y[0], x[1] * y[1])
    return np.minimum(np.minimum(corners[0], corners[1]), np.minimum(corners[2], corners[3])), \
        np.maximum(np.maximum(corners[0], corners[1]), np.maximum(corners[2], corners[3]))


def _nonnegative(a) -> bool:
    return bool(np.min(a) >= 0) if isinstance(a, np.ndarray) else a >= 0
