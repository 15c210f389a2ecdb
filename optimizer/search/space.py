"""The search space: one definition for the CP-SAT model and the brute-force enumerator.

A point of the space is a placement (for every parallel dimension, the factor of every
physical axis it occupies) and a memory plan (ZeRO stage, recomputation, micro-batch
size, interleaved stages). LNC and the number of domains fix the axes, so each
``Space`` is for one LNC and one domain count.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.rules import seq_problem, tp_problems
from trnopt.optimizer.cost.collectives import Span, link_class
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.placement import instance_prefix
from trnopt.optimizer.model.target import Axis

CP_MIN_SEQ = 8192           # context parallelism is searched from this sequence length on
CP_MAX = 16                 # ring attention's K/V traffic grows with the degree; 16 covers 128k tokens at 8k a rank
MAX_MICRO_BATCH = 16        # sequences per micro-batch: any divisor of the global batch up to this (larger sizes
                            # multiply the solve time and 16 x 8k tokens already fill every engine)
INTERLEAVES = (1, 2, 3, 4, 6, 8)  # virtual stages per pipeline rank (as many as the layers allow)


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n in increasing order, in O(sqrt n)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


def tp_degrees(heads: int, kv_heads: int, ranks: int, kv_replication: bool = True) -> tuple[int, ...]:
    """TP degrees a model admits on ``ranks`` ranks: d | ranks, d | heads, and d | kv_heads or,
    with ``kv_replication``, kv_heads | d (each rank holds whole query heads; past the KV head
    count every KV head is replicated on d / kv_heads ranks, as Megatron-LM's GQA tensor
    parallelism and NxD's ``kv_size_multiplier`` do; torchtitan has no replication)."""
    return tuple(d for d in divisors(ranks) if heads % d == 0
                 and (kv_heads % d == 0 or (kv_replication and d % kv_heads == 0)))


def group_spans(axes: tuple[Axis, ...], degrees: tuple[int, ...]) -> dict[tuple[int, str], Span]:
    """One span per (degree, link class) a group of one of ``degrees`` can take on ``axes``
    (degree 1 left out): of the spans with that key, the one with the most ranks on the
    innermost axes (the factors, read from the innermost axis out, largest first), so a
    group crosses a slower link class with the smallest factor that crosses it."""
    best: dict[tuple[int, str], tuple[int, ...]] = {}
    for fs in itertools.product(*(divisors(a.size) for a in axes)):
        d = math.prod(fs)
        if d == 1 or d not in degrees:
            continue
        key = (d, link_class(tuple((a, f) for a, f in zip(axes, fs) if f > 1)))
        if fs > best.get(key, ()):
            best[key] = fs
    return {key: tuple((a, f) for a, f in zip(axes, fs) if f > 1) for key, fs in sorted(best.items())}


def prime_exponents(n: int) -> dict[int, int]:
    out, p = {}, 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


BlockState = tuple[tuple[int, ...], bool]  # per axis the positions the rows so far took; an outside digit seen


def instance_blocks_hold(axes: tuple[Axis, ...], placement, chips_per_instance: int) -> bool:
    """The rule the CP-SAT model encodes (cpsat.LayoutModel._instance_blocks): in rank order no
    digit straddles an instance boundary on its own, and no digit inside an instance follows
    one outside it. Sufficient for torchrun's one-block-per-instance numbering; it skips the
    placements that are producible only because two families' digits on one axis align
    together (frameworks.profile.producible is the exact check). ``placement``: a layout's
    rows in DIMS order."""
    inside = instance_prefix(axes, chips_per_instance)
    state: BlockState | None = ((1,) * len(inside), False)
    for row in placement:
        state = block_step(inside, state, row)
        if state is None:
            return False
    return True


def block_step(inside: tuple[int, ...], state: BlockState, row: tuple[int, ...]) -> BlockState | None:
    """One row of instance_blocks_hold's rule, ``inside`` the instance's share of each axis
    (placement.instance_prefix): the state after the row, or None where it breaks the rule."""
    cumulative, seen_outside = state
    for j, f in enumerate(row):
        if f == 1:
            continue
        before, after, k = cumulative[j], cumulative[j] * f, inside[j]
        is_in, is_out = k % after == 0, before % k == 0
        split = k % before == 0 and after % k == 0
        if not (is_in or is_out or split):
            return None
        if not is_out and seen_outside:  # an inside part after an outside digit
            return None
        if not is_in:
            seen_outside = True
    return tuple(c * f for c, f in zip(cumulative, row)), seen_outside


@dataclass(frozen=True)
class Space:
    """The layouts of one problem at one LNC (the LNC and the domain count fix the axes)."""

    problem: Problem
    lnc: int

    @cached_property
    def axes(self) -> tuple[Axis, ...]:
        return self.problem.target.axes(self.lnc, self.problem.domains)

    @property
    def ranks(self) -> int:
        return math.prod(a.size for a in self.axes)

    @cached_property
    def degrees(self) -> dict[str, tuple[int, ...]]:
        """Candidate degrees per placement dimension (dp here is dp // ep, the expert replicas), after
        the model's and the framework's rules on single degrees (``Layout.workload_problems`` with
        ``Problem.rules``). The rule on tp and cp together (the sequence cut into seq_split x tp x cp
        pieces) is held for every pair: a cp degree is kept when it holds with every tp candidate,
        which drops nothing for the usual power-of-two sequences and keeps CP-SAT's one-hots
        independent."""
        m, tr, r, rules = self.problem.workload.model, self.problem.workload.training, self.ranks, self.problem.rules
        tp = tuple(d for d in tp_degrees(m.heads, m.kv_heads if m.mla is None else m.heads, r, rules.kv_replication)
                   if not tp_problems(m, d, rules) and not seq_problem(tr.seq, d, 1, rules))
        cp = (1,)
        if tr.seq >= CP_MIN_SEQ:
            cp = tuple(d for d in divisors(r) if d <= CP_MAX and all(not seq_problem(tr.seq, t, d, rules) for t in tp))
        ep = tuple(d for d in divisors(r) if m.moe and m.moe.experts % d == 0) or (1,)
        pp = tuple(d for d in divisors(r) if rules.stages_ok(m.layers, d, 1))
        return {"tp": tp, "cp": cp, "ep": ep, "dp": divisors(r), "pp": pp}

    def stages_ok(self, pp: int, interleave: int) -> bool:
        """Whether pp x interleave pipeline stages can be made of the model's layers under the rules."""
        return self.problem.rules.stages_ok(self.problem.workload.model.layers, pp, interleave)

    @property
    def interleaves(self) -> tuple[int, ...]:
        """1, and where the framework runs interleaved 1F1B, every count that leaves two layers a rank."""
        if not self.problem.interleave:
            return (1,)
        return tuple(v for v in INTERLEAVES if v == 1 or 2 * v <= self.problem.workload.model.layers)

    @cached_property
    def micro_batches(self) -> tuple[int, ...]:
        batch = self.problem.workload.training.global_batch
        return tuple(b for b in range(1, min(batch, MAX_MICRO_BATCH) + 1) if batch % b == 0)

    @property
    def hsdp_values(self) -> tuple[bool, ...]:
        """False, and True where the problem allows HSDP and there is a scale-out axis to replicate across."""
        return (False, True) if self.problem.hsdp and self.axes[-1].kind == "scale_out" and self.axes[-1].size > 1 \
            else (False,)

    def active(self, dim: str) -> bool:
        return len(self.degrees[dim]) > 1

    def size(self) -> int:
        """Points before the workload's rules: placements x memory plans."""
        placements = 1
        n_dims = sum(self.active(d) for d in DIMS)
        for axis in self.axes:
            # ordered factorizations of the axis size into n_dims factors
            placements *= math.prod(math.comb(e + n_dims - 1, n_dims - 1)
                                    for e in prime_exponents(axis.size).values())
        return (placements * len(self.micro_batches) * len(self.interleaves) * len(self.problem.zero_stages)
                * len(self.problem.recompute) * len(self.hsdp_values))

    def placements(self) -> Iterator[tuple[tuple[int, ...], ...]]:
        """Every placement whose degrees are candidates, as rows in DIMS order."""
        dims = [d for d in DIMS if self.active(d)]
        per_axis = []
        for axis in self.axes:
            per_axis.append([f for f in itertools.product(divisors(axis.size), repeat=len(dims))
                             if math.prod(f) == axis.size])
        for choice in itertools.product(*per_axis):
            rows = {d: tuple(c[i] for c in choice) for i, d in enumerate(dims)}
            full = tuple(rows.get(d, (1,) * len(self.axes)) for d in DIMS)
            if all(math.prod(row) in self.degrees[d] for d, row in zip(DIMS, full)):
                yield full

    def layouts(self) -> Iterator[Layout]:
        """Every valid layout of the space (the brute-force enumerator's input)."""
        workload = self.problem.workload
        for rows in self.placements():
            deg = {d: math.prod(r) for d, r in zip(DIMS, rows)}
            replicas = rows[DIMS.index("dp")][-1] if self.axes[-1].kind == "scale_out" else 1
            for b, v, zero, rc, hsdp in itertools.product(self.micro_batches, self.interleaves, self.problem.zero_stages,
                                                          self.problem.recompute, self.hsdp_values):
                if v > 1 and deg["pp"] == 1:
                    continue
                # HSDP: replicas across the scale-out axis, shards of more than one rank, ZeRO, no EP
                if hsdp and (replicas == 1 or deg["dp"] == replicas or zero == 0 or deg["ep"] > 1):
                    continue
                layout = Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"] * deg["ep"], ep=deg["ep"], cp=deg["cp"],
                                axes=self.axes, placement=rows, zero=zero, recompute=rc, micro_batch=b,
                                interleave=v, lnc=self.lnc, dp_replicate=replicas if hsdp else 1)
                if layout.workload_problems(workload, self.problem.rules):
                    continue
                if self.problem.instance_blocks and not instance_blocks_hold(
                        self.axes, rows, self.problem.target.chips_per_instance):
                    continue
                yield layout
