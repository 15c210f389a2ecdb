"""The cost model against published step times, row by row, and the fit of its free parameters.

Two calibration sets, side by side in one run: the six published trn1 runs
(targets/measured/trn1-published.csv) for the Trainium targets, and Korthikanti et al.
(2022) Table 5 on A100 for the GPU targets. For each: every row's modelled and published
step time and the error, the mean absolute error and the worst row at the shipped
efficiency, then the calibration grid (optimizer/cost/calibration.py) run again to show
the shipped values are its fit. Goals: trn1 mean |error| <= 10% and worst <= 20%;
Table 5 mean <= 5%.

    python benchmarks/accuracy.py
"""

from __future__ import annotations

import time

from common import environment

from trnopt.optimizer.cost.calibration import GPU_FREE, NEURON_FREE, band, fit, rows, table5_cases, trn1_cases
from trnopt.optimizer.model.target import GIB, load_target

SETS = (("trn1", trn1_cases, 0.10, 0.20, NEURON_FREE), ("a100", table5_cases, 0.05, None, GPU_FREE))


def main() -> None:
    print(environment())
    for name, cases_of, mean_goal, worst_goal, free in SETS:
        target, cases = load_target(name), cases_of()
        e = target.efficiency
        print(f"\n{name}: matmul {e.matmul}, elementwise {e.elementwise}, {e.microbatch_overhead_s * 1e6:g} us per "
              f"micro-batch, collective fixed share {e.collective_fixed_share}, link share "
              f"{target.domain_axes[0].achievable} (fitted on {e.fitted_on})")
        print(f"{'row':52s} {'model s':>9s} {'published s':>12s} {'error':>8s} {'memory GiB':>11s} {'fits':>5s}")
        scored = rows(target, cases)
        for r in scored:
            ev = r.evaluation
            print(f"{r.label:52s} {ev.step.total:9.2f} {r.published_s:12.2f} {r.error:+8.1%} "
                  f"{ev.memory.total / GIB:11.1f} {str(ev.fits):>5s}")
        errors = [r.error for r in scored]
        mean = sum(abs(x) for x in errors) / len(errors)
        worst = max(abs(x) for x in errors)
        met = mean <= mean_goal and (worst_goal is None or worst <= worst_goal)
        goal = f"mean <= {mean_goal:.0%}" + (f", worst <= {worst_goal:.0%}" if worst_goal else "")
        print(f"mean absolute error {mean:.2%}, worst row {worst:.2%} (goal: {goal}: {'met' if met else 'NOT met'})")
        low, high = band(errors)
        print(f"band carried to targets fitted on these rows: step x {low:.3f} .. x {high:.3f}")
        start = time.perf_counter()
        found = fit(target, cases, free)
        best = found.efficiency
        same = best == e and ("link_share" not in free or target.domain_axes[0].achievable == found.link_share)
        print(f"calibration fit ({', '.join(free)}): least mean |error| {found.mean_abs_error:.2%} at matmul "
              f"{best.matmul}, elementwise {best.elementwise}, {best.microbatch_overhead_s * 1e6:g} us per micro-batch, "
              f"collective fixed share {best.collective_fixed_share}, link share {found.link_share} "
              f"({time.perf_counter() - start:.1f} s); shipped values are {'the fit' if same else 'NOT the fit'}")


if __name__ == "__main__":
    main()
