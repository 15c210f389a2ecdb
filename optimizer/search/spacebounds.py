"""The branches of a space and their bounds: interval arithmetic on the cost model's own trees
(search/bounds.py) over a degree tuple (a branch), its (recompute, ZeRO) plans, and every
point of it at once in NumPy, where each point's value is exact.

A branch is a degree tuple (tp, cp, ep, edp, pp) of one LNC's space. ``branches`` floors
each with every other decision ranging; ``refine`` floors its plans one by one; ``place``
scores every point (placement x plan x micro-batch size x interleave x HSDP) at once: with
every decision fixed, a point's interval is one number, the cost model's step time (the
trees are the cost model's own, cost/steptime.py ``step_terms``, cost/memory.py
``memory_terms``), so the branch's best point is its best layout, re-scored by the float
cost model before it is used. A branch with more points than MAX_POINTS is left to CP-SAT
(search/branch.py), which is where the model is built (``lm``).

Over 450 lines: the memory rule of every method here is either the even split's or, for the
joint layout-and-split search (search/jointsplit.py), the floor over every split; both rules
read the same branch caches and trees, so they stay in one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import functools
import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from trnopt.optimizer.cost.memory import memory_terms
from trnopt.optimizer.cost.steptime import TERMS, step_terms
from trnopt.optimizer.model.layout import Layout, every_nth
from trnopt.optimizer.model.placement import instance_prefix
from trnopt.optimizer.search.bounds import Bounder, FactorEntries, PointBounder, Ranges
from trnopt.optimizer.search.placements import MAX_PLACEMENTS, PLACED, first_placements, placements
from trnopt.optimizer.search.space import Space, divisors, prime_exponents

if TYPE_CHECKING:  # CP-SAT (OR-Tools) is imported only when a branch needs it
    from trnopt.optimizer.cost.problem import Problem
    from trnopt.optimizer.search.cpsat import LayoutModel

SPANS = {"span.tp": ("tp",), "span.cp": ("cp",), "span.ep": ("ep",), "span.edp": ("edp",),
         "span.pp": ("pp",), "span.dp": ("ep", "edp")}  # each span decision's families
# Families in the order of a degree tuple (edp: the expert-data replicas, dp // ep)
FAMILIES = PLACED
SLACK = 1e-6  # relative: the cutoff lets through layouts that tie with it within float noise
MAX_POINTS = 2_000_000   # points scored in one branch before it is left to CP-SAT whole (placements: MAX_PLACEMENTS)
CHUNK_POINTS = 100_000  # points bounded in one NumPy pass (a few MB per node of the trees)
EXACT = 1e-9  # relative: a point's interval narrower than this is its value (float noise of the trees)


class HashedSpan(tuple):
    """A span ((axis, factor), ...) that keeps its hash: the factors' tables are keyed by spans,
    and hashing one hashes every field of its axes again (a third of flooring every branch)."""

    def __new__(cls, items):
        span = super().__new__(cls, items)
        span._hash = tuple.__hash__(span)
        return span

    def __hash__(self):
        return self._hash


@dataclass
class Branch:
    """One degree tuple of one space (LNC) and what is known of it."""

    space: SpaceBounds
    degrees: dict[str, int]
    floor: float                                  # seconds: no layout of the branch is faster
    plans: dict[tuple[str, int], float] | None = None  # once refined: (recompute, zero) plans left -> floor
    floored: bool = False           # its floor is over every step term (``deepen``), not only the cheap ones
    placed: bool = False            # its points were bounded (or there were too many to)
    placements: list | None = None  # once placed: (floor, rows) of each placement that could beat it, best first
    best: Layout | None = None      # once placed exactly: its best layout (every point scored), None if none fits



class SpaceBounds:
    """The branches of one space (one LNC) and their bounds, from the cost model's trees; its
    LayoutModel (``lm``) is built only when a branch needs CP-SAT."""

    def __init__(self, source: LayoutModel | Space):
        self._lm = None if isinstance(source, Space) else source
        self.space = source.space if self._lm is not None else source
        self.problem = p = self.space.problem
        w, t, axes = p.workload, p.target, self.space.axes
        self.steps = self._lm.steps if self._lm else step_terms(w, t, axes, self.space.lnc, p.overlap)
        self.memories = self._lm.memories if self._lm else memory_terms(w, t, axes)
        # the decisions' values, as cpsat.LayoutModel has them
        degrees = {d: self.space.degrees["dp" if d == "edp" else d] for d in FAMILIES}
        self.active = [d for d in FAMILIES if len(degrees[d]) > 1]
        self.degree_values = {d: degrees[d] for d in self.active}
        self.axis_divisors = [divisors(a.size) for a in axes]
        self.interleaves = self.space.interleaves if "pp" in self.active else (1,)
        self.recompute_values, self.zero_values = tuple(p.recompute), tuple(p.zero_stages)
        self.hsdp_values = self.space.hsdp_values
        self.bounder, self.points_bounder = _bounders(replace(p, overlap=None), self.space.lnc)
        self.usable = self.problem.target.chip.hbm_bytes * (1 - self.problem.headroom)
        self._rows = self._rows_by_degree()
        self._spans: dict[tuple, tuple] = {}
        self._by_degree: dict[int, list] = {}
        self._position: dict[int, dict] = {}
        self._inside = tuple(instance_prefix(axes, p.target.chips_per_instance)) if p.instance_blocks else None
        self._floors: dict[tuple, tuple[float, float]] = {}  # (degree tuple, rule) -> (cheap step, memory) floors
        self._split_memories: dict | None = None
        self._deep: dict[tuple, float] = {}                   # degree tuple -> step floor over every term
        # the step terms that range over no TP or data-parallel placement: floored for every tuple
        # at once; the others' collectives over every row of those groups are most of a floor's
        # cost, and are floored only for the tuples the search reaches (``deepen``)
        steps = [name for name in TERMS if name != "tp_raw"]
        self.cheap_terms = [name for name in steps
                            if not {"span.tp", "span.dp", "span.edp"} & set(self.bounder.decisions(self.steps[name]))]

    @property
    def split_memories(self) -> dict:
        """The memory floor over every split of a layout's layers (cost/stages.py ``split_memory_terms``),
        built on first use: the joint search's memory rule (``split=True`` below)."""
        return self._split_trees()[0]

    @property
    def split_parts(self) -> dict:
        """The per-stage memory's parts at a point (cost/stages.py ``split_memory_parts``), built on first use."""
        return self._split_trees()[1]

    def _split_trees(self) -> tuple[dict, dict]:
        if self._split_memories is None:
            from trnopt.optimizer.cost.stages import split_memory_parts, split_memory_terms
            p = self.problem
            self._split_memories = (split_memory_terms(p.workload, p.target, self.space.axes, self.memories),
                                    split_memory_parts(p.workload, p.target, self.space.axes, self.memories))
        return self._split_memories

    def _memory_rule(self, split: bool) -> dict:
        return self.split_memories if split else self.memories

    @property
    def lm(self) -> LayoutModel:
        """The space's CP-SAT model, built on first use (SafetyStop may interrupt the caller's build)."""
        if self._lm is None:
            from trnopt.optimizer.search.cpsat import LayoutModel
            self._lm = LayoutModel(self.space)
        return self._lm

    # -- ranges of the decisions a branch leaves open -------------------------------------------
    def _rows_by_degree(self) -> dict[int, list[tuple[int, ...]]]:
        """The placement rows (a factor per axis), grouped by their product."""
        groups: dict[int, list] = {}
        for row in itertools.product(*self.axis_divisors):
            groups.setdefault(math.prod(row), []).append(row)
        return groups

    def _span(self, row: tuple[int, ...]) -> tuple:
        found = self._spans.get(row)
        if found is None:
            found = self._spans[row] = HashedSpan((a, n) for a, n in zip(self.space.axes, row) if n > 1)
        return found

    def _positions(self, degree: int) -> dict[tuple[int, ...], int]:
        """Each row of product ``degree``: its position in ``_spans_of(degree)``."""
        found = self._position.get(degree)
        if found is None:
            found = self._position[degree] = {r: i for i, r in enumerate(self._rows.get(degree, []))}
        return found

    def _spans_of(self, degree: int) -> list:
        """The spans of every row whose product is ``degree``."""
        found = self._by_degree.get(degree)
        if found is None:
            found = self._by_degree[degree] = [self._span(r) for r in self._rows.get(degree, [])]
        return found

    def ranges(self, degrees: dict[str, int], fixed: dict | None = None, rows: dict | None = None) -> Ranges:
        """Every decision's values in the branch (a superset where the exact set needs the placement);
        ``fixed`` (recompute, zero, micro_batch, interleave: one value each) and ``rows`` (a
        placement: span decision -> row) narrow it."""
        fixed, rows = fixed or {}, rows or {}
        p, space = self.problem, self.space
        batch, layers = p.workload.training.global_batch, p.workload.model.layers
        dp, pp = degrees["ep"] * degrees["edp"], degrees["pp"]
        sizes = tuple(b for b in space.micro_batches if batch % (dp * b) == 0)
        counts = tuple(batch // (dp * b) for b in sizes)
        interleaves = (1,) + tuple(v for v in self.interleaves if v > 1 and pp > 1 and space.stages_ok(pp, v)
                                   and any(m % pp == 0 for m in counts))
        recompute = tuple(rc for rc in self.recompute_values
                          if not every_nth(rc) or math.ceil(layers / pp) % every_nth(rc) == 0)
        values = {"tp": (degrees["tp"],), "cp": (degrees["cp"],), "ep": (degrees["ep"],), "pp": (pp,),
                  "edp": (degrees["edp"],), "dp": (dp,), "micro_batch": sizes, "interleave": interleaves,
                  "recompute": recompute, "zero": self.zero_values,
                  "hsdp": (False,) if degrees["ep"] > 1 else self.hsdp_values}
        for key, value in fixed.items():
            values[key] = (value,) if value in values[key] else ()
        values["micro_batches"] = tuple(batch // (dp * b) for b in values["micro_batch"])
        values["ep_fold"] = (1,)  # the search places experts as TP does (expert TP = TP): no fold
        tags = {key: (key, v) for key, v in values.items()}
        span_degree = {"span.tp": degrees["tp"], "span.cp": degrees["cp"], "span.ep": degrees["ep"],
                       "span.edp": degrees["edp"], "span.pp": pp, "span.dp": dp}
        for key, degree in span_degree.items():
            if key in rows:  # one placement: its rows' spans
                values[key], tags[key] = (self._span(rows[key]),), (key, rows[key])
            elif not any(d in self.active for d in SPANS[key]):  # a family the model does not place
                values[key], tags[key] = ((),) if degree == 1 else (), (key, degree)
            else:
                values[key], tags[key] = self._spans_of(degree), (key, degree)
        return Ranges(values, tags)

    def placements(self, degrees: dict[str, int]):
        """Every placement of the degrees on the axes, as span-decision -> row (the rules of
        cpsat.LayoutModel: each axis shared out exactly; torchrun's instance blocks where asked,
        checked on each prefix of the rank order, since a prefix that breaks them cannot be mended)."""
        return placements(self.space.axes, tuple(self.active), self._inside, degrees)

    def _first_placements(self, degrees: dict[str, int], cap: float) -> list[dict]:
        """The first ``cap`` + 1 placements (all of them when ``cap`` is infinite): those up to
        MAX_PLACEMENTS + 1 are kept for the process (``placements.first_placements``: the robust choice and
        the search with no overlap ask for the same degree tuples' placements again)."""
        if cap == math.inf:
            return list(self.placements(degrees))
        found = first_placements(self.space.axes, tuple(self.active), self._inside, tuple(degrees.items()))
        return list(found[:int(cap) + 1])

    def floors(self, ranges: Ranges, terms: list[str] | None = None) -> tuple[float, float]:
        """(step time, memory) floors over ``ranges``; ``terms``: only these step terms (each term is
        a time, at least 0, so a sum over some of them is a floor too)."""
        return self.step_floor(ranges, terms), self.memory_floor(ranges)

    def step_floor(self, ranges: Ranges, terms: list[str] | None = None) -> float:
        """The step time floor over ``ranges`` (``floors``)."""
        names = [name for name in TERMS if name != "tp_raw"] if terms is None else terms
        return sum(self.bounder.interval(self.steps[name], ranges)[0] for name in names)

    def memory_floor(self, ranges: Ranges, split: bool = False) -> float:
        """The memory floor over ``ranges`` (``floors``); ``split``: over every split of the layers
        (``split_memories``), not only the even one."""
        return sum(self.bounder.interval(e, ranges)[0] for e in self._memory_rule(split).values())

    def deepen(self, branch: Branch) -> None:
        """Raise the branch's floor from its cheap terms' (``branches``) to every term's."""
        key = tuple(branch.degrees[d] for d in FAMILIES)
        found = self._deep.get(key)
        if found is None:
            found = self._deep[key] = self.step_floor(self.ranges(branch.degrees))
        branch.floor, branch.floored = max(branch.floor, found), True

    # -- the branches -----------------------------------------------------------------------------
    def branches(self, prune: bool = True, split: bool = False) -> list[Branch]:
        """Every degree tuple with a placement row for each family and a micro-batch size, floored
        by its cheap terms (``deepen`` floors the rest) and those whose memory floor exceeds the
        usable HBM dropped (unless not ``prune``: then every tuple, floor 0); ``split``: the memory
        floor over every split of the layers (``split_memories``)."""
        out = []
        for combo in self._degree_tuples():
            degrees = dict(zip(FAMILIES, combo))
            if degrees["ep"] > 1 and degrees["cp"] > 1 and not self.problem.rules.expert_with_context:
                continue  # the framework's expert groups would take context ranks (Rules.expert_with_context)
            if not prune:
                if not self.ranges(degrees).empty:
                    out.append(Branch(self, degrees, 0.0))
                continue
            # a tuple's floors depend on the space alone: kept for the next call (the robust choice's);
            # memory first, since a tuple it drops needs no step floor (most tuples of a space that is
            # short of memory)
            found = self._floors.get((combo, split))
            if found is None:
                ranges = self.ranges(degrees)
                memory = math.inf if ranges.empty else self.memory_floor(ranges, split)
                step = self.step_floor(ranges, self.cheap_terms) if memory <= self.usable else math.inf
                found = self._floors[(combo, split)] = (step, memory)
            step, memory = found
            if memory <= self.usable:
                out.append(Branch(self, degrees, step))
        return out

    def _degree_tuples(self) -> list[tuple[int, ...]]:
        """Every combination of the families' candidate degrees (FAMILIES order) whose product is
        the rank count, in itertools.product's order: each family's degree divides what the
        earlier ones leave."""
        candidates = [self.degree_values.get(d, self._single(d)) for d in FAMILIES]
        out = []

        def grow(i: int, left: int, chosen: tuple):
            if i == len(candidates):
                if left == 1:
                    out.append(chosen)
                return
            for d in candidates[i]:
                if left % d == 0:
                    grow(i + 1, left // d, chosen + (d,))

        grow(0, self.space.ranks, ())
        return out

    def _single(self, family: str) -> tuple[int, ...]:
        key = "dp" if family == "edp" else family
        return self.space.degrees[key]

    def refine(self, branch: Branch, cutoff: float, split: bool = False) -> None:
        """Bound the branch's (recompute, ZeRO) plans one by one; keep those that fit and could beat
        ``cutoff``; ``split``: that fit on some split of the layers (``split_memories``)."""
        base = self.ranges(branch.degrees)
        kept = {}
        for rc, zero in itertools.product(base.values["recompute"], base.values["zero"]):
            ranges = self.ranges(branch.degrees, {"recompute": rc, "zero": zero})
            if self.memory_floor(ranges, split) <= self.usable:
                step = self.step_floor(ranges)
                if step < cutoff * (1 + SLACK):
                    kept[(rc, zero)] = step
        branch.plans = kept
        branch.floor = min(kept.values(), default=math.inf)

    def points(self, branch: Branch, most: float | None = None, split: bool = False):
        """Every point of the branch's plans (placement x plan x micro-batch size x interleave x
        HSDP), scored in NumPy chunks: None past ``most`` points or MAX_PLACEMENTS placements,
        else (the decisions' value lists, a generator of chunks). A chunk is (each point's
        position in those lists, step time lo and hi, memory, whether it keeps the rules, and
        with ``split`` a dict of arrays: ``floor``, the memory floor over every split of its layers,
        and the per-stage memory's parts (``split_parts``); else None)."""
        most = MAX_POINTS if most is None else most
        base = self.ranges(branch.degrees)
        plans = list(branch.plans)
        sizes, interleaves, hsdps = base.values["micro_batch"], base.values["interleave"], base.values["hsdp"]
        per_placement = len(plans) * len(sizes) * len(interleaves) * len(hsdps)
        cap = min(MAX_PLACEMENTS, most // per_placement) if most < math.inf else math.inf
        placements = self._first_placements(branch.degrees, cap)
        if len(placements) > cap:
            return None
        values = (placements, plans, sizes, interleaves, hsdps)
        return values, self._chunks(branch, base, values, per_placement, split)

    def _chunks(self, branch: Branch, base: Ranges, values: tuple, per_placement: int, split: bool = False):
        placements, plans, sizes, interleaves, hsdps = values
        lists = {"recompute": tuple(dict.fromkeys(rc for rc, _ in plans)),
                 "zero": tuple(dict.fromkeys(z for _, z in plans)), "micro_batch": sizes,
                 "micro_batches": base.values["micro_batches"], "interleave": interleaves, "hsdp": hsdps}
        ranged = {k: base.values[k] for k in ("tp", "cp", "ep", "pp", "edp", "dp", "ep_fold")}
        tags = {k: (k, v) for k, v in {**lists, **ranged}.items()}
        row_index = {}
        for key in placements[0] if placements else ():
            # the spans of every row of the family's degree, the same list in every branch, so
            # the factors' tables carry over from branch to branch
            degree = math.prod(placements[0][key])
            lists[key], tags[key] = self._spans_of(degree), (key, degree)
            position = self._positions(degree)
            row_index[key] = np.array([position[p[key]] for p in placements])
        plan_rc = np.array([lists["recompute"].index(rc) for rc, _ in plans])
        plan_zero = np.array([lists["zero"].index(z) for _, z in plans])
        # HSDP's rules (cpsat.LayoutModel._hsdp): ZeRO sharding, replicas across the scale-out axis,
        # shards across more than one rank inside the domain
        sharded = np.array([z != 0 for _, z in plans])
        replicable = np.array([p["span.edp"][-1] > 1 and math.prod(p["span.edp"][:-1]) > 1 for p in placements])
        counts, pp = np.array(base.values["micro_batches"]), branch.degrees["pp"]
        steps = [self.steps[name] for name in TERMS if name != "tp_raw"]
        memories = list(self.memories.values())
        split_memories = list(self.split_memories.values()) if split else []
        parts = self.split_parts if split else {}
        chunk = max(1, CHUNK_POINTS // per_placement)
        for start in range(0, len(placements), chunk):
            n = min(chunk, len(placements) - start)
            grid = np.indices((n, len(plans), len(sizes), len(interleaves), len(hsdps))).reshape(5, -1)
            index = {key: rows[start:start + n][grid[0]] for key, rows in row_index.items()}
            index.update(recompute=plan_rc[grid[1]], zero=plan_zero[grid[1]], micro_batch=grid[2],
                         micro_batches=grid[2], interleave=grid[3], hsdp=grid[4])
            values = self.points_bounder.intervals(steps + memories + split_memories + list(parts.values()), lists,
                                                   ranged, index, tags)
            step = sum(np.broadcast_to(lo, grid[0].shape) for lo, _ in values[:len(steps)])
            high = step if all(lo is hi for lo, hi in values[:len(steps)]) else \
                sum(np.broadcast_to(hi, grid[0].shape) for _, hi in values[:len(steps)])
            at = len(steps) + len(memories)
            memory = sum(np.broadcast_to(lo, grid[0].shape) for lo, _ in values[len(steps):at])
            ends = at + len(split_memories)
            any_split = None if not split else {
                "floor": sum(np.broadcast_to(lo, grid[0].shape) for lo, _ in values[at:ends]),
                **{k: np.broadcast_to(lo, grid[0].shape) for k, (lo, _) in zip(parts, values[ends:])}}
            # interleaved 1F1B runs the micro-batches in groups of pp
            rules = (np.array(interleaves)[grid[3]] == 1) | (counts[grid[2]] % pp == 0)
            rules &= ~np.array(hsdps)[grid[4]] | (sharded[grid[1]] & replicable[start + grid[0]])
            grid[0] += start
            yield grid, step, high, memory, rules, any_split

    def place(self, branch: Branch, cutoff: float, most: float | None = None) -> int:
        """Score the branch at every point (``points``): ``branch.best`` becomes its best layout
        that fits, if it could beat ``cutoff``. Were a point's interval not one number, its plans
        and placements are kept with their floors for CP-SAT instead. Skipped (the branch goes to
        CP-SAT whole) past ``most`` points (default MAX_POINTS). Returns the points scored that keep the rules
        (memory aside)."""
        branch.placed = True
        scored = self.points(branch, most) if branch.plans else None
        if scored is None:
            return 0
        (placements, plans, sizes, interleaves, hsdps), chunks = scored
        best_plan = np.full(len(plans), np.inf)         # per plan, its least point
        by_placement = np.full(len(placements), np.inf)  # per placement, its least point
        least, at, exact, counted = math.inf, None, True, 0
        for grid, step, high, memory, rules, _ in chunks:
            counted += int(rules.sum())
            ok = rules & (memory <= self.usable)
            exact = exact and bool(np.all((high - step)[ok] <= EXACT * high[ok]))
            np.minimum.at(best_plan, grid[1][ok], step[ok])
            np.minimum.at(by_placement, grid[0][ok], step[ok])
            if ok.any():
                k = int(np.flatnonzero(ok)[np.argmin(step[ok])])
                if step[k] < least:
                    least, at = float(step[k]), tuple(int(g[k]) for g in grid)
        limit = cutoff * (1 + SLACK)
        branch.plans = {plan: float(b) for plan, b in zip(plans, best_plan) if b < limit}
        branch.floor = max(branch.floor, min(branch.plans.values(), default=math.inf))
        branch.placements = [] if exact else sorted(
            ((float(f), rows) for f, rows in zip(by_placement, placements) if f < limit), key=lambda t: t[0])
        if exact and least < limit:
            i, plan, size, inter, on = at
            branch.best = self.layout(branch.degrees, placements[i], plans[plan], sizes[size], interleaves[inter],
                                      hsdps[on])
        return counted

    def robust(self, branch: Branch, cap: float) -> tuple | None | bool:
        """The branch's point that fits within step time ``cap`` and leans least on slow links for
        TP, then needs the least memory (MiB), then is fastest (cpsat.LayoutModel.prefer_robust's
        order, ties broken by step time): (lean, MiB, step, layout); None if no point qualifies;
        False if the branch has too many points to score or a point is not one number."""
        scored = self.points(branch) if branch.plans else None
        if scored is None:
            return False if branch.plans else None
        (placements, plans, sizes, interleaves, hsdps), chunks = scored
        # TP's lean on slow links: each prime factor of its degree counted by its axis's position
        lean = np.array([sum(j * sum(prime_exponents(f).values()) for j, f in enumerate(p["span.tp"]))
                         for p in placements])
        found = None
        for grid, step, high, memory, rules, _ in chunks:
            ok = rules & (memory <= self.usable) & (step <= cap)
            if not np.all((high - step)[ok] <= EXACT * high[ok]):
                return False
            if ok.any():
                key = np.lexsort((step[ok], np.floor(memory[ok] / 2**20), lean[grid[0][ok]]))[0]
                k = int(np.flatnonzero(ok)[key])
                mine = (int(lean[grid[0][k]]), int(memory[k] // 2**20), float(step[k]), tuple(int(g[k]) for g in grid))
                found = mine if found is None or mine[:3] < found[:3] else found
        if found is None:
            return None
        i, plan, size, inter, on = found[3]
        return (*found[:3], self.layout(branch.degrees, placements[i], plans[plan], sizes[size], interleaves[inter],
                                        hsdps[on]))

    def layout(self, degrees: dict[str, int], rows: dict, plan: tuple[str, int], micro_batch: int, interleave: int,
               hsdp: bool) -> Layout:
        """The layout of one point (as cpsat.LayoutModel.layout reads one from a solution)."""
        order = [rows[f"span.{d}"] for d in FAMILIES]
        edp = rows["span.edp"]
        return Layout(tp=degrees["tp"], pp=degrees["pp"], dp=degrees["edp"] * degrees["ep"], ep=degrees["ep"],
                      cp=degrees["cp"], axes=self.space.axes, placement=tuple(order), zero=plan[1],
                      recompute=plan[0], micro_batch=micro_batch, interleave=interleave, lnc=self.space.lnc,
                      dp_replicate=edp[-1] if hsdp else 1)


@functools.lru_cache(maxsize=4)  # a problem's LNCs (1 or 2), under both tables
def _bounders(problem: Problem, lnc: int) -> tuple[Bounder, PointBounder]:
    """The bounders of a problem's space at ``lnc``, kept for the process and shared by the
    problem under every overlap table (``problem`` comes with none): their caches are keyed by
    tree node and by the sets of decision values the space defines, and the trees no overlap
    table changes are the same objects under every table (terms.overlap_free), so the
    report's search with no overlap bounds only the TP term and the terms that contain it anew."""
    entries = FactorEntries()
    return Bounder(entries), PointBounder(entries)
