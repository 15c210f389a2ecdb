"""`trnopt launch`: the files that run a solved layout with torchrun, Slurm or Kubernetes (frameworks/launch.py).

Exit 0 when the files are written; 1 when the layout does not fit its chips' memory (the
layout JSON is re-evaluated on load, as ``trnopt evaluate`` does: a file edited to name a
bigger model must not become job files); 2 for bad input (the layout, --entry, --out).
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path

from trnopt.optimizer import defaults
from trnopt.optimizer.commands.args import check_float, load_runnable_layout
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks.launch import SCHEDULERS, entry_words, launch_files, plan
from trnopt.optimizer.frameworks.torchtitan import FSDP_MODES

DEFAULT_ENTRY = "python -m torchtitan.train"  # torchtitan 0.2.x's training entry point (torchtitan/train.py)
EXECUTABLE = (".sh", ".sbatch")


def register(sub) -> None:
    p = sub.add_parser("launch", help="write the files that run a layout (torchrun, Slurm or Kubernetes)",
                       description="Write the torchrun command per node, the LNC and EFA environment, the node order "
                                   "and core binding that put every rank where the plan put it, the torchtitan job "
                                   "config, and for Slurm and Kubernetes the constraint that an UltraServer's "
                                   "instances are scheduled and replaced as one unit. expected-rank-map.csv is the "
                                   "rank map the launch implies (trnopt check-map passes on it). Exit 1 (no files) "
                                   "when the layout does not fit its chips' memory.")
    p.add_argument("--layout", required=True, help="the JSON that `trnopt solve --json` writes")
    p.add_argument("--scheduler", required=True, choices=SCHEDULERS, help="how the instances are started")
    p.add_argument("--out", default="trnopt-launch", help="directory to write (default trnopt-launch); it must not "
                                                          "exist or be empty unless --force")
    p.add_argument("--entry", default=DEFAULT_ENTRY,
                   help="training command each worker runs with --job.config_file job.toml, split into words as "
                        f"a shell would (quotes group words; nothing else is interpreted) (default: {DEFAULT_ENTRY})")
    p.add_argument("--fsdp", choices=FSDP_MODES, default=defaults.TORCHTITAN_FSDP,
                   help="torchtitan's data-parallel sharding: simple (SimpleFSDP, what Neuron recommends under "
                        "torch.compile) or fsdp2 (fully_shard) (default: %(default)s)")
    p.add_argument("--headroom", type=float, default=defaults.HEADROOM,
                   help=f"HBM share kept free when the layout is re-evaluated (default {defaults.HEADROOM:.2f})")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing its files")
    p.set_defaults(run=run)


def _refuse(out: Path, why: str) -> InputError:
    return InputError(str(out), "--out", why)


def check_out(out: Path, names, force: bool) -> None:
    """Refuse an --out that cannot take the files, before any is written: a dangling symlink, a file, a
    non-empty directory without --force, and (even with --force) an entry that is not a regular file or is a
    symlink (it could lead outside --out)."""
    if out.is_symlink() and not out.exists():
        raise _refuse(out, "is a symlink to nothing")
    if out.exists() and not out.is_dir():
        raise _refuse(out, "exists and is not a directory")
    if not out.is_dir():
        return
    if any(out.iterdir()) and not force:
        raise _refuse(out, "directory is not empty; trnopt never overwrites files (pass --force to write into it)")
    for name in names:
        path = out / name
        if path.is_symlink():
            raise _refuse(out, f"{name} is a symlink; trnopt writes no file through one (remove it)")
        if path.exists() and not path.is_file():
            raise _refuse(out, f"{name} exists and is not a regular file")


def write_files(out: Path, files: dict[str, str], force: bool) -> None:
    """Write every file into ``out``; refuse what ``check_out`` refuses. An OS error (a path under /proc, no
    permission, a full disk) is bad input naming --out, not a crash."""
    check_out(out, files, force)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            mode = 0o755 if name.endswith(EXECUTABLE) else 0o644
            # O_NOFOLLOW: a symlink put there after the check is refused, not followed.
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            if name.endswith(EXECUTABLE):
                path = out / name
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        why = "a symlink appeared in it" if exc.errno == errno.ELOOP else (exc.strerror or type(exc).__name__)
        raise _refuse(out, f"cannot be written: {why}") from None


def run(args: argparse.Namespace) -> int:
    check_float(args.headroom, "--headroom", 0.0, 1.0, open_high=True)
    entry_words(args.entry)  # bad input before any work
    # the file's own numbers are not trusted: scored again, and checked against its framework's rules
    target, workload, layout, _ = load_runnable_layout(args.layout, args.headroom)
    launch = plan(workload, target, layout, args.scheduler, args.entry, os.path.basename(args.layout),
                  fsdp=args.fsdp)
    files = launch_files(launch)
    write_files(Path(args.out), files, args.force)
    b = launch.binding
    print(f"trnopt launch: {launch.title()}")
    print(f"wrote {len(files)} files to {args.out}/ for {args.scheduler}: {', '.join(sorted(files))}")
    print(f"node order: {b.nodes} node rank(s) by UltraServer and position in nodes.csv; "
          + ("local ranks bound to their planned cores (worker.sh)" if b.bound
             else "local rank i on logical core i (no binding needed)"))
    return 0
