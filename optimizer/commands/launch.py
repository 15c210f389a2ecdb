"""`trnopt launch`: the files that run a solved layout with torchrun, Slurm or Kubernetes (frameworks/launch.py)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks.launch import SCHEDULERS, launch_files, plan
from trnopt.optimizer.model.layoutfile import read_layout

DEFAULT_ENTRY = "python -m torchtitan.train"  # torchtitan 0.2.x's training entry point (torchtitan/train.py)
EXECUTABLE = (".sh", ".sbatch")


def register(sub) -> None:
    p = sub.add_parser("launch", help="write the files that run a layout (torchrun, Slurm or Kubernetes)",
                       description="Write the torchrun command per node, the LNC and EFA environment, the node order "
                                   "and core binding that put every rank where the plan put it, the torchtitan job "
                                   "config, and for Slurm and Kubernetes the constraint that an UltraServer's "
                                   "instances are scheduled and replaced as one unit. expected-rank-map.csv is the "
                                   "rank map the launch implies (trnopt check-map passes on it).")
    p.add_argument("--layout", required=True, help="the JSON that `trnopt solve --json` writes")
    p.add_argument("--scheduler", required=True, choices=SCHEDULERS, help="how the instances are started")
    p.add_argument("--out", default="trnopt-launch", help="directory to write (default trnopt-launch); it must not "
                                                          "exist or be empty unless --force")
    p.add_argument("--entry", default=DEFAULT_ENTRY,
                   help=f"training command each worker runs with --job.config_file job.toml (default: {DEFAULT_ENTRY})")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing its files")
    p.set_defaults(run=run)


def write_files(out: Path, files: dict[str, str], force: bool) -> None:
    """Write every file into ``out``; refuse a non-empty directory (or a file in the way) unless forced."""
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "--out", "exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError(str(out), "--out", "directory is not empty; trnopt never overwrites files "
                         "(pass --force to write into it)")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        if name.endswith(EXECUTABLE):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run(args: argparse.Namespace) -> int:
    target, workload, layout = read_layout(args.layout)
    launch = plan(workload, target, layout, args.scheduler, args.entry, os.path.basename(args.layout))
    files = launch_files(launch)
    write_files(Path(args.out), files, args.force)
    b = launch.binding
    print(f"trnopt launch: {launch.title()}")
    print(f"wrote {len(files)} files to {args.out}/ for {args.scheduler}: {', '.join(sorted(files))}")
    print(f"node order: {b.nodes} node rank(s) by UltraServer and position in nodes.csv; "
          + ("local ranks bound to their planned cores (worker.sh)" if b.bound
             else "local rank i on logical core i (no binding needed)"))
    return 0
