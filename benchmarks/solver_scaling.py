"""CP-SAT against exhaustive enumeration of the same space, side by side in one run.

For every case: the search's wall time and status (OPTIMAL / FEASIBLE with gap /
INFEASIBLE, over every LNC), the size of the space (placements x memory plans, counted
before the workload's divisibility rules), and the brute-force time: measured when the
space has at most --measure-limit points, otherwise estimated as points / the evaluation
rate measured on a sample of the same enumerator (this overstates a little, since the
enumerator skips points the workload's rules remove before scoring them). Goals
(goals): proven optimal within 2 s for one UltraServer, within 60 s at 4,096 chips, and
at least 100x faster than enumeration on the large spaces.

    python benchmarks/solver_scaling.py [--time-limit 120] [--measure-limit 1500000]
"""

from __future__ import annotations

import argparse
import time

from common import environment

from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.search.driver import solve
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

CASES = [
    ("llama3-70b", "trn2u", 1),
    ("llama3-405b", "trn2u", 1),
    ("llama3-405b", "trn2u", 2),
    ("llama3-405b", "trn2u", 8),
    ("llama3-405b", "trn2u", 64),
    ("llama3-405b", "trn3-gen2", 1),
    ("llama3-405b", "trn3-gen2", 16),
    ("deepseek-v3", "trn2u", 16),
]
SAMPLE = 3000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--measure-limit", type=int, default=1_500_000)
    args = ap.parse_args()
    print(environment())
    print(f"{'case':32s} {'chips':>6s} {'points':>12s} {'CP-SAT s':>9s} {'status':>18s} "
          f"{'brute s':>12s} {'brute':>10s} {'ratio':>9s}  layout")
    for model, target_name, domains in CASES:
        target = load_target(target_name)
        problem = Problem(Workload(load_model(model), Training()), target, domains)
        points = sum(Space(problem, lnc).size() for lnc in problem.lnc_values)
        start = time.perf_counter()
        try:
            result = solve(problem, time_limit=args.time_limit, top=0)
            status = "OPTIMAL" if result.status == "OPTIMAL" else f"FEASIBLE gap {100 * result.gap:.1f}%"
            layout = result.best.layout.describe()
        except InfeasibleError:
            status, layout = "INFEASIBLE", "none fits"
        solve_s = time.perf_counter() - start
        if points <= args.measure_limit:
            bf = brute_force(problem)
            brute_s, how = bf.seconds, "measured"
        else:
            sample = brute_force(problem, limit=SAMPLE)
            brute_s, how = points * sample.seconds / max(sample.evaluated, 1), "estimated"
        chips = domains * target.chips_per_domain
        print(f"{model + ' on ' + target_name + ' x' + str(domains):32s} {chips:6d} {points:12,d} {solve_s:9.2f} "
              f"{status:>18s} {brute_s:12.1f} {how:>10s} {brute_s / solve_s:8.0f}x  {layout}", flush=True)


if __name__ == "__main__":
    main()
