"""Uneven pipeline stages: the CP-SAT split search against a NumPy enumeration of every split, side
by side in one run, in CPU-seconds.

Per case (one layout, or several layouts of one model and pipeline degree searched as one space:
which layout runs and how its stages are split, the least step):
- points: the true size of the space, layouts x C(L - 1, p - 1) splits of L layers into p stages of
  at least one layer each (no rule removes any; memory is checked at each, a point over memory counts).
- costs CPU-s: cost/stages.stage_costs, the per-stage costs both searches read (shared, not in
  either column).
- enum CPU-s: search/stageenum.best_joint, what a competent engineer would write without a solver: every
  split built in chunks and scored in NumPy by the same integer per-stage data (stagesplit.SplitData),
  no pruning.
- CP-SAT CPU-s: search/stagesplit.best_joint, one model built and solved on one worker, proven OPTIMAL
  (process CPU time: every solver thread counted).
- ratio: enum / CP-SAT; agree: both find the same least step (ns), or both find none fits.

Goal: CP-SAT at least 100x faster than the enumeration on every case of at least 10 million splits.

    python benchmarks/stage_split.py [--huge]   # --huge adds llama3-70b PP8 (2.25e9 splits, minutes of CPU)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import environment  # noqa: E402

from trnopt.optimizer.cost import stages  # noqa: E402
from trnopt.optimizer.cost.problem import Problem  # noqa: E402
from trnopt.optimizer.model.layout import Layout, default_placement  # noqa: E402
from trnopt.optimizer.model.target import load_target  # noqa: E402
from trnopt.optimizer.model.workload import Training, Workload, load_model  # noqa: E402
from trnopt.optimizer.search import stageenum  # noqa: E402
from trnopt.optimizer.search.stagesplit import SplitData, best_joint, best_split  # noqa: E402

# (case name, model, target, [(tp, pp, recompute, zero), ...]): one row per case, its layouts' spaces added
CASES = [
    ("llama3-8b trn2u x1, PP8, 4 layouts", "llama3-8b", "trn2u",
     [(4, 8, "full", 1), (8, 8, "full", 1), (4, 8, "selective", 1), (8, 8, "every-4", 3)]),
    ("llama3-8b trn2u x1, PP8, 8 layouts", "llama3-8b", "trn2u",
     [(4, 8, "full", 1), (8, 8, "full", 1), (4, 8, "selective", 1), (8, 8, "every-4", 3), (4, 8, "op", 1),
      (8, 8, "selective", 3), (4, 8, "every-4", 1), (8, 8, "op", 3)]),
    ("llama3-70b trn3-gen2 x1, TP8 PP6", "llama3-70b", "trn3-gen2", [(8, 6, "full", 1)]),
    ("mixtral-8x22b trn2u x1, TP8 PP8", "mixtral-8x22b", "trn2u", [(8, 8, "full", 1)]),
]
HUGE = [("llama3-70b trn2u x1, TP8 PP8", "llama3-70b", "trn2u", [(8, 8, "full", 1)])]


def layout_of(problem: Problem, tp: int, pp: int, recompute: str, zero: int) -> Layout:
    t = problem.target
    lnc = t.chip.lnc_default
    axes = t.axes(lnc, problem.domains)
    deg = dict(tp=tp, pp=pp, dp=t.ranks(lnc, problem.domains) // (tp * pp), ep=1, cp=1)
    return Layout(tp=tp, pp=pp, dp=deg["dp"], axes=axes, placement=default_placement(axes, deg), zero=zero,
                  recompute=recompute, lnc=lnc)


def run_case(name: str, model: str, target: str, layouts) -> dict:
    problem = Problem(Workload(load_model(model), Training()), load_target(target), 1)
    t0 = time.process_time()
    costs = [stages.stage_costs(problem.workload, layout_of(problem, *lay), problem.target, problem.headroom,
                                problem.overlap) for lay in layouts]
    datas = [SplitData.of(c) for c in costs]
    t1 = time.process_time()
    found = best_joint(datas)
    t2 = time.process_time()
    top, _, _, scored = stageenum.best_joint(datas)
    t3 = time.process_time()
    assert scored == len(layouts) * stageenum.count(problem.workload.model.layers, layouts[0][1])
    row = dict(name=name, points=scored, costs=t1 - t0, cpsat=t2 - t1, enum=t3 - t2,
               agree=found.step == top and found.status in ("OPTIMAL", "INFEASIBLE"), found=[])
    for i, ((tp, pp, recompute, zero), c) in enumerate(zip(layouts, costs)):
        even = c.even_split()
        chosen = " <- chosen" if found.layers is not None and i == found.choice else ""
        row["found"].append(f"TP{tp} PP{pp} {recompute} ZeRO-{zero}: even {c.step(even):.3f} s/step "
                            f"({'fits' if c.fits(even) else 'over HBM'}){chosen}")
    row["found"].append(f"CP-SAT {found.status}: " + (
        f"layout {found.choice + 1}, layers {','.join(map(str, found.layers))}, "
        f"{costs[found.choice].step(found.layers):.3f} s/step" if found.layers else "no split fits"))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huge", action="store_true", help="add llama3-70b PP8 (2.25e9 splits)")
    args = parser.parse_args(argv)
    print(environment())
    import ortools.sat.python.cp_model  # noqa: F401  (imported before the clocks: neither column pays it)
    best_split(SplitData(2, 1, 0, 1, 0, 0, (1, 1), (0, 0), 100))  # CP-SAT's first solve loads its library
    print(f"{'case':40s} {'points':>14s} {'costs CPU-s':>11s} {'enum CPU-s':>10s} {'CP-SAT CPU-s':>12s} "
          f"{'ratio':>8s} agree")
    worst = None
    for case in CASES + (HUGE if args.huge else []):
        row = run_case(*case)
        ratio = row["enum"] / max(row["cpsat"], 1e-9)
        if row["points"] >= 10_000_000:
            worst = ratio if worst is None else min(worst, ratio)
        print(f"{row['name']:40s} {row['points']:14,d} {row['costs']:11.3f} {row['enum']:10.3f} {row['cpsat']:12.4f} "
              f"{ratio:7.0f}x {'yes' if row['agree'] else 'NO'}")
        for line in row["found"]:
            print(f"    {line}")
    if worst is not None:
        print(f"least ratio over the cases of at least 10 million points: {worst:.0f}x (goal: 100x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
