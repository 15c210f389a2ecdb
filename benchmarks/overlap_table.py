"""Regenerate targets/measured/overlap.json: hidden fraction per (target, kernel, TP degree,
link class, LNC, shape class).

    python benchmarks/overlap_table.py --out targets/measured/overlap.json --force
    python benchmarks/overlap_table.py --targets trn2 --jobs 2      # one target, two processes

Rows: every TP group the solver can place for the two models on each Trainium target, at
each LNC the chip allows, on two domains: one row per (TP degree, link class) and kernel,
so the cost model reads a measured row for any layout the search can choose. The
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

from trnopt.kernels import sim
from trnopt.kernels.overlap import BF16, measure
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
DOMAINS = 2  # two domains, so that groups across the scale-out network are measured too


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


def run_job(job: tuple) -> dict:
    name, lnc, place, model, kernel = job
    layout, target = representative_layout(name, lnc, place)
    g = group_plan(layout, target, "tp")
    ring = local_ring(g.first_group)
    hidden = load_model(model).hidden
    shape = shapes(hidden, layout.tp)[kernel]
    t0 = time.perf_counter()
    r = measure(kernel, shape, ring=ring, channels=g.channels, link=g.link, dtype=BF16, lnc=lnc,
                sbuf_bytes=target.chip.sbuf_bytes_per_partition, timeout_s=3600)
    return {"target": name, "kernel": kernel, "tp": layout.tp, "link_class": g.link_class, "lnc": lnc,
            "shape_class": shape_class(hidden), "model": model, "programs": lnc, "channels": g.channels,
            "placement": g.span, "link_gbs": round(g.link_gbs, 3), "latency_us": g.latency_us, "one_hop": g.one_hop,
            "shape": shape, "t_mm": r.t_mm, "t_cc": r.t_cc, "t_f": r.t_f, "hidden_fraction": r.hidden_fraction,
            "speedup": r.speedup, "sim_seconds": round(time.perf_counter() - t0, 1)}


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
