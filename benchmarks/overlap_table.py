"""Regenerate targets/measured/overlap.json: hidden fraction per (target, kernel, TP degree,
link class, LNC, shape class).

    python benchmarks/overlap_table.py --out targets/measured/overlap.json --force
    python benchmarks/overlap_table.py --targets trn2 --jobs 2      # one target, two processes

For each row, a representative layout places the TP group as the solver does (cores of a
chip first, then the fastest axes), or on the axis the row names (a TP group on the
trn2u ring); `trnopt.kernels.plan` gives its ring order, channels and per-channel link
model, the target's chip its SBUF capacity; both TP kernels then run through the overlap
harness (`trnopt.kernels.overlap.measure`: T_mm, T_cc, T_f) on the timeline only
(numerics=False; tests/kernels and benchmarks/kernel_overlap.py check the numerics).
The simulator runs symmetric (one representative rank) where that is exact and falls
back to every rank otherwise (the reduce-scatter reads its input at rank-dependent
offsets, which a symmetric run cannot check).

Shapes (shape class ``hidden<h>``): Llama 3 405B (hidden 16384) and 70B (8192), one
micro-batch of 8192 tokens, the narrowest TP projection (h x h/tp; see plan.full_shapes).
LNC: the layout's logical core; the simulator runs that many programs per rank (at LNC 2
the two physical cores split every kernel's work and share the rank's links), recorded as
``programs`` in each row. The file records its provenance
(commit, command, date, simulator commit).
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
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from trnopt.kernels.overlap import BF16, measure
from trnopt.kernels.plan import group_plan, local_ring
from trnopt.optimizer.cost.overlap import shape_class
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import load_target

VERSION = 1
SEQ = 8192
MODELS = {"llama3-405b": 16384, "llama3-70b": 8192}
KERNELS = ("allgather_matmul", "matmul_reduce_scatter")
# TP groups in a Trainium2 chip's cores and torus, at LNC=2 (4 ranks a chip) and LNC=1 (8)
TORUS = {2: [{"core": 2}, {"core": 4}, {"core": 4, "x": 2}, {"core": 4, "x": 4}, {"core": 4, "x": 4, "y": 2},
             {"core": 4, "x": 4, "y": 4}],
         1: [{"core": 2}, {"core": 4}, {"core": 8}, {"core": 8, "x": 2}, {"core": 8, "x": 4},
             {"core": 8, "x": 4, "y": 2}]}
BOTH = ("llama3-405b", "llama3-70b")
# target -> [(LNC, TP placements, models)]
CONFIGS = {
    "trn2": [(lnc, TORUS[lnc], BOTH) for lnc in (2, 1)],
    "trn2u": [(lnc, TORUS[lnc], BOTH) for lnc in (2, 1)]
             + [(2, [{"ring": 4}, {"core": 4, "ring": 4}], ("llama3-405b",)),
                (1, [{"ring": 4}, {"core": 8, "ring": 4}], ("llama3-405b",))],
    "trn3-gen1": [(2, [{"core": 4, "switch": f} for f in (2, 4, 8, 16)], ("llama3-405b",)),
                  (1, [{"core": 8, "switch": f} for f in (2, 4, 8)], ("llama3-405b",))],
    "trn3-gen2": [(2, [{"core": 4, "switch": f} for f in (4, 16)], ("llama3-405b",)),
                  (1, [{"core": 8, "switch": f} for f in (2, 8)], ("llama3-405b",))],
}


def representative_layout(target_name: str, lnc: int, tp_place: dict[str, int]) -> tuple[Layout, object]:
    target = load_target(target_name)
    axes = target.axes(lnc, 1)
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


def jobs(targets: list[str], max_tp: int) -> list[tuple]:
    out = []
    for name in targets:
        for lnc, places, models in CONFIGS[name]:
            for place in places:
                if math.prod(place.values()) > max_tp:
                    continue
                for model in models:
                    for kernel in KERNELS:
                        out.append((name, lnc, place, model, kernel))
    return out


def run_job(job: tuple) -> dict:
    name, lnc, place, model, kernel = job
    layout, target = representative_layout(name, lnc, place)
    g = group_plan(layout, target, "tp")
    ring = local_ring(g.first_group)
    shape = shapes(MODELS[model], layout.tp)[kernel]
    t0 = time.perf_counter()
    r = measure(kernel, shape, ring=ring, channels=g.channels, link=g.link, dtype=BF16, lnc=lnc,
                sbuf_bytes=target.chip.sbuf_bytes_per_partition, timeout_s=3600)
    return {"target": name, "kernel": kernel, "tp": layout.tp, "link_class": g.link_class, "lnc": lnc,
            "shape_class": shape_class(MODELS[model]), "model": model, "programs": lnc, "channels": g.channels,
            "placement": g.span, "link_gbs": round(g.link_gbs, 3), "latency_us": g.latency_us, "one_hop": g.one_hop,
            "shape": shape, "t_mm": r.t_mm, "t_cc": r.t_cc, "t_f": r.t_f, "hidden_fraction": r.hidden_fraction,
            "speedup": r.speedup, "sim_seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="-", help="JSON file to write ('-': stdout)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    ap.add_argument("--targets", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--max-tp", type=int, default=1 << 20, help="skip configurations with a larger TP degree")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out != "-" else None
    if out is not None and out.exists() and not args.force:
        print(f"overlap_table: {out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    command = ("python benchmarks/overlap_table.py"
               + (f" --targets {' '.join(args.targets)}" if args.targets != list(CONFIGS) else "")
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
                       "simulator_commit": sim_commit,
                       "uncommitted": sorted(line[3:] for line in dirty.splitlines()) if dirty else []},
        "simulator": {"package": "trnopt.kernels.sim",
                      "mode": "numerics=False (engine timeline only); symmetric runs where exact, else every rank"},
        "environment": f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus",
        "keys": "target, kernel, tp, link_class, lnc, shape_class (hidden<h>: Llama 3 405B 16384, 70B 8192; "
                "sequence 8192, micro-batch 1, bfloat16, the narrowest TP projection h x h/tp)",
        "definitions": "hidden_fraction = 1 - (t_f - t_mm) / t_cc, speedup = (t_mm + t_cc) / t_f "
                       "(kernels/overlap.py); times in seconds; link_gbs per channel (one ring direction, "
                       "kernels/plan.py); programs: programs simulated per rank",
        "lookup": "optimizer/cost/overlap.py: the target's rows (at the LNC), exact (kernel, tp, link_class) "
                  "taking the smallest over shape classes, else the nearest measured TP degree on the same link "
                  "class, else 0; a target without rows gets 0",
        "rows": [],
    }
    todo = jobs(args.targets, args.max_tp)
    print(f"overlap table: {len(todo)} rows, {args.jobs} process(es); sim commit {sim_commit[:10]}", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(run_job, todo):
            doc["rows"].append(row)
            print(f"{row['target']:<10}{row['kernel']:<22} tp {row['tp']:>3} {row['link_class']:<7}"
                  f"{row['shape_class']:<12} [{row['placement']}] ch {row['channels']} {row['link_gbs']:7.1f} GB/s  "
                  f"T_mm {row['t_mm'] * 1e6:9.1f}  T_cc {row['t_cc'] * 1e6:8.1f}  T_f {row['t_f'] * 1e6:9.1f} us  "
                  f"hidden {row['hidden_fraction']:6.3f}  ({row['sim_seconds']:.0f} s)", flush=True)
            if out is not None:
                out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if out is None:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
