"""Argument helpers shared by the commands: the problem flags, and turning them into a Problem."""

from __future__ import annotations

import argparse

from trnopt.optimizer import defaults
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """--model, --seq, --global-batch, --headroom."""
    p.add_argument("--model", default=defaults.MODEL, help=f"preset name or a .toml file (default {defaults.MODEL})")
    p.add_argument("--seq", type=int, default=defaults.SEQ, help=f"sequence length (default {defaults.SEQ})")
    p.add_argument("--global-batch", type=int, default=defaults.GLOBAL_BATCH,
                   help=f"sequences per step (default {defaults.GLOBAL_BATCH})")
    p.add_argument("--headroom", type=float, default=defaults.HEADROOM,
                   help=f"HBM share kept free (default {defaults.HEADROOM:.2f})")


def add_output_args(p: argparse.ArgumentParser) -> None:
    """--json FILE and --force."""
    p.add_argument("--json", metavar="FILE", help="also write JSON to FILE ('-' for stdout only)")
    p.add_argument("--force", action="store_true", help="allow --json to replace an existing file")


def add_search_args(p: argparse.ArgumentParser, time_help: str = "seconds for the whole search") -> None:
    """--objective, --time-limit, --workers, --seed."""
    p.add_argument("--objective", default=defaults.OBJECTIVE,
                   help=f"{' or '.join(defaults.OBJECTIVES)} (default {defaults.OBJECTIVE})")
    p.add_argument("--time-limit", type=float, default=defaults.TIME_LIMIT_S,
                   help=f"{time_help} (default {defaults.TIME_LIMIT_S:g})")
    p.add_argument("--workers", type=int, default=defaults.WORKERS, help=f"CP-SAT workers (default {defaults.WORKERS})")
    p.add_argument("--seed", type=int, default=defaults.SEED, help=f"CP-SAT random seed (default {defaults.SEED})")


def add_problem_args(p: argparse.ArgumentParser) -> None:
    """--target, --ultraservers | --instances, the workload flags and the output flags."""
    p.add_argument("--target", default=defaults.TARGET,
                   help=f"built-in target name or a .toml file (default {defaults.TARGET})")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ultraservers", type=int, help="number of UltraServers (scale-up domains) joined by EFA")
    size.add_argument("--instances", type=int, help="number of instances (for single-instance targets: trn1, trn2)")
    add_workload_args(p)
    add_output_args(p)


def domains_from_args(target: Target, args) -> int | None:
    """--ultraservers N is N domains; --instances N is N / instances-per-domain domains."""
    if args.ultraservers is not None:
        if args.ultraservers < 1:
            raise InputError("--ultraservers", "ultraservers", f"must be >= 1, got {args.ultraservers}")
        if target.instances_per_domain == 1:
            raise InputError("--ultraservers", "ultraservers", f"{target.name} has single-instance domains; "
                             "use --instances")
        return args.ultraservers
    if args.instances is not None:
        per = target.instances_per_domain
        if args.instances < 1 or args.instances % per:
            raise InputError("--instances", "instances", f"must be a positive multiple of {per} "
                             f"(instances per {target.name} domain), got {args.instances}")
        return args.instances // per
    return None


def workload_from_args(args) -> Workload:
    if not 0 <= args.headroom < 1:
        raise InputError("--headroom", "headroom", f"must be in [0, 1), got {args.headroom}")
    return Workload(load_model(args.model), Training(seq=args.seq, global_batch=args.global_batch))


def check_search_args(args) -> None:
    if args.objective not in defaults.OBJECTIVES:
        raise InputError("--objective", "objective", f"must be one of {', '.join(defaults.OBJECTIVES)}")
    if args.time_limit <= 0:
        raise InputError("--time-limit", "time-limit", f"must be > 0, got {args.time_limit:g}")


def zero_stages_from_args(args) -> tuple[int, ...]:
    """--zero-stages 0,1 restricts the search; --format nxd implies 0,1 (NxD Training has ZeRO-1 only)."""
    if args.zero_stages is None:
        return (0, 1) if args.format == "nxd" else defaults.ZERO_STAGES
    try:
        stages = tuple(sorted({int(v) for v in args.zero_stages.split(",")}))
    except ValueError:
        stages = ()
    if not stages or not set(stages) <= set(defaults.ZERO_STAGES):
        raise InputError("--zero-stages", "zero_stages", f"must be a comma list of 0-3, got {args.zero_stages!r}")
    return stages
