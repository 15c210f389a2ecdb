"""Regenerate targets/measured/overlap.json: hidden fraction per (target, kernel, TP degree,
link class, LNC, shape class).

    python benchmarks/overlap_table.py --out targets/measured/overlap.json --force
    python benchmarks/overlap_table.py --targets trn2 --jobs 2      # one target, two processes

Rows: every TP group the solver can place for the two models on each Trainium target, at
each LNC the chip allows, on two domains: one row per (TP degree, link class) and kernel,
so the cost model reads a simulated row for any layout the search can choose. The
representative placement of a (degree, link class) is `space.group_spans`'s: the most
ranks on the innermost axes (cores of a chip first), crossing the slowest link class with
the smallest factor that crosses it. `trnopt.kernels.plan` gives its ring order, channels
and per-channel link model, the target's chip its SBUF capacity; both TP kernels then run
through the overlap harness (`trnopt.kernels.overlap.measure`: T_mm, T_cc, T_f) on the
timeline only (numerics=False; tests/kernels and benchmarks/kernel_overlap.py check the
numerics).
The simulator runs symmetric (one representative rank) where that is exact and falls
back to every rank otherwise (the reduce-scatter reads its input at rank-dependent
offsets, which a symmetric run cannot check).

Shapes (shape class ``hidden<h>``): Llama 3 405B (hidden 16384, TP degrees up to 128)
and 70B (8192, up to 64; `space.tp_degrees`), one micro-batch of 8192 tokens, the
narrowest TP projection (h x h/tp; see plan.full_shapes).
LNC: the layout's logical core; the simulator runs that many programs per rank (at LNC 2
the two physical cores split every kernel's work and share the rank's links), recorded as
``programs`` in each row. Generation: each target's chip runs on its own rate set of the
simulator (`SIM_GENERATION`: Trainium2 at NeuronCore-v3's, Trainium3 at v4's), recorded as
``sim_generation``. The file records its provenance (commit, command, date, simulator
commit and version, CPU-seconds).

Cost, and why every row is a full simulation at 8192 tokens: two exact savings. T_mm, the
undecomposed matmul, moves nothing over a link, so it is simulated once per (generation,
kernel, shape, LNC, SBUF) and passed to every row of that shape (`overlap.baseline`,
``measure(t_mm=)``; tests/kernels/test_overlap.py holds the rows equal to whole
measurements); and rows whose simulator inputs are all equal (a group of one chip's cores
on trn2 and on trn2u, whose chips and links are the same) are one run, named by ``run`` in
each row. 542 rows are 298 runs and 104 baselines: 1,505 CPU-seconds at simulator 1.2 (on a
2-core machine shared with other work, 42 minutes with two processes).
A cheaper approximation was tried and not used: simulating each row at 1024 and 2048 tokens
and extrapolating each time affinely in the tokens to 8192 (the kernels loop over token
tiles). Against the full runs on 12 rows (both kernels, every link class, both LNCs, TP 2
to 128) the largest errors were 8.8% in T_mm, 230% in T_cc, 68% in T_f and 1.77 in the hidden
fraction; on the TP2 and TP4 rows alone, where a full run costs most, 9.9% in T_f and 0.62 in
the hidden fraction (goal: 1% and 0.01). The kernels' plans change with the tokens per rank
(tiles per call, ring slabs, whether the ring fits on chip, the rows that fill the
pipeline), so the times are not affine in the tokens below 8192; and the two small runs cost
about as much CPU as the full one does once T_mm is shared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from trnopt.kernels import sim
from trnopt.kernels.sim import rates
from trnopt.kernels.overlap import BF16, baseline, measure
from trnopt.kernels.plan import group_plan, local_ring
from trnopt.optimizer.cost.overlap import shape_class
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import load_model
from trnopt.optimizer.search.space import group_spans, tp_degrees

VERSION = 1
SEQ = 8192
MODELS = ("llama3-405b", "llama3-70b")
KERNELS = ("allgather_matmul", "matmul_reduce_scatter")
TARGETS = ("trn2", "trn2u", "trn3-gen1", "trn3-gen2")
DOMAINS = 2  # two domains, so that groups across the scale-out network are simulated too
#: How the rows were simulated (written into the table; the module docstring says why).
METHOD = ("every row simulated in full at its shape (8192 tokens), on its chip's generation rates "
          "(sim_generation); T_mm simulated once per (generation, kernel, shape, LNC, SBUF) and shared by "
          "the rows of that shape (the baseline matmul uses no link); rows with equal simulator inputs "
          "share one run (run); nothing extrapolated")
#: The simulator's rate set (`kernels.sim.rates.GENERATIONS`) of each target's chip: NeuronCore-v2
#: in Trainium, v3 in Trainium2, v4 in Trainium3 (the AWS architecture pages of each chip).
SIM_GENERATION = {"Trainium": "trn1", "Trainium2": "trn2", "Trainium3": "trn3"}


def representative_layout(target_name: str, lnc: int, tp_place: dict[str, int]) -> tuple[Layout, object]:
    target = load_target(target_name)
    axes = target.axes(lnc, DOMAINS)
    tp_row = tuple(tp_place.get(a.name, 1) for a in axes)
    dp_row = tuple(a.size // f for a, f in zip(axes, tp_row))
    rows = tuple(tp_row if d == "tp" else dp_row if d == "dp" else (1,) * len(axes) for d in DIMS)
    tp = math.prod(tp_row)
    ranks = math.prod(a.size for a in axes)
    return Layout(tp=tp, pp=1, dp=ranks // tp, axes=axes, placement=rows, lnc=lnc), target


def git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def shapes(hidden: int, tp: int) -> dict[str, dict[str, int]]:
    return {"allgather_matmul": {"m": SEQ, "k": hidden, "n": hidden // tp},
            "matmul_reduce_scatter": {"m": SEQ, "k": hidden // tp, "n": hidden}}


def tp_groups(target_name: str, lnc: int, model_name: str) -> dict[tuple[int, str], dict[str, int]]:
    """The TP groups the solver can place for the model: (degree, link class) -> the
    representative placement (axis name -> factor), `space.group_spans`."""
    axes = load_target(target_name).axes(lnc, DOMAINS)
    model = load_model(model_name)
    degrees = tp_degrees(model.heads, model.kv_heads, math.prod(a.size for a in axes))
    return {key: {a.name: f for a, f in span} for key, span in group_spans(axes, degrees).items()}


def jobs(targets: list[str], max_tp: int) -> list[tuple]:
    out = []
    for name in targets:
        for lnc in load_target(name).chip.lnc_allowed:
            for model in MODELS:
                for (tp, _), place in tp_groups(name, lnc, model).items():
                    if tp <= max_tp:
                        out.extend((name, lnc, place, model, kernel) for kernel in KERNELS)
    return out


@dataclass(frozen=True)
class Row:
    """One table row before simulation: the job, its TP group's plan and what the simulator takes."""

    job: tuple  #: (target, lnc, placement, model, kernel) of `jobs`
    plan: Any  #: `plan.group_plan` of the representative layout
    tp: int  #: the TP degree
    hidden: int  #: the model's hidden size
    shape: dict  #: the kernel's shape (`shapes`)
    generation: str  #: the simulator's rate set (`SIM_GENERATION`)
    sbuf: int  #: SBUF bytes per partition of the target's chip

    @property
    def baseline_key(self) -> tuple:
        """What T_mm depends on: the baseline matmul runs on one core and moves nothing over a link."""
        return (self.generation, self.job[4], tuple(self.shape.items()), self.job[1], self.sbuf)

    @property
    def run_key(self) -> tuple:
        """Every input of the simulation: rows with equal keys are one run (e.g. a group of the
        cores of one chip, the same on trn2 and trn2u)."""
        g = self.plan
        return self.baseline_key + (tuple(local_ring(g.first_group)), g.channels, repr(g.link))


def plan_row(job: tuple) -> Row:
    name, lnc, place, model, kernel = job
    layout, target = representative_layout(name, lnc, place)
    hidden = load_model(model).hidden
    return Row(job, group_plan(layout, target, "tp"), layout.tp, hidden, shapes(hidden, layout.tp)[kernel],
               SIM_GENERATION[target.chip.name], target.chip.sbuf_bytes_per_partition)


def run_baseline(key: tuple) -> tuple[float, float]:
    """(T_mm, CPU seconds) of a `Row.baseline_key`."""
    gen, kernel, shape, lnc, sbuf = key
    c0 = time.process_time()
    with rates.generation(gen):
        t = baseline(kernel, dict(shape), lnc=lnc, sbuf_bytes=sbuf, dtype=BF16, timeout_s=3600)
    return t, time.process_time() - c0


def run_measure(args: tuple[Row, float]) -> tuple[Any, float]:
    """(`OverlapResult`, CPU seconds) of a row given its T_mm."""
    row, t_mm = args
    g = row.plan
    c0 = time.process_time()
    with rates.generation(row.generation):
        r = measure(row.job[4], row.shape, ring=local_ring(g.first_group), channels=g.channels, link=g.link,
                    dtype=BF16, lnc=row.job[1], sbuf_bytes=row.sbuf, timeout_s=3600, t_mm=t_mm)
    return r, time.process_time() - c0


def row_dict(row: Row, r: Any, run: int, cpu: float) -> dict:
    name, lnc, _, model, kernel = row.job
    g = row.plan
    return {"target": name, "kernel": kernel, "tp": row.tp, "link_class": g.link_class, "lnc": lnc,
            "shape_class": shape_class(row.hidden), "model": model, "programs": lnc, "channels": g.channels,
            "placement": g.span, "link_gbs": round(g.link_gbs, 3), "latency_us": g.latency_us, "one_hop": g.one_hop,
            "shape": row.shape, "sim_generation": row.generation, "t_mm": r.t_mm, "t_cc": r.t_cc, "t_f": r.t_f,
            "hidden_fraction": r.hidden_fraction, "speedup": r.speedup, "run": run, "cpu_seconds": round(cpu, 1)}


def _cost(key: tuple) -> int:
    """Rough simulation cost of a run or baseline key (matmul instructions per program), to
    start the longest first."""
    shape = dict(key[2])
    return shape["m"] * shape["k"] * shape["n"] // key[3]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="-", help="JSON file to write ('-': stdout)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    ap.add_argument("--max-tp", type=int, default=1 << 20, help="skip configurations with a larger TP degree")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out != "-" else None
    if out is not None and out.exists() and not args.force:
        print(f"overlap_table: {out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    command = ("python benchmarks/overlap_table.py"
               + (f" --targets {' '.join(args.targets)}" if args.targets != list(TARGETS) else "")
               + (f" --max-tp {args.max_tp}" if args.max_tp < 1 << 20 else "")
               + " --out targets/measured/overlap.json --force")
    sim_commit = git("log", "-1", "--format=%H", "--", "kernels/sim")
    dirty = git("status", "--porcelain", "--", "kernels")
    date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {
        "version": VERSION,
        "command": command,
        "generated": date,
        "provenance": {"commit": git("rev-parse", "HEAD"), "command": command, "date": date,
                       "simulator_commit": sim_commit, "simulator_version": sim.__version__,
                       # Each porcelain line is "XY path"; split, not slice, since git() strips the first line's leading blank.
                       "uncommitted": sorted(line.split(maxsplit=1)[1] for line in dirty.splitlines()) if dirty else []},
        "simulator": {"package": "trnopt.kernels.sim",
                      "mode": "numerics=False (engine timeline only); symmetric runs where exact, else every rank",
                      "method": METHOD},
        "environment": f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus",
        "keys": "target, kernel, tp, link_class, lnc, shape_class (hidden<h>: Llama 3 405B 16384, 70B 8192; "
                "sequence 8192, micro-batch 1, bfloat16, the narrowest TP projection h x h/tp)",
        "definitions": "hidden_fraction = 1 - (t_f - t_mm) / t_cc, speedup = (t_mm + t_cc) / t_f "
                       "(kernels/overlap.py); times in seconds; link_gbs per channel (one ring direction, "
                       "kernels/plan.py); programs: programs simulated per rank",
        "lookup": "optimizer/cost/overlap.py: the target's rows (at the LNC), exact (kernel, tp, link_class) "
                  "taking the smallest over shape classes, else the nearest simulated TP degree on the same link "
                  "class, else 0; a target without rows gets 0",
        "rows": [],
    }
    rows = [plan_row(job) for job in jobs(args.targets, args.max_tp)]
    runs = list(dict.fromkeys(r.run_key for r in rows))
    bases = sorted(set(r.baseline_key for r in rows), key=_cost, reverse=True)
    print(f"overlap table: {len(rows)} rows, {len(runs)} distinct simulations, {len(bases)} baseline matmuls, "
          f"{args.jobs} process(es); sim commit {sim_commit[:10]}", flush=True)
    c0 = time.process_time()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        t_mm, cpu = {}, {}
        for key, (t, c) in zip(bases, pool.map(run_baseline, bases)):
            t_mm[key], cpu[key] = t, c
            print(f"baseline {key[0]} {key[1]:<22} {dict(key[2])} lnc {key[3]}: T_mm {t * 1e6:10.1f} us "
                  f"({c:.0f} cpu-s)", flush=True)
        first = {key: next(r for r in rows if r.run_key == key) for key in runs}
        order = sorted(runs, key=_cost, reverse=True)
        results = {}
        for key, (res, c) in zip(order, pool.map(run_measure, [(first[k], t_mm[k[:5]]) for k in order])):
            results[key] = (res, c)
            r = first[key]
            print(f"{r.job[0]:<10}{r.job[4]:<22} tp {r.tp:>3} {r.plan.link_class:<10} lnc {r.job[1]} "
                  f"{shape_class(r.hidden):<12} T_mm {res.t_mm * 1e6:9.1f}  T_cc {res.t_cc * 1e6:8.1f}  "
                  f"T_f {res.t_f * 1e6:9.1f} us  hidden {res.hidden_fraction:6.3f}  ({c:.0f} cpu-s)", flush=True)
    index = {key: i for i, key in enumerate(runs)}
    doc["rows"] = [row_dict(r, results[r.run_key][0], index[r.run_key], results[r.run_key][1]) for r in rows]
    workers = sum(c for _, c in results.values()) + sum(cpu.values())
    doc["provenance"]["cpu_seconds"] = {"simulation": round(workers, 1),
                                        "main process": round(time.process_time() - c0, 1)}
    if out is not None:
        out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if out is None:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
