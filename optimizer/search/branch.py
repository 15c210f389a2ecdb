"""Branch and bound over degrees, memory plans and placements, CP-SAT solving each promising placement exactly.

Why. One CP-SAT model of the whole space (cpsat.LayoutModel) proves small spaces at once,
but its step time is a sum of products of tables, whose linear relaxation bounds the step
near 0: on mixture-of-experts models and at 100,000 chips it found layouts and proved
nothing (gap 100% at its limit). Most of that space is ruled out by arithmetic alone: a
degree tuple whose compute or memory cannot beat the best layout found needs no search.

Method (best-first branch and bound; Land and Doig 1960, the form in Nemhauser and
Wolsey, *Integer and Combinatorial Optimization*, 1988, ch. II.4). One queue holds every
LNC's branches, lowest floor first; what comes up is taken one level deeper:
1. A branch is a degree tuple (tp, cp, ep, edp, pp) whose product is the rank count. Its
   floor is a lower bound of the step time over every layout with those degrees
   (search/bounds.py: interval arithmetic on the cost model's own trees, each decision
   ranging over what the degrees leave it: the placement rows of each family's degree,
   the micro-batch sizes that divide the batch, ...). A tuple whose memory floor exceeds
   the usable HBM is dropped.
2. Refined: its (recompute, ZeRO) plans are bounded one by one, in step time and memory;
   a plan that cannot fit or cannot beat the cutoff is dropped, and the branch's floor
   becomes its best plan's.
3. Placed: every point of the branch (placement x plan x micro-batch size x interleave,
   HSDP ranging) is bounded at once in NumPy, memory too; each placement with a point that
   fits and could beat the cutoff goes into the queue on its own, at its least point's
   floor. (A branch with more points than MAX_POINTS goes in whole.)
4. Solved: a placement that comes up is solved by the same LayoutModel with the tuple's
   degrees and the placement's rows fixed, its plans limited to the surviving ones and
   its objective capped at the cutoff (``LayoutModel.restricted``); CP-SAT then chooses
   the memory plan, micro-batch size, interleave and HSDP under all of the model's rules.
The cutoff is the k-th best objective found, k = 1 + the runner-ups asked for, each from a
different (LNC, degree tuple). The search stops when the least floor left is not below it.

Why the split loses nothing. Every layout of the space has exactly one LNC, degree tuple,
(recompute, ZeRO) plan and placement. Whatever is dropped or left in the queue has a floor
not below the cutoff, and the floors bound every layout beneath them from below, so none
of those layouts would enter the best k. What is solved is the monolithic model with
some literals fixed: the same integer objective and rules, so its optimum is the
monolithic model's optimum over that part, and the best of the parts is the monolithic
optimum (the brute-force referee, tests/optimizer/search/test_solver.py, checks this on
enumerable spaces; tests/optimizer/search/test_branch.py checks that the floors never
exceed a layout's step time). A time limit leaves parts unsettled: the gap is then
against the least of their floors and CP-SAT bounds.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.steptime import TERMS
from trnopt.optimizer.model.layout import Layout, every_nth
from trnopt.optimizer.search.bounds import Bounder, PointBounder, Ranges
from trnopt.optimizer.search.cpsat import PLACED, LayoutModel, check_agreement
from trnopt.optimizer.search.solver import STATUS, solver_for
from trnopt.optimizer.model.placement import instance_prefix
from trnopt.optimizer.search.space import block_step, divisors

# Families in the order of a degree tuple (edp: the expert-data replicas, dp // ep)
FAMILIES = PLACED
SLACK = 1e-6  # relative: the cutoff lets through layouts that tie with it within float noise
MAX_POINTS = 2_000_000   # points, and placements, bounded one by one before a branch is solved whole;
MAX_PLACEMENTS = 20_000  # past these the bounding would cost more than the solve it might save
CHUNK_POINTS = 100_000  # points bounded in one NumPy pass (a few MB per node of the trees)


@dataclass
class Branch:
    """One degree tuple of one space (LNC) and what is known of it."""

    space: SpaceBounds
    degrees: dict[str, int]
    floor: float                                  # seconds: no layout of the branch is faster
    plans: dict[tuple[str, int], float] | None = None  # once refined: (recompute, zero) plans left -> floor
    placed: bool = False            # its points were bounded (or there were too many to)
    placements: list | None = None  # once placed: (floor, rows) of each placement that could beat it, best first


@dataclass
class BranchResult:
    """The best layouts found, one per degree tuple, best first, and what was proven."""

    found: list[tuple[float, Evaluation]] = field(default_factory=list)  # (score, evaluation)
    bound: float = math.inf   # seconds: no layout of the space is faster
    proven: bool = False      # the search ended by its bounds: found holds the best k (all, if fewer)
    branches: int = 0         # degree tuples bounded
    solves: int = 0           # of them, solved with CP-SAT
    rounding: float = 0.0     # seconds: the best's integer objective's rounding bound


class SpaceBounds:
    """The branches of one space (one LNC's LayoutModel) and their bounds."""

    def __init__(self, lm: LayoutModel):
        self.lm, self.space, self.problem = lm, lm.space, lm.problem
        self.bounder = Bounder()
        self.points = PointBounder()
        self.usable = self.problem.target.chip.hbm_bytes * (1 - self.problem.headroom)
        self._rows = self._rows_by_degree()
        self._spans: dict[tuple, tuple] = {}
        self._by_degree: dict[int, list] = {}
        self._position: dict[int, dict] = {}

    # -- ranges of the decisions a branch leaves open -------------------------------------------
    def _rows_by_degree(self) -> dict[int, list[tuple[int, ...]]]:
        """The placement rows (a factor per axis), grouped by their product."""
        groups: dict[int, list] = {}
        for row in itertools.product(*self.lm.axis_divisors):
            groups.setdefault(math.prod(row), []).append(row)
        return groups

    def _span(self, row: tuple[int, ...]) -> tuple:
        found = self._spans.get(row)
        if found is None:
            found = self._spans[row] = tuple((a, n) for a, n in zip(self.space.axes, row) if n > 1)
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
        interleaves = (1,) + tuple(v for v in self.lm.interleaves if v > 1 and pp > 1 and space.stages_ok(pp, v)
                                   and any(m % pp == 0 for m in counts))
        recompute = tuple(rc for rc in self.lm.recompute_values
                          if not every_nth(rc) or math.ceil(layers / pp) % every_nth(rc) == 0)
        values = {"tp": (degrees["tp"],), "cp": (degrees["cp"],), "ep": (degrees["ep"],), "pp": (pp,),
                  "edp": (degrees["edp"],), "dp": (dp,), "micro_batch": sizes, "interleave": interleaves,
                  "recompute": recompute, "zero": self.lm.zero_values,
                  "hsdp": (False,) if degrees["ep"] > 1 else self.lm.hsdp_values}
        for key, value in fixed.items():
            values[key] = (value,) if value in values[key] else ()
        values["micro_batches"] = tuple(batch // (dp * b) for b in values["micro_batch"])
        tags = {key: (key, v) for key, v in values.items()}
        span_degree = {"span.tp": degrees["tp"], "span.cp": degrees["cp"], "span.ep": degrees["ep"],
                       "span.edp": degrees["edp"], "span.pp": pp, "span.dp": dp}
        for key, degree in span_degree.items():
            if key in rows:  # one placement: its rows' spans
                values[key], tags[key] = (self._span(rows[key]),), (key, rows[key])
            elif self.lm.spans[key][0] is None:  # a family the model does not place
                values[key], tags[key] = ((),) if degree == 1 else (), (key, degree)
            else:
                values[key], tags[key] = self._spans_of(degree), (key, degree)
        return Ranges(values, tags)

    def placements(self, degrees: dict[str, int]):
        """Every placement of the degrees on the axes, as span-decision -> row (the rules of
        cpsat.LayoutModel: each axis shared out exactly; torchrun's instance blocks where asked,
        checked on each prefix of the rank order, since a prefix that breaks them cannot be mended)."""
        axes, ones = self.space.axes, (1,) * len(self.space.axes)
        families = [d for d in FAMILIES if degrees[d] > 1]
        inside = instance_prefix(axes, self.problem.target.chips_per_instance) if self.problem.instance_blocks \
            else None

        def extend(i: int, left: tuple[int, ...], chosen: list, blocks):
            if i == len(families):
                rows = dict(zip(families, chosen))
                if not self.lm.canonical({d: rows.get(d, ones) for d in self.lm.active}):
                    return  # the mirror of another placement (identical axes), which the model excludes
                ep, edp = rows.get("ep", ones), rows.get("edp", ones)
                yield {"span.tp": rows.get("tp", ones), "span.cp": rows.get("cp", ones), "span.ep": ep,
                       "span.edp": edp, "span.pp": rows.get("pp", ones),
                       "span.dp": tuple(a * b for a, b in zip(ep, edp))}
                return
            # the last family takes what is left, which must be its degree
            rows = [left] if i == len(families) - 1 else _rows_within(left, degrees[families[i]])
            for row in rows:
                if i == len(families) - 1 and math.prod(row) != degrees[families[i]]:
                    continue
                after = block_step(inside, blocks, row) if inside is not None else None
                if inside is not None and after is None:
                    continue
                yield from extend(i + 1, tuple(n // r for n, r in zip(left, row)), chosen + [row], after)

        yield from extend(0, tuple(a.size for a in axes), [], ((1,) * len(axes), False))

    def floors(self, ranges: Ranges) -> tuple[float, float]:
        """(step time, memory) floors over ``ranges``."""
        step = sum(self.bounder.interval(self.lm.steps[name], ranges)[0] for name in TERMS if name != "tp_raw")
        memory = sum(self.bounder.interval(e, ranges)[0] for e in self.lm.memories.values())
        return step, memory

    # -- the branches -----------------------------------------------------------------------------
    def branches(self) -> list[Branch]:
        """Every degree tuple with a placement row for each family and a micro-batch size, floored."""
        candidates = [self.lm.degree_values.get(d, self._single(d)) for d in FAMILIES]
        out = []
        for combo in itertools.product(*candidates):
            if math.prod(combo) != self.space.ranks:
                continue
            degrees = dict(zip(FAMILIES, combo))
            ranges = self.ranges(degrees)
            if ranges.empty:
                continue
            step, memory = self.floors(ranges)
            if memory <= self.usable:
                out.append(Branch(self, degrees, step))
        return out

    def _single(self, family: str) -> tuple[int, ...]:
        key = "dp" if family == "edp" else family
        return self.space.degrees[key]

    def refine(self, branch: Branch, cutoff: float) -> None:
        """Bound the branch's (recompute, ZeRO) plans one by one; keep those that fit and could beat ``cutoff``."""
        base = self.ranges(branch.degrees)
        kept = {}
        for rc, zero in itertools.product(base.values["recompute"], base.values["zero"]):
            step, memory = self.floors(self.ranges(branch.degrees, {"recompute": rc, "zero": zero}))
            if memory <= self.usable and step < cutoff * (1 + SLACK):
                kept[(rc, zero)] = step
        branch.plans = kept
        branch.floor = min(kept.values(), default=math.inf)

    def place(self, branch: Branch, cutoff: float) -> None:
        """Bound the branch at every point (placement x plan x micro-batch size x interleave,
        HSDP ranging) at once; keep the plans with a point that fits and could beat ``cutoff``,
        and raise the floor to the least such point's. Skipped (the branch goes to CP-SAT as it
        is) past MAX_POINTS points."""
        branch.placed = True
        base = self.ranges(branch.degrees)
        plans = list(branch.plans)
        if not plans:
            return
        sizes, interleaves = base.values["micro_batch"], base.values["interleave"]
        per_placement = len(plans) * len(sizes) * len(interleaves)
        most = min(MAX_PLACEMENTS, MAX_POINTS // per_placement)
        placements = list(itertools.islice(self.placements(branch.degrees), most + 1))
        if len(placements) > most:
            return
        # each point's fixed decisions, as positions in these lists
        lists = {"recompute": tuple(dict.fromkeys(rc for rc, _ in plans)),
                 "zero": tuple(dict.fromkeys(z for _, z in plans)),
                 "micro_batch": sizes, "micro_batches": base.values["micro_batches"], "interleave": interleaves}
        ranged = {k: base.values[k] for k in ("tp", "cp", "ep", "pp", "edp", "dp", "hsdp")}
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
        counts, pp = np.array(base.values["micro_batches"]), branch.degrees["pp"]
        steps = [self.lm.steps[name] for name in TERMS if name != "tp_raw"]
        memories = list(self.lm.memories.values())
        best = np.full(len(plans), np.inf)         # per plan, its least point
        by_placement = np.full(len(placements), np.inf)  # per placement, its least point
        chunk = max(1, CHUNK_POINTS // per_placement)
        for start in range(0, len(placements), chunk):
            n = min(chunk, len(placements) - start)
            grid = np.indices((n, len(plans), len(sizes), len(interleaves))).reshape(4, -1)
            index = {key: rows[start:start + n][grid[0]] for key, rows in row_index.items()}
            index.update(recompute=plan_rc[grid[1]], zero=plan_zero[grid[1]], micro_batch=grid[2],
                         micro_batches=grid[2], interleave=grid[3])
            values = self.points.intervals(steps + memories, lists, ranged, index, tags)
            step = sum(np.broadcast_to(lo, grid[0].shape) for lo, _ in values[:len(steps)])
            memory = sum(np.broadcast_to(lo, grid[0].shape) for lo, _ in values[len(steps):])
            # interleaved 1F1B runs the micro-batches in groups of pp
            ok = (np.array(interleaves)[grid[3]] == 1) | (counts[grid[2]] % pp == 0)
            ok &= memory <= self.usable
            np.minimum.at(best, grid[1][ok], step[ok])
            np.minimum.at(by_placement, start + grid[0][ok], step[ok])
        limit = cutoff * (1 + SLACK)
        branch.plans = {plan: float(b) for plan, b in zip(plans, best) if b < limit}
        branch.floor = max(branch.floor, min(branch.plans.values(), default=math.inf))
        branch.placements = sorted(((float(f), rows) for f, rows in zip(by_placement, placements) if f < limit),
                                   key=lambda t: t[0])


def search(spaces: list[SpaceBounds], deadline: float, keep: int = 1, cutoff: float = math.inf, seed: int = 0,
           deterministic_limit: float | None = None, known: tuple[Layout, ...] = ()) -> BranchResult:
    """The best ``keep`` layouts of distinct (LNC, degree tuple) branches of ``spaces`` that beat
    ``cutoff`` (seconds), by ``deadline``: one queue for every LNC, so the time goes where the
    floors are lowest. ``known`` layouts (the greedy hint) are incumbents from the start; their
    branches are still searched."""
    problem = spaces[0].problem
    result = BranchResult()
    branches = [b for s in spaces for b in s.branches()]
    result.branches = len(branches)
    best: dict[tuple, tuple[float, Evaluation, float]] = {}  # branch key -> (score, evaluation, rounding)

    def offer(e: Evaluation, rounding: float) -> None:
        key, score = _key(e.layout), problem.score(e)
        if key not in best or score < best[key][0]:
            best[key] = (score, e, rounding)

    def limit() -> float:  # the k-th best score found, or the cutoff
        scores = sorted(s for s, _, _ in best.values())
        return min(cutoff, scores[keep - 1] if len(scores) >= keep else math.inf)

    for layout in known:
        e = problem.evaluate(layout)
        if e.fits and problem.score(e) < cutoff:
            offer(e, 0.0)
    # the queue holds branches, and once a branch is placed, its placements: (floor, count, branch, rows)
    queue = [(b.floor, i, b, None) for i, b in enumerate(branches)]
    heapq.heapify(queue)
    count = itertools.count(len(queue))
    unsettled = math.inf  # a bound on the branch a time limit left unsettled
    while queue and queue[0][0] < limit() * (1 + SLACK):
        if time.perf_counter() >= deadline:
            unsettled = queue[0][0]
            break
        floor, _, branch, rows = heapq.heappop(queue)
        bounds = branch.space
        if rows is None and branch.plans is None:
            bounds.refine(branch, limit())
            if branch.plans:
                heapq.heappush(queue, (branch.floor, next(count), branch, None))
            continue
        if rows is None and not branch.placed:
            bounds.place(branch, limit())
            # each placement that could beat the cutoff is solved on its own; a branch with too
            # many to bound goes to CP-SAT whole
            for f, r in branch.placements if branch.placements is not None else [(branch.floor, None)]:
                if branch.plans:
                    heapq.heappush(queue, (f, next(count), branch, r))
            continue
        lm = bounds.lm
        model = lm.restricted(branch.degrees, branch.plans, limit() * (1 + SLACK), rows)
        # one worker: a branch's model is small, and the portfolio's start-up cost more than
        # it saved on them (benchmarks/solver_scaling.py); deterministic for a seed besides
        solver = solver_for(max(0.1, deadline - time.perf_counter()), 1, seed,
                            deterministic_limit=deterministic_limit)
        # no probing in presolve: on these small models it cost more than it pruned (the 43 branch
        # solves of deepseek-v3 on 4 trn2u: 38.2 s with it, 30.3 s without)
        solver.parameters.cp_model_probing_level = 0
        status = STATUS[solver.solve(model)]
        result.solves += 1
        if status in ("OPTIMAL", "FEASIBLE"):
            e = problem.evaluate(lm.layout(solver))
            check_agreement(lm, solver, e)
            offer(e, lm.objective.error(solver.value) * lm.objective_unit)
        if status not in ("OPTIMAL", "INFEASIBLE"):  # the limit ended this solve
            unsettled = max(floor, solver.best_objective_bound * lm.objective_unit)
            break
    ranked = sorted(best.values(), key=lambda t: t[0])[:keep]
    result.found = [(score, e) for score, e, _ in ranked]
    result.rounding = ranked[0][2] if ranked else 0.0
    left = min(unsettled, queue[0][0] if queue else math.inf)
    result.bound = min(left, ranked[0][0]) if ranked else left
    result.proven = left >= limit() * (1 + SLACK)
    return result


@functools.lru_cache(maxsize=65536)
def _rows_within(left: tuple[int, ...], degree: int) -> tuple[tuple[int, ...], ...]:
    """Every row (a factor per axis) dividing ``left`` axis by axis whose product is ``degree``."""
    rest = [math.prod(left[j:]) for j in range(len(left) + 1)]
    out = []

    def grow(j: int, need: int, row: tuple):
        if j == len(left):
            out.append(row)
            return
        for factor in divisors(math.gcd(left[j], need)):
            if rest[j + 1] % (need // factor) == 0:
                grow(j + 1, need // factor, row + (factor,))

    grow(0, degree, ())
    return tuple(out)


def _key(layout: Layout) -> tuple[int, ...]:
    return (layout.lnc, layout.tp, layout.cp, layout.ep, layout.dp // layout.ep, layout.pp)
