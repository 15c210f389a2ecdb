"""The cost model against published step times, row by row: the fit's error and the held-out error.

Three sets, side by side in one run:
- the six published trn1 runs (targets/measured/trn1-published.csv), on which the Trainium
  targets' free parameters are fitted;
- Korthikanti et al. (2022) Table 5 on A100, on which the GPU targets' are fitted;
- published H100 runs (targets/measured/h100-published.csv), never fitted: the A100 fit
  carried to the h100 target predicts them; beside them, torchtitan's own framework GEMM share
  fitted per torchtitan mode (eager, torch.compile) on that mode's named rows, with each row's
  leave-one-out error (not shipped: the h100 target keeps the Table 5 values);
- published mixture-of-experts runs (targets/measured/moe-published.csv), never fitted,
  each on its own GPU target (h800 for DeepSeek-V3), and beside the DeepSeek-V3 row the
  layout ``trnopt solve`` picks for that run (benchmarks/moe_accuracy.py).

For a fitted set every row shows the model at the shipped values (the fit's error: the row
helped choose them) and the model at the values fitted on the other rows (the held-out
error, leave-one-out: ``calibration.held_out``). The step-time band the reports print rests
on the held-out errors, stored in targets/measured/held-out.json: ``--write`` stores what
this run computed (the file's old values are shown beside the new). Goals (the issue's):
trn1 rows outside the fit within 10% each; dense H100 rows outside the fit within 10% mean;
MoE rows within 15% mean.

    python benchmarks/accuracy.py [--write]
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources

from common import environment
from moe_accuracy import moe_set, scored_rows

from trnopt.optimizer.cost.calibration import (FAMILIES, HELD_OUT_FILE, band, fit, framework_constants, h100_cases,
                                               held_out, held_out_table, rows)
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GIB, load_target

GOALS = {"trn1-published": ("each", 0.10), "table5": ("mean", 0.05), "h100": ("mean", 0.10)}


def _verdict(errors: list[float], family: str) -> str:
    kind, goal = GOALS[family]
    mean = sum(abs(x) for x in errors) / len(errors)
    worst = max(abs(x) for x in errors)
    met = worst <= goal if kind == "each" else mean <= goal
    return (f"mean |error| {mean:.2%}, worst {worst:.2%} (goal: {kind} <= {goal:.0%}: "
            f"{'met' if met else 'NOT met'})")


def fitted_set(family: str) -> dict:
    """Print one fitted set's rows with the fit's and the held-out error; return its stored form."""
    cases_of, base, free = FAMILIES[family]
    target, cases = load_target(base), cases_of()
    e = target.efficiency
    print(f"\n{family} on {base}: chip_matmul {e.chip_matmul} ({e.chip_matmul_source}), not fitted;\n"
          f"  matmul {e.matmul}, elementwise {e.elementwise}, "
          f"{e.microbatch_overhead_s * 1e6:g} us per micro-batch, collective fixed share "
          f"{e.collective_fixed_share}, link share {target.domain_axes[0].achievable}; free: {', '.join(free)}")
    start = time.process_time()
    found = fit(target, cases, free)
    shipped = found.efficiency == e and ("link_share" not in free or target.domain_axes[0].achievable
                                         == found.link_share)
    scored, predicted = rows(target, cases), held_out(target, cases, free)
    cpu = time.process_time() - start
    print(f"{'row':54s} {'published s':>11s} {'fit s':>8s} {'fit err':>8s} {'held-out s':>10s} "
          f"{'held-out err':>12s} {'GiB':>6s}")
    for r, h in zip(scored, predicted):
        print(f"{r.label:54s} {r.published_s:11.2f} {r.evaluation.step.total:8.2f} {r.error:+8.1%} "
              f"{h.evaluation.step.total:10.2f} {h.error:+12.1%} {r.evaluation.memory.total / GIB:6.1f}")
    print(f"fit (rows fitted on: all {len(cases)}): {_verdict([r.error for r in scored], family)}; "
          f"shipped values are {'the fit' if shipped else 'NOT the fit'}")
    print(f"held-out (each row predicted by the fit of the other {len(cases) - 1}): "
          f"{_verdict([h.error for h in predicted], family)}")
    low, high = band([h.error for h in predicted])
    print(f"band carried to targets fitted on these rows: step x {low:.3f} .. x {high:.3f} "
          f"({cpu:.1f} CPU-s for the fit and its {len(cases)} refits)")
    for name in BUILTIN_TARGETS:
        other = load_target(name).efficiency
        if name != base and other.fitted_on.startswith(family):
            print(f"carried to {name}: {', '.join(f'{k} {v:g}' for k, v in framework_constants(other).items())}"
                  f"{'' if framework_constants(other) == framework_constants(e) else ' (NOT the fit above)'}; "
                  f"its own chip_matmul {other.chip_matmul:g} -> GEMM share {other.gemm_share:.3f}")
    return {"free": list(free), "rows": [{"label": r.label, "fit_error": round(r.error, 4),
                                          "held_out_error": round(h.error, 4)} for r, h in zip(scored, predicted)]}


def held_out_set() -> dict:
    """The H100 rows: every one a prediction of the A100 fit carried to the h100 target; return
    their stored form (the h100 step-time band rests on them)."""
    target = load_target("h100")
    e = target.efficiency
    print(f"\nh100 published runs (never fitted): chip_matmul {e.chip_matmul} ({e.chip_matmul_source}) x "
          f"carried from the table5 fit ({e.fitted_on}): {', '.join(f'{k} {v:g}' for k, v in framework_constants(e).items())}")
    print(f"{'row':62s} {'published s':>11s} {'model s':>9s} {'error':>8s} {'GiB':>6s} {'pub GiB':>7s} "
          f"{'HBM GiB':>7s} {'fits':>5s}")
    errors, stored = [], []
    for _, case, r in scored_rows(((target, case) for case in h100_cases()), 62):
        errors.append(r.error)
        stored.append({"label": r.label, "held_out_error": round(r.error, 4)})
        ev = r.evaluation
        published = f"{case.published_gib:7.1f}" if case.published_gib is not None else f"{'-':>7s}"
        print(f"{r.label:62s} {r.published_s:11.2f} {ev.step.total:9.2f} {r.error:+8.1%} "
              f"{ev.memory.total / GIB:6.1f} {published} {case.hbm[0] / GIB:7.1f} {str(ev.fits):>5s}")
    if errors:
        print(f"held-out: {_verdict(errors, 'h100')} over {len(errors)} rows")
    framework_shares(target)
    return {"carried_from": "table5", "rows": stored}


def framework_shares(target) -> None:
    """The framework's GEMM share (``matmul``) of each torchtitan mode fitted on that mode's rows only
    (leave-one-out beside the fit), every other row still the shipped constants' prediction: how
    far torchtitan's overheads sit from Megatron-LM's (Table 5), which the h100 target ships."""
    cases = h100_cases()
    groups = sorted({c.framework for c in cases if c.framework.startswith("torchtitan")})
    print(f"\nh100 with torchtitan's framework share fitted on its own rows (free: matmul; chip_matmul "
          f"{target.efficiency.chip_matmul:g} kept): not shipped, the h100 target keeps the table5 values")
    print(f"{'row':62s} {'published s':>11s} {'fit s':>8s} {'fit err':>8s} {'held-out s':>10s} {'held-out err':>12s}")
    held = []
    for group in groups:
        rows_of = [c for c in cases if c.framework == group]
        found = fit(target, rows_of, ("matmul",))
        shipped = found.applied(target, ("matmul",))
        print(f"{group}: matmul {found.efficiency.matmul:g} (table5: {target.efficiency.matmul:g}), fitted on "
              f"{len(rows_of)} rows")
        for c, h in zip(rows_of, held_out(target, rows_of, ("matmul",))):
            r = c.row(shipped)
            held.append(h.error)
            print(f"{c.label:62s} {c.published_s:11.2f} {r.evaluation.step.total:8.2f} {r.error:+8.1%} "
                  f"{h.evaluation.step.total:10.2f} {h.error:+12.1%}")
    others = [c.row(target).error for c in cases if not c.framework.startswith("torchtitan")]
    print(f"held-out (torchtitan rows leave-one-out within their mode, the other {len(others)} rows predicted "
          f"by table5): {_verdict(held + others, 'h100')} over {len(held) + len(others)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"store the held-out errors in targets/{HELD_OUT_FILE}")
    args = parser.parse_args()
    print(environment())
    stored = {family: fitted_set(family) for family in FAMILIES}
    stored["h100"] = held_out_set()
    moe_set()
    old = held_out_table()
    print(f"\ntargets/{HELD_OUT_FILE}: {'unchanged' if old == stored else 'differs from this run'}")
    if args.write and old != stored:
        path = resources.files("trnopt.targets").joinpath(HELD_OUT_FILE)
        with open(str(path), "w", encoding="utf-8") as f:
            json.dump(stored, f, indent=1)
            f.write("\n")
        print(f"written: {path}")


if __name__ == "__main__":
    main()
