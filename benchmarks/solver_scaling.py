"""The search against a vectorised enumeration of the same space, side by side in one run, in CPU-seconds.

Per case:
- points: the true size of the space, every point of every LNC's space that keeps the
  space's rules (degrees, placements, micro-batch sizes, interleave, HSDP), counted by the
  enumeration as it scores them (memory is checked at each; a point over memory counts).
- enum CPU-s: ``bruteforce.enumerate_space``, what a competent engineer would write instead
  of a search: every degree tuple's points scored at once in NumPy by the project's own
  PointBounder over the cost model's own trees, no pruning, no Layout object per point.
- search CPU-s: ``search.driver.solve`` with no runner-ups and no robust choice, the same
  question (the fastest layout and its proof), CP-SAT's child processes included; when no
  layout fits, solve's explanation too (the least-memory layout and the fewest domains that
  fit, by CP-SAT), whose share the status gives.
- Both sides alike: each measurement runs in a child forked from this process after the
  imports (OR-Tools' too) and the problem's construction, so each starts from the same cold
  caches (the cost model's tables and the bounders' factor entries; when both ran in one
  process, whichever ran second was served the tables the first had computed); the two
  sides alternate, ``--repeats`` times each (default 3), and each side's minimum CPU-s is
  reported (timeit's rule: the other runs are the same work plus the machine's other
  load).
- command CPU-s: the default ``trnopt solve`` in its own process, from after the command's
  imports to its exit (the answer, three runner-ups proven, the robust choice, the
  alternatives, and the second search for the answer with no overlap); "start-up" the
  imports before it.
- ratio: enum CPU-s / search CPU-s (above 1: the search is faster).
- agree: the search's step time equals the enumeration's best (relative 1e-9), or both find
  that no layout fits.

Goals: every case OPTIMAL within 5 CPU-seconds after start-up, and no slower than the
enumeration. CPU-seconds, not wall time: these machines are shared.

    python benchmarks/solver_scaling.py [--cases dense,moe,huge] [--match REGEX] [--repeats N] [--no-enumeration]
                                        [--no-command]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import resource
import subprocess
import sys
import tempfile

from common import environment

from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.frameworks.profile import DEFAULT, PROFILES
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model
from trnopt.optimizer.search.bruteforce import enumerate_space
from trnopt.optimizer.search.driver import solve
from trnopt.optimizer.search import cpsat, domains, solver  # noqa: F401  OR-Tools, imported before any child forks

# (group, model, target, UltraServers)
CASES = [
    ("dense", "llama3-70b", "trn2u", 1),
    ("dense", "llama3-405b", "trn2u", 2),
    ("dense", "llama3-405b", "trn2u", 8),
    ("dense", "llama3-405b", "trn2u", 64),
    ("dense", "llama3-405b", "trn2u", 256),
    ("dense", "llama3-405b", "trn3-gen2", 16),
    *(("moe", model, target, n) for model in ("deepseek-v3", "mixtral-8x22b")
      for target, n in (("trn2u", 1), ("trn2u", 4), ("trn2u", 16), ("trn2u", 64),
                        ("trn3-gen2", 1), ("trn3-gen2", 4), ("trn3-gen2", 16))),
    ("huge", "llama3-405b", "trn2u", 1600),   # 102,400 chips
]
BATCH = 1024
LIMIT_S = 600  # --time-limit: the safety stop only; the search ends by its proof or its work budget

# runs the CLI; prints the CPU-seconds of its imports and of the command after them, children included
CHILD = """
import resource, sys
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
from trnopt.optimizer.commands.cli import main, parser
parser(sys.argv[1:])  # the command's own imports
begun = cpu()
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(f"cpu {begun:.3f} {cpu() - begun:.3f}", file=sys.stderr)
sys.exit(code or 0)
"""


def run_solve(model: str, target: str, domains: int, *extra: str) -> dict:
    """One ``trnopt solve`` in its own process: status, gap, step time, start-up and command CPU-s."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "solve.json")
        argv = ["solve", "--target", target, "--ultraservers", str(domains), "--model", model,
                "--global-batch", str(BATCH), "--time-limit", str(LIMIT_S), "--json", out, *extra]
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
        line = next((ln.split() for ln in done.stderr.splitlines() if ln.startswith("cpu ")), ["cpu", "nan", "nan"])
        row = {"startup": float(line[1]), "cpu": float(line[2]), "status": f"exit {done.returncode}", "step": math.nan}
        if done.returncode == 3:
            row["status"] = "INFEASIBLE"
        elif os.path.exists(out):
            data = json.load(open(out, encoding="utf-8"))
            row["status"] = data["status"] if data["status"] == "OPTIMAL" else \
                f"{data['status']} gap {100 * data['gap']:.1f}% ({data['stopped_by']})"
            row["step"], row["layout"] = data["step_time_s"], _describe(data["layout"])
        return row


def _describe(layout: dict) -> str:
    degrees = " x ".join(f"{k.upper()}{layout[k]}" for k in ("tp", "pp", "dp", "ep", "cp") if layout[k] > 1)
    return f"{degrees or 'TP1'}, ZeRO-{layout['zero']}, {layout['recompute']} recompute, LNC={layout['lnc']}"


def problem_of(model: str, target_name: str, domains: int) -> Problem:
    """The problem `trnopt solve` searches by default: the default framework's options and
    structural rules, torchrun's instance blocks."""
    framework = PROFILES[DEFAULT]
    return Problem(Workload(load_model(model), Training(global_batch=BATCH)), load_target(target_name), domains,
                   zero_stages=framework.zero_stages, recompute=framework.recompute,
                   interleave=framework.interleaved, hsdp=framework.hsdp, rules=framework.rules,
                   instance_blocks=True)


def search(problem: Problem) -> dict:
    """The search alone in this process (``driver.solve``, no runner-ups, no robust choice): status
    and CPU-s. When no layout fits, the status says how much of the CPU-s went to the explanation
    (domains.explain_infeasible: the least-memory layout and the fewest domains that fit, by CP-SAT),
    which the enumeration does not give."""
    explain, spent = domains.explain_infeasible, []

    def timed(*args, **kwargs):
        begun = cpu()
        text = explain(*args, **kwargs)
        spent.append(cpu() - begun)
        return text

    domains.explain_infeasible = timed  # solve imports it on use, from the module
    begun = cpu()
    try:
        found = solve(problem, LIMIT_S, top=0, uncertainty=0.0)
    except InfeasibleError:
        return {"cpu": cpu() - begun, "status": f"INFEASIBLE ({sum(spent):.2f} explaining)", "step": math.inf}
    finally:
        domains.explain_infeasible = explain
    seconds = cpu() - begun
    status = found.status if found.status == "OPTIMAL" else f"{found.status} gap {100 * found.gap:.1f}% ({found.stopped})"
    return {"cpu": seconds, "status": status, "step": found.best.step.total,
            "layout": found.best.layout.describe()}


def enumeration(problem: Problem) -> dict:
    """The vectorised enumeration of ``problem``'s space: points, CPU-s and best step time."""
    begun = cpu()
    found = enumerate_space(problem)
    return {"cpu": cpu() - begun, "points": found.points, "step": found.best.step.total if found.best else math.inf}


def forked(run, problem: Problem) -> dict:
    """``run(problem)`` in a child forked from this process: every measurement starts from this
    process's caches, whatever ran before it (the child's CPU counters start at 0)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the result, exit without the parent's clean-up
        os.close(read)
        try:
            payload = pickle.dumps(run(problem))
        except BaseException as error:  # noqa: BLE001  reported by the parent
            payload = pickle.dumps({"error": repr(error)})
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as source:
        data = source.read()
    os.waitpid(pid, 0)
    found = pickle.loads(data)
    if "error" in found:
        raise RuntimeError(f"{run.__name__}: {found['error']}")
    return found


def measure(problem: Problem, repeats: int, enumerate_too: bool) -> tuple[dict, dict | None]:
    """The search and the enumeration, alternating (which goes first alternates too), ``repeats``
    times each; each side's run of least CPU-s."""
    sides = {"search": [], "enumeration": []}
    for i in range(repeats):
        order = [search, enumeration] if enumerate_too else [search]
        for run in order if i % 2 == 0 else order[::-1]:
            sides[run.__name__].append(forked(run, problem))
    least = {name: min(runs, key=lambda r: r["cpu"]) if runs else None for name, runs in sides.items()}
    return least["search"], least["enumeration"]


def cpu() -> float:
    """CPU-seconds of this process and its reaped children (CP-SAT's solves run in forked children)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="dense,moe,huge", help="groups to run: dense, moe, huge")
    ap.add_argument("--match", default="", help="only the cases whose name matches this regular expression")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating; the least CPU-s is reported")
    ap.add_argument("--no-enumeration", action="store_true", help="time the solves only")
    ap.add_argument("--no-command", action="store_true", help="skip the default command (runner-ups, robust choice)")
    args = ap.parse_args()
    groups = set(args.cases.split(","))
    print(environment())
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; each side run {args.repeats} times, "
          "alternating, in a child forked after the imports; the least CPU-s of each")
    print(f"{'case':30s} {'points':>11s} {'enum CPU-s':>10s} {'search CPU-s':>12s} {'ratio':>7s} {'agree':>5s} "
          f"{'status':>10s} {'command CPU-s':>13s} {'start-up':>8s}  layout")
    for group, model, target, domains in CASES:
        name = f"{model} {target} x{domains}"
        if group not in groups or not re.search(args.match, name):
            continue
        command = {"cpu": math.nan, "startup": math.nan} if args.no_command else run_solve(model, target, domains)
        problem = problem_of(model, target, domains)
        found, enumerated = measure(problem, args.repeats, not args.no_enumeration)
        points, enum_s, enum_step = (0, math.nan, math.nan) if enumerated is None else \
            (enumerated["points"], enumerated["cpu"], enumerated["step"])
        if math.isnan(enum_step):
            agree = "n/a"
        elif math.isinf(enum_step):  # no layout fits: the search must prove it
            agree = "yes" if found["status"].startswith("INFEASIBLE") else "NO"
        else:
            agree = "yes" if abs(found["step"] - enum_step) <= 1e-9 * enum_step else "NO"
        print(f"{name:30s} {points:11,d} {enum_s:10.2f} {found['cpu']:12.2f} {enum_s / found['cpu']:6.1f}x "
              f"{agree:>5s} {found['status']:>10s} {command['cpu']:13.2f} {command['startup']:8.2f}  "
              f"{found.get('layout', '')}", flush=True)


if __name__ == "__main__":
    main()
