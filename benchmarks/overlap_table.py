"""Regenerate targets/measured/overlap.json: hidden fraction per (kernel, TP degree, link class).

    python benchmarks/overlap_table.py --out targets/measured/overlap.json --force

For each row, a representative layout places the TP group as the solver does (cores of a
chip first, then the fastest axes), or on the axis the row names (a TP group on the
trn2u ring, the "classic silent slowdown"); `trnopt.kernels.plan` gives its ring order,
channels and per-channel link model; both TP kernels then run on all ranks of that group
in the simulator, three variants each (T_mm, T_cc, T_f, DESIGN section 7), on the
timeline only (numerics=False: the full shapes are too large to simulate with data here;
tests/kernels and `trnopt kernels` check the numerics at scaled shapes).

Shape: Llama 3 405B (the default model), one micro-batch of 8192 tokens, hidden 16384,
the narrowest TP projection (h x h/tp; see plan.full_shapes). `--m` scales M down when a
full run is too slow; the file records the shape actually run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import ml_dtypes
import numpy as np

from trnopt.kernels.overlap import measure_overlap
from trnopt.kernels.sim import run_ranks
from trnopt.kernels.plan import group_plan, local_ring, overlap_variants
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import load_target

VERSION = 1
BF16 = np.dtype(ml_dtypes.bfloat16)
HIDDEN, SEQ = 16384, 8192
KERNELS = ("allgather_matmul", "matmul_reduce_scatter")

# (target, LNC, TP placement): the TP group's factor per axis; everything else is DP.
CONFIGS = [
    ("trn2u", 2, {"core": 2}),
    ("trn2u", 2, {"core": 4}),
    ("trn2u", 2, {"core": 4, "x": 2}),
    ("trn2u", 2, {"core": 4, "x": 4}),
    ("trn2u", 2, {"core": 4, "x": 4, "y": 2}),
    ("trn2u", 2, {"core": 4, "x": 4, "y": 4}),
    ("trn2u", 2, {"ring": 4}),
    ("trn2u", 2, {"core": 4, "ring": 4}),
    ("trn2u", 2, {"core": 4, "x": 4, "y": 4, "ring": 2}),
    ("trn3-gen1", 2, {"core": 4, "switch": 2}),
    ("trn3-gen1", 2, {"core": 4, "switch": 4}),
    ("trn3-gen1", 2, {"core": 4, "switch": 8}),
    ("trn3-gen1", 2, {"core": 4, "switch": 16}),
    ("trn3-gen1", 2, {"core": 4, "switch": 32}),
]


def representative_layout(target_name: str, lnc: int, tp_place: dict[str, int]) -> tuple[Layout, object]:
    target = load_target(target_name)
    axes = target.axes(lnc, 1)
    tp_row = tuple(tp_place.get(a.name, 1) for a in axes)
    dp_row = tuple(a.size // f for a, f in zip(axes, tp_row))
    rows = tuple(tp_row if d == "tp" else dp_row if d == "dp" else (1,) * len(axes) for d in DIMS)
    tp = int(np.prod(tp_row))
    ranks = int(np.prod([a.size for a in axes]))
    return Layout(tp=tp, pp=1, dp=ranks // tp, axes=axes, placement=rows, lnc=lnc), target


def git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="-", help="JSON file to write ('-': stdout)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    ap.add_argument("--m", type=int, default=SEQ, help=f"rows M of the activation block (default {SEQ}, full)")
    ap.add_argument("--max-tp", type=int, default=1 << 20, help="skip configurations with a larger TP degree")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out != "-" else None
    if out is not None and out.exists() and not args.force:
        print(f"overlap_table: {out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    symmetric = "symmetric" in inspect.signature(run_ranks).parameters
    sim_commit = git("log", "-1", "--format=%H", "--", "kernels/sim")
    dirty = bool(git("status", "--porcelain", "--", "kernels/sim", "kernels/allgather_matmul.py",
                     "kernels/matmul_reduce_scatter.py", "kernels/tiling.py"))
    doc = {
        "version": VERSION,
        "command": "python benchmarks/overlap_table.py" + (f" --m {args.m}" if args.m != SEQ else "")
                   + (f" --max-tp {args.max_tp}" if args.max_tp < 1 << 20 else "")
                   + " --out targets/measured/overlap.json --force",
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "simulator": {"package": "trnopt.kernels.sim", "commit": sim_commit,
                      "dirty": dirty,  # uncommitted changes in kernels/sim or the kernels when generated
                      "mode": "numerics=False (engine timeline only, no data)"
                              + ("; run_ranks' default symmetric=None (one representative rank when the "
                                 "ranks' arguments agree)" if symmetric else "; every rank simulated")},
        "environment": f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus",
        "shape": {"model": "llama3-405b", "m": args.m, "hidden": HIDDEN, "dtype": "bfloat16",
                  "full": args.m == SEQ,
                  "allgather_matmul": "X [M x hidden] gathered, W [hidden x hidden/tp]",
                  "matmul_reduce_scatter": "X [M x hidden/tp] @ W [hidden/tp x hidden], reduce-scattered"},
        "definitions": "hidden_fraction = 1 - (t_f - t_mm) / t_cc (kernels/overlap.py); times in seconds; "
                       "link_gbs per channel (one ring direction), see kernels/plan.py",
        "lookup": "optimizer/overlapdata.py: exact (kernel, tp, link_class), else the nearest measured TP "
                  "degree on the same link class (in log2; ties take the smaller fraction), else 0",
        "rows": [],
    }
    print(f"overlap table: M {args.m}, hidden {HIDDEN}, bfloat16, numerics=False; sim commit {sim_commit[:10]}"
          f"{' (dirty)' if dirty else ''}", flush=True)
    for target_name, lnc, place in CONFIGS:
        layout, target = representative_layout(target_name, lnc, place)
        if layout.tp > args.max_tp:
            continue
        g = group_plan(layout, target, "tp")
        ring = local_ring(g.replica_groups[0])
        shapes = {"allgather_matmul": (args.m, HIDDEN, HIDDEN // layout.tp),
                  "matmul_reduce_scatter": (args.m, HIDDEN // layout.tp, HIDDEN)}
        for kernel in KERNELS:
            m, k, n = shapes[kernel]
            t0 = time.perf_counter()
            mm, cc_, fused, _ = overlap_variants(kernel, ring, m, k, n, BF16, g.channels, numerics=False)
            r = measure_overlap(mm=mm, cc=cc_, fused=fused, link=g.link, numerics=False, timeout_s=3600)
            el = time.perf_counter() - t0
            row = {"kernel": kernel, "tp": layout.tp, "link_class": g.link_class, "channels": g.channels,
                   "target": target_name, "lnc": lnc, "placement": g.span, "link_gbs": round(g.link_gbs, 3),
                   "latency_us": g.latency_us, "one_hop": g.one_hop, "shape": {"m": m, "k": k, "n": n},
                   "t_mm": r.t_mm, "t_cc": r.t_cc, "t_f": r.t_f, "hidden_fraction": r.hidden_fraction,
                   "speedup": r.speedup, "sim_seconds": round(el, 1)}
            doc["rows"].append(row)
            print(f"{kernel:<22} tp {layout.tp:>3} {g.link_class:<9} [{g.span}] ch {g.channels} "
                  f"{g.link_gbs:7.1f} GB/s  T_mm {r.t_mm * 1e6:9.1f} us  T_cc {r.t_cc * 1e6:8.1f} us  "
                  f"T_f {r.t_f * 1e6:9.1f} us  hidden {r.hidden_fraction:6.3f}  ({el:.0f} s)", flush=True)
            if out is not None:
                out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if out is None:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
