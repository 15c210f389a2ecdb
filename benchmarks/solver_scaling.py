"""The search at scale against exhaustive enumeration of the same space, side by side in one run.

Each case runs ``trnopt solve`` as a user would (its own process, the default runner-ups
and robust choice, ``--json`` to a file) and prints: the status (OPTIMAL, FEASIBLE with
its gap, INFEASIBLE), the wall time, the peak memory of the solve and of its CP-SAT
children, the size of the JSON it wrote, and the enumeration time of the same space:
measured when the space has at most --measure-limit points, otherwise estimated as
points / the evaluation rate measured on a sample of the same enumerator (an
overstatement, since the enumerator skips points the workload's rules remove before
scoring them). "search s" is the search for the fastest layout and its proof; "solve s"
the whole command (with the robust choice, the alternatives and the interpreter's start). ``--beside CMD`` runs CMD (the test suite, say) for the whole benchmark, so
the timings are those of a loaded machine.

Goals: llama3-405b at about 100,000 chips OPTIMAL within 60 s; deepseek-v3 and
mixtral-8x22b on trn2u x 1-64 and trn3-gen2 x 1-16 OPTIMAL within 30 s; at least 100x
faster than enumeration on every space of 1M points or more; the JSON under 1 MB and the
peak memory under 2 GiB for every solve.

    python benchmarks/solver_scaling.py [--cases dense,moe,huge] [--beside "python -m pytest -q tests"]
                                        [--no-enumeration]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from common import environment

from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.frameworks.profile import DEFAULT, PROFILES
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model
from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.search.space import Space

# (group, model, target, UltraServers, global batch, time limit in s)
CASES = [
    ("dense", "llama3-70b", "trn2u", 1, 1024, 60),
    ("dense", "llama3-405b", "trn2u", 2, 1024, 60),
    ("dense", "llama3-405b", "trn2u", 8, 1024, 60),
    ("dense", "llama3-405b", "trn2u", 64, 1024, 60),
    ("dense", "llama3-405b", "trn3-gen2", 16, 1024, 60),
    *(("moe", model, target, n, 1024, 30) for model in ("deepseek-v3", "mixtral-8x22b")
      for target, n in (("trn2u", 1), ("trn2u", 4), ("trn2u", 16), ("trn2u", 64),
                        ("trn3-gen2", 1), ("trn3-gen2", 4), ("trn3-gen2", 16))),
    ("huge", "llama3-405b", "trn2u", 1600, 1024, 60),
    # 700 x 144 chips: 1,024 sequences do not tile 403,200 ranks (the solve proves it at
    # once); 1,600 do (dp a multiple of 25)
    ("huge", "llama3-405b", "trn3-gen2", 700, 1024, 60),
    ("huge", "llama3-405b", "trn3-gen2", 700, 1600, 60),
]
SAMPLE = 3000   # layouts scored to estimate enumeration's rate
SAMPLE_S = 60.0  # seconds at most for that sample (on the largest spaces most layouts fail the rules first)

# runs the CLI and reports its peak memory, its CP-SAT children's included
CHILD = """
import resource, sys
from trnopt.optimizer.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(f"peak_kib {peak}", file=sys.stderr)
sys.exit(code or 0)
"""


def run_case(model: str, target: str, domains: int, batch: int, limit: float) -> dict:
    """One ``trnopt solve`` in its own process: status, seconds, peak memory, JSON size."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "solve.json")
        argv = ["solve", "--target", target, "--ultraservers", str(domains), "--model", model,
                "--global-batch", str(batch), "--time-limit", str(limit), "--json", out]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        peak = next((int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak_kib")), 0)
        row = {"seconds": seconds, "peak_mib": peak / 1024, "exit": done.returncode}
        if done.returncode == 3:
            row.update(status="INFEASIBLE", layout="none fits or tiles", json_kib=0.0, search=seconds)
        elif os.path.exists(out):
            data = json.load(open(out, encoding="utf-8"))
            status = data["status"] if data["status"] == "OPTIMAL" else f"FEASIBLE gap {100 * data['gap']:.1f}%"
            row.update(status=status, layout=_describe(data["layout"]), json_kib=os.path.getsize(out) / 1024,
                       points=data["space_size"], search=data["search_seconds"])
        else:
            row.update(status=f"exit {done.returncode}", layout=done.stderr.strip().splitlines()[-1][:80],
                       json_kib=0.0, search=seconds)
        return row


def ratio(enumeration_s: float, solve_s: float) -> str:
    return "n/a" if math.isnan(enumeration_s) else f"{enumeration_s / solve_s:.0f}x"


def _describe(layout: dict) -> str:
    degrees = " x ".join(f"{k.upper()}{layout[k]}" for k in ("tp", "pp", "dp", "ep", "cp") if layout[k] > 1)
    return f"{degrees or 'TP1'}, ZeRO-{layout['zero']}, {layout['recompute']} recompute, LNC={layout['lnc']}"


def enumeration(model: str, target_name: str, domains: int, batch: int, measure_limit: int) -> tuple[int, float, str]:
    """(points, seconds, how) for brute force over the same space."""
    target = load_target(target_name)
    # the space `trnopt solve` searches by default: the default framework's options, torchrun's instance blocks
    framework = PROFILES[DEFAULT]
    problem = Problem(Workload(load_model(model), Training(global_batch=batch)), target, domains,
                      zero_stages=framework.zero_stages, recompute=framework.recompute,
                      interleave=framework.interleaved, hsdp=framework.hsdp, instance_blocks=True)
    points = sum(Space(problem, lnc).size() for lnc in problem.lnc_values)
    if points <= measure_limit:
        return points, brute_force(problem).seconds, "measured"
    scored, seconds = sample(problem)
    if not scored:
        return points, math.nan, f"none scored in {seconds:.0f} s"
    return points, points * seconds / scored, "estimated"


class _Stop(Exception):
    pass


def sample(problem: Problem) -> tuple[int, float]:
    """(layouts scored, seconds) by the brute-force enumerator, stopped at SAMPLE layouts or
    SAMPLE_S seconds (a timer: on the largest spaces the enumerator can reject layouts for
    minutes before it yields one)."""
    def stop(*_):
        raise _Stop

    scored, start = 0, time.perf_counter()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, SAMPLE_S)
    try:
        for lnc in problem.lnc_values:
            for layout in Space(problem, lnc).layouts():
                problem.evaluate(layout)
                scored += 1
                if scored >= SAMPLE:
                    raise _Stop
    except _Stop:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return scored, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="dense,moe,huge", help="groups to run: dense, moe, huge")
    ap.add_argument("--measure-limit", type=int, default=1_500_000)
    ap.add_argument("--beside", default="", help="a command to run for the whole benchmark (load)")
    ap.add_argument("--no-enumeration", action="store_true", help="time the solves only")
    args = ap.parse_args()
    groups = set(args.cases.split(","))
    print(environment())
    beside = None
    if args.beside:
        beside = subprocess.Popen(shlex.split(args.beside), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"beside: {args.beside} (pid {beside.pid})")
    print(f"{'case':36s} {'points':>16s} {'status':>18s} {'search s':>8s} {'solve s':>8s} {'limit':>5s} {'peak MiB':>8s} "
          f"{'JSON KiB':>8s} {'enum s':>10s} {'enum':>9s} {'ratio':>7s}  layout")
    try:
        for group, model, target, domains, batch, limit in CASES:
            if group not in groups:
                continue
            row = run_case(model, target, domains, batch, limit)
            if args.no_enumeration:
                points, enum_s, how = row.get("points", 0), math.nan, "not run"
            else:
                points, enum_s, how = enumeration(model, target, domains, batch, args.measure_limit)
            if row.get("points", points) != points:  # the enumeration must time the space the solve searched
                how = f"{how}, other space ({row['points']:,d} searched)"
            name = f"{model} {target} x{domains}" + (f" batch {batch}" if batch != 1024 else "")
            print(f"{name:36s} {points:16,d} {row['status']:>18s} {row['search']:8.2f} {row['seconds']:8.2f} {limit:5.0f} "
                  f"{row['peak_mib']:8.0f} {row['json_kib']:8.1f} {enum_s:10.0f} {how:>9s} "
                  f"{ratio(enum_s, row['seconds']):>7s}  {row['layout']}", flush=True)
    finally:
        if beside is not None:
            still = beside.poll() is None
            beside.terminate()
            print(f"beside: {'still running at the end' if still else f'ended before the end (exit {beside.returncode})'}")


if __name__ == "__main__":
    main()
