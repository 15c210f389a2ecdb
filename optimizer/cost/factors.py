"""The cost model's factorisation: every term as sums, maxima and ratios of products of factors
that each depend on one decision.

Why. The CP-SAT search needs the step time and the memory as integer expressions over its
decision variables, and the float evaluation needs the same numbers for one layout. Both
are computed from one tree per term, built here by the cost model (steptime.py,
memory.py): the float evaluation walks it with a layout's values (``Expr.value``), the
search tabulates each ``Factor`` over its decision's values and multiplies the integers
(search/tabulate.py). A new term is written once, as a tree, and needs no algebra in the
solver.

Decisions a factor may depend on (``Point`` keys), the values ``decisions`` reads off a
layout:

    recompute, zero, micro_batch, interleave    the memory plan
    micro_batches                               m = global batch / (dp * micro_batch)
    tp, cp, ep, pp, dp, edp                     degrees (dp: every data-parallel rank;
                                                edp: the expert-data group, dp // ep, or
                                                dp // (ep / tp) when EP folds over TP)
    ep_fold                                     TP ranks the EP group folds over: 1, or tp
                                                under expert TP 1 (the search's layouts: 1)
    hsdp                                        whether the sharded state is replicated
                                                across the scale-out axis (dp_replicate > 1)
    span.tp, span.cp, span.ep, span.pp,         the axes (and factors) one group of the
    span.edp, span.dp                           dimension spans (span.dp: the dense
                                                gradients' group, ep x edp)

A factor may also depend on a small fixed tuple of decisions, e.g. (recompute, tp) for
a GEMM's time; its table then has one entry per combination.

Rules that keep the integer form exact up to a known rounding (search/intmodel.py):
- in a ``Prod`` at most one item carries units (seconds or bytes); the others are exact
  integers (counts), and the coefficient folds into the item with units;
- a ``Ratio``'s denominator is exact;
- ``Max`` and ``Min`` compare expressions of the same units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

Point = Mapping[str, Any]  # decision name -> value, for one layout


class Expr:
    """A node of a term's tree."""

    exact: bool = False  # an integer count for every value of its decisions (no units)

    def value(self, point: Point) -> float:
        raise NotImplementedError


Node = Union[Expr, float, int]


@dataclass(frozen=True, eq=False)
class Factor(Expr):
    """``fn`` of one decision (or a small tuple of decisions): a table in the solver.

    ``exact`` factors return integers (counts, indicators); the others return seconds or
    bytes, which the solver rounds to its unit. ``direct`` factors are the decision's
    value itself (the solver uses its variable, no table).
    """

    key: str | tuple[str, ...]
    fn: Callable[..., float]
    exact: bool = False
    name: str = ""
    direct: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return self.key if isinstance(self.key, tuple) else (self.key,)

    def value(self, point: Point) -> float:
        return self.fn(*(point[k] for k in self.keys))


def decision(key: str) -> Factor:
    """The value of an integer decision itself (a degree, the micro-batch count, ...)."""
    return Factor(key, lambda v: v, exact=True, name=key, direct=True)


def count(key: str | tuple[str, ...], fn: Callable[..., int], name: str) -> Factor:
    """An integer function of one decision (layers per stage, collectives per layer, an indicator)."""
    return Factor(key, fn, exact=True, name=name)


def table(key: str | tuple[str, ...], fn: Callable[..., float], name: str) -> Factor:
    """Seconds or bytes as a function of one decision (a GEMM's time, a span's seconds per byte)."""
    return Factor(key, fn, exact=False, name=name)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    """A number that depends on no decision; ``exact`` for integer counts."""

    number: float
    exact: bool = False

    def value(self, point: Point) -> float:
        return self.number


def _node(x: Node) -> Expr:
    if isinstance(x, Expr):
        return x
    return Const(x, exact=float(x).is_integer())


@dataclass(frozen=True, eq=False)
class Prod(Expr):
    """coef * the product of the items; at most one item carries units."""

    items: tuple[Expr, ...]
    coef: float = 1.0
    name: str = ""

    def __post_init__(self):
        with_units = [i for i in self.items if not i.exact]
        assert len(with_units) <= 1, f"{self.name}: expected at most one factor with units, got {len(with_units)}"

    @property
    def exact(self) -> bool:  # type: ignore[override]
        return all(i.exact for i in self.items) and float(self.coef).is_integer()

    def value(self, point: Point) -> float:
        return self.coef * math.prod(i.value(point) for i in self.items)


def prod(*items: Node, coef: float = 1.0, name: str = "") -> Prod:
    return Prod(tuple(_node(i) for i in items), coef, name)


@dataclass(frozen=True, eq=False)
class Sum(Expr):
    """The sum of the items, each with its sign (+1 or -1)."""

    items: tuple[Expr, ...]
    signs: tuple[int, ...]
    name: str = ""

    @property
    def exact(self) -> bool:  # type: ignore[override]
        return all(i.exact for i in self.items)

    def value(self, point: Point) -> float:
        return sum(s * i.value(point) for s, i in zip(self.signs, self.items))


def add(*items: Node, name: str = "") -> Sum:
    nodes = tuple(_node(i) for i in items)
    return Sum(nodes, (1,) * len(nodes), name)


def sub(a: Node, b: Node, name: str = "") -> Sum:
    return Sum((_node(a), _node(b)), (1, -1), name)


@dataclass(frozen=True, eq=False)
class Ratio(Expr):
    """num / den, with an exact denominator (the solver divides and truncates)."""

    num: Expr
    den: Expr
    name: str = ""

    def __post_init__(self):
        assert self.den.exact, f"{self.name}: the denominator must be an exact count"

    def value(self, point: Point) -> float:
        return self.num.value(point) / self.den.value(point)


def ratio(num: Node, den: Node, name: str = "") -> Ratio:
    return Ratio(_node(num), _node(den), name)


@dataclass(frozen=True, eq=False)
class Extremum(Expr):
    """max(a, b) or min(a, b): written once here, an add_max_equality / add_min_equality in CP-SAT."""

    a: Expr
    b: Expr
    largest: bool
    name: str = ""

    @property
    def exact(self) -> bool:  # type: ignore[override]
        return self.a.exact and self.b.exact

    def value(self, point: Point) -> float:
        pick = max if self.largest else min
        return pick(self.a.value(point), self.b.value(point))


def maximum(a: Node, b: Node, name: str = "") -> Extremum:
    return Extremum(_node(a), _node(b), True, name)


def minimum(a: Node, b: Node, name: str = "") -> Extremum:
    return Extremum(_node(a), _node(b), False, name)


def indicator(key: str, test: Callable[[Any], bool], name: str) -> Factor:
    """1 where ``test`` holds for the decision's value, else 0 (e.g. 'ZeRO stage is 3')."""
    return count(key, lambda v: int(bool(test(v))), name)


def decisions(layout, workload) -> dict[str, Any]:
    """The value of every decision of ``layout`` (a Layout) for ``workload``."""
    return {
        "recompute": layout.recompute, "zero": layout.zero, "micro_batch": layout.micro_batch,
        "interleave": layout.interleave, "micro_batches": layout.micro_batches(workload),
        "tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "pp": layout.pp, "dp": layout.dp,
        "edp": layout.edp, "ep_fold": layout.ep_fold, "hsdp": layout.dp_replicate > 1,
        "span.tp": layout.span("tp"), "span.cp": layout.span("cp"), "span.ep": layout.ep_span(),
        "span.pp": layout.span("pp"), "span.edp": layout.span("dp"), "span.dp": layout.span("ep", "dp"),
    }
