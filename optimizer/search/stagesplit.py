"""The best uneven pipeline split of one layout: a CP-SAT model over the layers of each stage.

Given a layout's per-stage costs (cost/stages.py), choose x_s layers for each of its p stages:
every layer on one stage, every stage within the usable HBM, the busiest stage's work as small as
it can be (the schedule's step time grows with it and with nothing else the split changes:
cost/stages.py). A layout's even split is one of the splits, so the best split is never slower.

The CP-SAT model works in integers (``SplitData``): seconds in nanoseconds, bytes rounded against
the split (each stage's bytes up, the usable HBM down). ``search/stageenum.py`` enumerates every
split of the same integers in NumPy: the referee of the tests and the baseline of
benchmarks/stage_split.py.

Determinism: one worker, a fixed seed and a budget of CP-SAT's deterministic time
(defaults.STAGE_SPLIT_DETERMINISTIC_S); the wall clock is only the safety stop, and the result
says when it bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.memory import FRAGMENTATION_DIVISOR
from trnopt.optimizer.cost.stages import StageCosts

NS = 1e9  # integer time unit: nanoseconds (ties closer than 1 ns are ties)


@dataclass(frozen=True)
class SplitData:
    """A layout's per-stage costs in integers, as both the CP-SAT model and the enumeration read them."""

    layers: int
    """L: layers to place."""
    per_layer: int
    """a: ns one more layer adds to a stage's work."""
    per_kth: int
    """d: ns one more every-k-th (fully recomputed) layer adds."""
    every: int
    """k of every-k recompute (1 when per_kth is 0)."""
    base: int
    """c: ns of a stage's work with no layer, so that work(n) = a n + d (n // k) + c (the LM head included)."""
    head: int
    """ns of the LM head and loss over a step (only the last stage runs them)."""
    layer_bytes: tuple[int, ...]
    """Per stage: bytes one more layer adds (rounded up)."""
    fixed_bytes: tuple[int, ...]
    """Per stage: bytes with no layer (rounded up), before fragmentation."""
    capacity: int
    """D (usable - reserve), rounded down, D the fragmentation divisor: a stage fits when
    (D + 1) (fixed + x layer) <= capacity (memory.py: fragmentation is 1/D of what the job holds)."""
    step_num: int = 1
    """With ``step_den`` and ``step_base``: the step in ns is step_base + ceil(step_num busiest / step_den),
    step_num / step_den = 1 + num / (den m), the schedule's step per unit of the busiest stage (cost/stages.py)."""
    step_den: int = 1
    """See ``step_num``."""
    step_base: int = 0
    """See ``step_num``: the step's terms the split does not change (DP, ZeRO-3, optimizer), in ns."""

    @property
    def stages(self) -> int:
        return len(self.layer_bytes)

    @staticmethod
    def of(costs: StageCosts) -> "SplitData":
        a, d, k, e = round(costs.per_layer * NS), round(costs.per_kth * NS), costs.every, costs.even_layers
        even_work = round(costs.even_work * NS)
        num, den = costs.bubble[1] + costs.bubble[0], costs.bubble[1]
        return SplitData(costs.layers, a, d, k, even_work - a * e - d * (e // k), round(costs.head * NS),
                         tuple(math.ceil(b) for b in costs.layer_bytes), tuple(math.ceil(b) for b in costs.fixed_bytes),
                         math.floor(FRAGMENTATION_DIVISOR * (costs.usable - costs.reserve)), num, den,
                         round(costs.even_step * NS) - -(-num * even_work // den))

    def work(self, n: int) -> int:
        """ns of one stage's work with n layers: a n + d (n // k) + c."""
        return self.per_layer * n + self.per_kth * (n // self.every) + self.base

    def bottleneck(self, split) -> int:
        """max_s t_s in ns: work(x_s) less the head on every stage but the last."""
        last = self.stages - 1
        return max(self.work(x) - (self.head if s < last else 0) for s, x in enumerate(split))

    def step(self, split) -> int:
        """The step in ns: step_base + ceil(step_num bottleneck / step_den)."""
        return self.step_base - (-self.step_num * self.bottleneck(split) // self.step_den)

    def middle_alike(self) -> bool:
        """Whether the middle stages (not the first, not the last) have the same fixed bytes and
        per-layer bytes that do not grow from one to the next (1F1B: fewer micro-batches in flight)."""
        mid = range(1, self.stages - 1)
        return (len({self.fixed_bytes[s] for s in mid}) <= 1
                and all(self.layer_bytes[s] >= self.layer_bytes[s + 1] for s in mid[:-1]))

    def fits(self, split) -> bool:
        grow = FRAGMENTATION_DIVISOR + 1
        return all(grow * (f + x * a) <= self.capacity for f, a, x in zip(self.fixed_bytes, self.layer_bytes, split))


@dataclass(frozen=True)
class Split:
    """The search's answer for one layout."""

    layers: tuple[int, ...] | None
    """Layers per stage, first to last; None when no split fits (or none was found in the budget)."""
    bottleneck: int | None
    """The busiest stage's work in ns (SplitData.bottleneck)."""
    status: str
    """CP-SAT's status: OPTIMAL (proven), FEASIBLE (the budget ended first), INFEASIBLE (no split fits), UNKNOWN."""
    stopped: str = ""
    """What ended a search that is not OPTIMAL or INFEASIBLE: "work" (the deterministic budget, the same
    on every machine) or "time" (the wall-clock safety stop); "" when it finished."""
    step: int | None = None
    """The step in ns (SplitData.step) of the chosen layout on this split."""
    choice: int = 0
    """Which of the layouts searched together (``best_joint``) the split is for."""


def best_split(data: SplitData, deterministic_limit: float = defaults.STAGE_SPLIT_DETERMINISTIC_S,
               time_limit: float = defaults.STAGE_SPLIT_TIME_LIMIT_S, seed: int = defaults.SEED,
               hint: tuple[int, ...] | None = None) -> Split:
    """The split of one layout with the least step that fits (``best_joint`` of that layout alone)."""
    return best_joint([data], deterministic_limit, time_limit, seed, hint)


def best_joint(datas: list[SplitData], deterministic_limit: float = defaults.STAGE_SPLIT_DETERMINISTIC_S,
               time_limit: float = defaults.STAGE_SPLIT_TIME_LIMIT_S, seed: int = defaults.SEED,
               hint: tuple[int, ...] | None = None) -> Split:
    """The layout (of ``datas``, layouts of one model with the same pipeline degree) and split with the
    least step that fits (CP-SAT, proven OPTIMAL within the budget). The step of a layout grows with its
    busiest stage alone, so for one layout this is the least bottleneck."""
    from ortools.sat.python import cp_model  # OR-Tools, imported when a command needs it

    # data
    L, p = datas[0].layers, datas[0].stages
    assert all(d.layers == L and d.stages == p for d in datas), "layouts of one model and pipeline degree"
    last = p - 1
    grow = FRAGMENTATION_DIVISOR + 1

    model = cp_model.CpModel()
    # variables: layers of each stage (at least one: every stage runs a piece of the model)
    x = [model.new_int_var(1, L - last, f"layers_{s}") for s in range(p)]
    # which layout runs (one of them)
    use = [model.new_bool_var(f"layout_{i}") for i in range(len(datas))]
    # each layout's busiest stage (ns), and the step of the one that runs (ns)
    busiest = [model.new_int_var(d.work(1) - d.head, d.work(L), f"busiest_{i}") for i, d in enumerate(datas)]
    step = model.new_int_var(min(d.step_base for d in datas), max(d.step_base + d.step_num * d.work(L) for d in datas),
                             "step")

    # constraints
    # every layer runs on exactly one stage, and exactly one layout runs
    model.add(sum(x) == L)
    model.add_exactly_one(use)
    for i, d in enumerate(datas):
        for s in range(p):
            # a stage's bytes, with the allocator's fragmentation, fit in the usable HBM of the layout that runs
            model.add(grow * (d.fixed_bytes[s] + d.layer_bytes[s] * x[s]) <= d.capacity).only_enforce_if(use[i])
            # the busiest stage is at least as busy as each: the cost model's a x + d (x // k) + c, and only
            # the last stage runs the LM head
            work = d.per_layer * x[s] + d.base - (d.head if s < last else 0)
            if d.per_kth:  # every k-th layer recomputes its forward in full
                full = model.new_int_var(0, L // d.every, f"full_{i}_{s}")
                model.add_division_equality(full, x[s], d.every)
                work += d.per_kth * full
            model.add(busiest[i] >= work)
        # the step of the layout that runs: base + (num / den) busiest, rounded up
        model.add(d.step_den * (step - d.step_base) >= d.step_num * busiest[i]).only_enforce_if(use[i])
    if all(d.middle_alike() for d in datas):
        # symmetry: the middle stages take the same work for the same layers, and a later one holds at
        # least what an earlier one can (fewer micro-batches in flight), so sorting their layers in
        # rising order keeps any split feasible and its bottleneck unchanged
        for s in range(1, last - 1):
            model.add(x[s] <= x[s + 1])

    # objective: the step
    model.minimize(step)
    if hint is not None and len(hint) == p and sum(hint) == L and min(hint) >= 1:
        for var, value in zip(x, hint):  # the even split: a good first solution when it fits
            model.add_hint(var, value)

    # solve
    solver = cp_model.CpSolver()
    # one worker and a seed: the same search on every machine
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    # the work budget ends the search, never the clock (a count of CP-SAT's own work)
    solver.parameters.max_deterministic_time = deterministic_limit
    # the wall clock only as a safety stop, reported as such
    solver.parameters.max_time_in_seconds = time_limit
    # no LP relaxation: the layout choice enters by implications, whose relaxation is weak, and
    # propagation over these few bounded integers proves the optimum in fewer CPU-seconds
    # (benchmarks/stage_split.py: the 4-layout llama3-8b case 12.9 -> 6.6 ms)
    solver.parameters.linearization_level = 0
    status = solver.solve(model)
    name = solver.status_name(status)
    stopped = ""
    if name in ("FEASIBLE", "UNKNOWN"):
        stopped = "work" if solver.deterministic_time >= deterministic_limit * (1 - 1e-9) else "time"
    if name in ("OPTIMAL", "FEASIBLE"):
        split = tuple(solver.value(v) for v in x)
        choice = next(i for i, u in enumerate(use) if solver.value(u))
        d = datas[choice]
        return Split(split, d.bottleneck(split), name, stopped, d.step(split), choice)
    return Split(None, None, name, stopped)


def split_layout(problem, evaluation) -> tuple[object, dict]:
    """(the evaluation of ``evaluation``'s layout on its best uneven split, what was found): the
    chosen layout's pipeline split by ``best_split``. The layout is kept as it is when it has no
    pipeline, cannot be split (stages.split_problem), no split fits, or the even split is the best;
    the dict says which, with the even and the split step times, for the report and the JSON."""
    from dataclasses import replace

    from trnopt.optimizer.cost.stages import split_problem, stage_costs

    layout = evaluation.layout
    if layout.pp == 1:
        return evaluation, {"status": "NO_PIPELINE", "note": "the chosen layout has no pipeline (PP1): nothing to split"}
    if why := split_problem(problem.workload, layout):
        return evaluation, {"status": "UNSUPPORTED", "note": why}
    costs = stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
    even = costs.even_split()
    found = best_split(SplitData.of(costs), hint=even)
    info = {"status": found.status, "even_split": list(even), "even_step_s": costs.even_step}
    if found.stopped:
        info["stopped_by"] = "the work budget" if found.stopped == "work" else "the time limit (may differ elsewhere)"
    if found.layers is None:
        return evaluation, {**info, "note": "no split of the chosen layout fits every stage in the usable HBM "
                                            "(the per-stage memory puts the embedding and the output on the end "
                                            "stages); the even layout is shown"}
    info.update(layers=list(found.layers), step_s=costs.step(found.layers))
    if costs.step(found.layers) >= costs.even_step and costs.fits(even):
        return evaluation, {**info, "note": f"the even split {','.join(map(str, even))} is the best "
                                            f"({found.status.lower()})"}
    split = problem.evaluate(replace(layout, stage_layers=found.layers))
    return split, {**info, "note": f"layers per stage {','.join(map(str, found.layers))}: {split.step.total:.3f} s "
                                   f"against {costs.even_step:.3f} s with the even split "
                                   f"{','.join(map(str, even))} ({found.status.lower()})"}


def split_runners_up(problem, best, runners_up) -> list[dict]:
    """Each runner-up with pipeline stages on its best split (``split_layout``), for the report: its
    layout, its even and its split step, and whether the split makes it faster than ``best`` (the
    answer is not changed: the search compared the layouts with even stages)."""
    out = []
    for r in runners_up:
        if r.layout.pp == 1:
            continue
        split, info = split_layout(problem, r)
        if "layers" not in info:
            continue
        out.append({"layout": r.layout.describe(), "layers": info["layers"], "even_step_s": r.step.total,
                    "step_s": split.step.total, "beats_answer": problem.score(split) < problem.score(best)})
    return out
