"""The best layout and uneven pipeline split together: every layout that could beat the best
(layout, split) found is split exactly, so the answer is proven over both, or its gap is given.

Why a split bound suffices. A layout with p stages and 1F1B or GPipe has, on any split,
    step(split) = step(even) + f (max_s t_s - W),  f = 1 + num / (den m)   (cost/stages.py),
t_s = work(x_s) less the LM head on every stage but the last, W = work(ceil(L / p)) the even
split's busiest stage. Some stage holds at least ceil(L / p) layers (pigeonhole), and work only
grows with the layers (a, d >= 0), so that stage takes at least W - head, and
    step(split) >= step(even) - f head = step(even) - (m + num / den) head_seconds(tp, cp, b),
head_seconds the LM head and loss of one micro-batch (cost/compute.py): a layout gains at most
its LM head's share of the pipeline from any split. The floor needs the layout's even step
time, which the branch and bound's trees give for every point of a degree tuple at once in
NumPy (search/spacebounds.py, the points of ``SpaceBounds.place``), and m, b, tp and cp, which
the point fixes. The even step is the cost model's for the point's own memory plan
(recompute, ZeRO stage, micro-batch size: decisions of the point, never chosen by memory),
so the floor holds whether or not the point's even split fits the HBM.

Method. The incumbent is the chosen layout on its best split. Every degree tuple with a pipeline
whose even floor, less the largest head share over its micro-batch sizes, is below the
incumbent is refined and scored at every point; each point that may fit on some split (the
memory rule below), runs one stage a rank and whose floor above is below the incumbent is a
candidate. Candidates are taken floor
first; each one's per-stage costs (cost/stages.py) give its exact least split
(search/stagebottleneck.py), and one that beats the incumbent is solved by CP-SAT
(search/stagesplit.py), which proves its split and becomes the incumbent. The search ends when
the least floor left is not below the incumbent: no layout and split of the space beats it.
A layout that cannot be split gains nothing (its floor is its step), and the branch and bound
proved none is faster than its optimum with even stages: its degree tuples without a pipeline
are skipped when the incumbent is not slower than that.

The joint space. A layout that cannot be split (no pipeline, interleaved stages, a model whose
layers are not all alike) is there as it is, with even stages; a layout that can, on each
split of its layers whose every stage fits the HBM by the per-stage memory of cost/stages.py
(the even split among them), as ``split_layout`` (search/stagesplit.py) splits the chosen one.

The memory rule. A layout whose even split does not fit the HBM may still fit on an uneven
split (a stage lighter where it holds more micro-batches in flight, or the logits). For a
layout that can be split, degree tuples, plans and points are dropped only by a floor on the
fullest stage over EVERY split (cost/stages.py ``split_memory_terms``: the stages' bytes add up
to p times the layout's state, buffers and working set plus at least L layers' activations of
one micro-batch and the logits, and the fullest stage holds at least the mean), which never
drops a layout with a fitting split. Each point the floor keeps and the even rule drops is then
screened in NumPy by the per-stage memory itself (cost/stages.py ``fits_some_split``: every
stage holds a layer and the stages' layer capacities add up to L, the test of
search/stagebottleneck.py with no bound on the step, rounded in the point's favour), and
``least_bottleneck`` decides exactly whether a split fits and its least step. A layout that
cannot be split keeps the even rule (it runs as it is).

Scope: every layout of the space on every split of its layers (``JointResult.scope``). The
joint search starts from the branch and bound's answer with even stages: when no layout's
even split fits, ``solve`` reports the space infeasible before the joint search runs.

Determinism: counts bound the work (points scored, layouts split, CP-SAT's deterministic
time per solve), never the clock; a budget that ends the search leaves the gap against the
least floor left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.compute import head_seconds
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.pipeline import bubble_den, bubble_num
from trnopt.optimizer.cost.stages import fits_some_split, split_problem, stage_costs
from trnopt.optimizer.model.schedules import default_schedule
from trnopt.optimizer.search.spacebounds import SLACK, SpaceBounds
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.search.stagebottleneck import least_bottleneck
from trnopt.optimizer.search.stagesplit import SplitData, best_split

SCOPE = ("every layout of the space on every split of its layers (a layout whose even split does not fit "
         "the usable HBM included)")


@dataclass
class JointResult:
    """The best (layout, split) of a space with pipeline stages, and what was proven."""

    best: Evaluation | None
    """The best layout on its best split (``stage_layers`` set when it has stages), evaluated by the cost
    model; None while nothing is found."""
    step: float
    """Its step time, seconds."""
    bound: float
    """Seconds: no layout of the scope on any split is faster (``step`` when proven)."""
    proven: bool
    """The search ended by its bounds: ``best`` is optimal over the scope."""
    stopped: str = ""
    """"work" when a budget ended the search first (the same on any machine); "" otherwise."""
    candidates: int = 0
    """Layouts whose floor was below the incumbent when their degree tuple was scored."""
    split: int = 0
    """Of them, layouts whose per-stage costs were computed and least split found."""
    solves: int = 0
    """CP-SAT solves of a split (each layout that beat the incumbent)."""
    points: int = 0
    """Points scored in NumPy (the degree tuples' points, as the branch and bound scores them)."""
    scope: str = SCOPE
    """What the proof covers."""

    @property
    def gap(self) -> float:
        return 0.0 if self.proven else max(0.0, (self.step - self.bound) / self.step)


@dataclass(frozen=True)
class JointBudget:
    """The work the joint search may do before it stops with its gap: counts, never seconds."""

    points: int = defaults.JOINT_POINTS
    """Points scored in NumPy."""
    layouts: int = defaults.JOINT_LAYOUTS
    """Layouts whose per-stage costs are computed."""
    per_solve_s: float = defaults.STAGE_SPLIT_DETERMINISTIC_S
    """CP-SAT deterministic seconds per split solve."""


def head_share(problem, lnc: int, tp: int, cp: int, pp: int, micro_batch: int, micro_batches: int) -> float:
    """f head = (m + num / den) head_seconds(tp, cp, b): the most any split of a 1F1B layout with these
    degrees saves over its even split (module docstring), seconds."""
    schedule = default_schedule(1)
    f = bubble_num(schedule, pp) / bubble_den(schedule, 1)
    return (micro_batches + f) * head_seconds(problem.workload, problem.target, lnc, tp, cp, micro_batch)


def joint_optimum(problem, incumbent: Evaluation | None, even_optimum: float, budget: JointBudget = JointBudget(),
                  bounds_by_lnc: dict | None = None) -> JointResult | None:
    """The best (layout, split) of ``problem``'s step-time space (module docstring); None when no layout
    and split of the scope fits. ``incumbent``: a member of the joint space (a layout that cannot be
    split, or a split that fits every stage), or None; ``even_optimum``: the branch and bound's proven
    least step with even stages, which no layout that cannot be split beats; ``bounds_by_lnc``: its
    SpaceBounds by LNC, whose cached floors carry over."""
    mdl = problem.workload.model
    splittable = not (mdl.moe is not None and mdl.moe.dense_layers)  # stages.split_problem's model rule
    result = JointResult(incumbent, incumbent.step.total if incumbent else math.inf, 0.0, False)
    limit = result.step * (1 + SLACK)
    # layouts that cannot be split count at their even step: none is below the even optimum
    even_too = limit > even_optimum * (1 + SLACK)
    reserve = problem.target.runtime_reserve_bytes
    found = []  # (floor, order, bounds, degrees, the point's value lists, the point)
    unsettled = math.inf  # the least floor of a degree tuple the points budget left unscored
    for lnc in sorted(problem.lnc_values):
        bounds = (bounds_by_lnc or {}).get(lnc) or SpaceBounds(Space(problem, lnc))
        # the memory rule: a layout that can be split is dropped only when no split fits (``split_memories``)
        for branch in bounds.branches(split=splittable):
            d = branch.degrees
            if d["pp"] == 1 and not even_too:
                continue
            dp, batch = d["ep"] * d["edp"], problem.workload.training.global_batch
            # the micro-batch sizes of the tuple, in SpaceBounds.ranges' order (its points' index)
            sizes = tuple(b for b in bounds.space.micro_batches if batch % (dp * b) == 0)
            gains = np.array([head_share(problem, lnc, d["tp"], d["cp"], d["pp"], b, batch // (dp * b))
                              if d["pp"] > 1 and splittable else 0.0 for b in sizes])
            most = float(gains.max(initial=0.0))
            if branch.floor - most >= limit:
                continue
            if result.points >= budget.points:  # out of budget: the tuple's cheap floor bounds it
                unsettled, result.stopped = min(unsettled, branch.floor - most), "work"
                continue
            bounds.deepen(branch)
            if branch.floor - most >= limit:
                continue
            bounds.refine(branch, limit + most, split=splittable)
            if not branch.plans or branch.floor - most >= limit:
                continue  # no plan fits or could beat the incumbent
            scored = bounds.points(branch, budget.points - result.points, split=splittable)
            if scored is None:  # more points than the budget has left
                unsettled, result.stopped = min(unsettled, branch.floor - most), "work"
                continue
            values, chunks = scored
            counts = np.array([batch // (dp * b) for b in values[2]])  # micro-batches of each size
            interleaved = np.array(values[3]) > 1
            for grid, step, _, memory, rules, any_split in chunks:
                result.points += grid.shape[1]
                # interleaved stages cannot be split: their floor is their step, their memory the even split's
                floor = step - np.where(interleaved[grid[3]], 0.0, gains[grid[2]])
                fits = memory <= bounds.usable
                if splittable and d["pp"] > 1:  # some split may fit: the floor over every split, then the stages'
                    maybe = rules & ~fits & ~interleaved[grid[3]] & (any_split["floor"] <= bounds.usable) & (
                        floor < limit)
                    if maybe.any():
                        at = np.flatnonzero(maybe)
                        maybe[at] = fits_some_split({k: v[at] for k, v in any_split.items()}, mdl, d["pp"],
                                                    counts[grid[2][at]], bounds.usable, reserve)
                    fits |= maybe
                keep = rules & fits & (floor < limit)
                for k in np.flatnonzero(keep):
                    found.append((float(floor[k]), len(found), bounds, d, values, tuple(int(g[k]) for g in grid)))
    found.sort(key=lambda t: t[:2])
    result.candidates = len(found)
    left = math.inf  # the least floor of a candidate the layouts budget left unsplit
    for floor, _, bounds, d, values, at in found:
        if floor >= result.step * (1 + SLACK):
            break
        if result.split >= budget.layouts:
            left, result.stopped = floor, "work"
            break
        placements, plans, sizes, interleaves, hsdps = values
        i, plan, size, inter, on = at
        layout = bounds.layout(d, placements[i], plans[plan], sizes[size], interleaves[inter], hsdps[on])
        if layout.pp == 1 or split_problem(problem.workload, layout):
            evaluation = problem.evaluate(layout)  # the layout as it is, with even stages
        else:
            costs = stage_costs(problem.workload, layout, problem.target, problem.headroom, problem.overlap)
            data = SplitData.of(costs)
            result.split += 1
            least = least_bottleneck(data)
            if least is None or costs.step(least[1]) >= result.step * (1 - SLACK):
                continue
            split = _proven_split(data, least, budget.per_solve_s)
            result.solves += 1
            evaluation = problem.evaluate(replace(layout, stage_layers=split))
        if evaluation.fits and evaluation.step.total < result.step:
            result.best, result.step = evaluation, evaluation.step.total
    if result.best is None:
        return None if unsettled == left == math.inf else result
    result.bound = min(result.step, unsettled, left)
    result.proven = result.bound >= result.step
    result.stopped = "" if result.proven else result.stopped
    return result


def uneven_answer(result) -> None:
    """``solve --uneven-stages``: the search's ``result`` (with even stages) gets the best (layout, split)
    (``joint_optimum``) as its answer, unless the chosen layout on its best split is within the
    robust choice's uncertainty of it (the robust choice's rule, search/driver.py); its
    ``uneven_stages`` says what was found and proven (the report's and the JSON's)."""
    from trnopt.optimizer.search.stagesplit import split_layout

    problem = result.problem
    fastest = result.fastest or result.best  # the branch and bound's fastest layout with even stages
    chosen, info = split_layout(problem, result.best)
    result.best, result.uneven_stages = chosen, info
    if problem.objective != "step-time":
        info["joint"] = {"status": "NOT_SEARCHED", "note": "the joint search of layout and split is for the "
                                                           "step-time objective; the chosen layout was split"}
        return
    # the chosen layout is in the joint space unless it has stages and no split fits them all
    member = info["status"] in ("NO_PIPELINE", "UNSUPPORTED") or "layers" in info
    joint = joint_optimum(problem, chosen if member else None, problem.score(fastest), bounds_by_lnc=result.bounds)
    if joint is None or joint.best is None:
        info["joint"] = {"status": "INFEASIBLE", "note": "no layout of the space fits on any split of its layers "
                                                         "(the per-stage memory)", "scope": SCOPE}
        return
    even_bound = (1 - result.gap) * problem.score(fastest)
    bound = min(joint.bound, even_bound)
    proven = joint.proven and result.status == "OPTIMAL"
    info["joint"] = {
        "status": "OPTIMAL" if proven else "FEASIBLE", "layout": joint.best.layout.describe(),
        "stage_layers": list(joint.best.layout.stage_layers), "step_s": joint.step, "bound_s": bound,
        "gap": 0.0 if proven else max(0.0, (joint.step - bound) / joint.step), "scope": joint.scope,
        "candidates": joint.candidates, "layouts_split": joint.split, "cpsat_solves": joint.solves,
        "points": joint.points,
        **({"stopped_by": "the work budget"} if joint.stopped else {}),
        **({"note": "the search with even stages was not proven optimal: its gap carries over"}
           if result.status != "OPTIMAL" else {})}
    if not member or chosen.step.total > joint.step * (1 + result.uncertainty) or (
            result.uncertainty == 0 and chosen.step.total > joint.step):
        info["joint"]["replaced"] = chosen.layout.describe()
        against = (f"against {chosen.step.total:.3f} s for the search's layout on its best split" if member else
                   "the search's layout fits no split of its stages")
        info["note"] = (f"the best layout and split together: {joint.best.layout.describe()}, layers per stage "
                        f"{','.join(map(str, joint.best.layout.stage_layers)) or 'even'}, {joint.step:.3f} s; {against}")
        result.best = joint.best
    info["joint"]["answer"] = result.best.layout == joint.best.layout


def _proven_split(data: SplitData, least: tuple[int, tuple[int, ...]], deterministic_s: float) -> tuple[int, ...]:
    """The monotone test's split (search/stagebottleneck.py), checked by CP-SAT's (search/stagesplit.py),
    hinted with it: SolverMismatch when a proven CP-SAT optimum has another bottleneck. The test's split
    is kept (CP-SAT returns any split of the least bottleneck; the test's has its other stages even)."""
    from trnopt.optimizer.search.cpsat import SolverMismatch  # OR-Tools: imported when a layout is solved
    solved = best_split(data, deterministic_limit=deterministic_s, hint=least[1])
    if solved.status == "OPTIMAL" and solved.bottleneck != least[0]:
        raise SolverMismatch(f"the split search's optimum {solved.bottleneck} ns differs from the monotone "
                             f"test's {least[0]} ns")
    return least[1]
