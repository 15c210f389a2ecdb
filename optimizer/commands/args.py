"""Argument helpers shared by the commands: the problem flags, their checks, and turning them into a Problem.

Every flag a user gives is checked here before any work starts: integers and numbers in
their ranges (finite, within bounds.py for sizes), names that exist, output paths that can
be written. A broken rule is ``InputError(FLAG, KEY, RULE)`` (exit 2).
"""

from __future__ import annotations

import argparse
import math
import os
import re

from trnopt.optimizer import defaults
from trnopt.optimizer.commands.output import check_output, write_stream
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import DoesNotFitError, InputError
from trnopt.optimizer.model import bounds
from trnopt.optimizer.frameworks.profile import check_runs
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.layoutfile import layout_framework, read_layout
from trnopt.optimizer.model.partial import candidates, parse_names
from trnopt.optimizer.model.placement import MAX_CSV_RANKS, rank_map_csv
from trnopt.optimizer.model.scale import check_scale
from trnopt.optimizer.model.target import GIB, Target, check_domains
from trnopt.optimizer.model.workload import Training, Workload, load_model

MAX_WORKERS = 64             # CP-SAT workers: far more than the cores of any machine trnopt runs on
MAX_SEED = 2**31 - 1         # CP-SAT's random_seed is a 32-bit signed integer
MAX_TIME_LIMIT_S = 7 * 86400.0
MAX_TOP = 50                 # runner-up layouts shown


def ascii_int(text: str) -> int:
    """argparse type: an integer in ASCII digits (int() also reads other scripts' digits, e.g. Arabic-Indic)."""
    if not re.fullmatch(r"\s*-?[0-9]{1,12}\s*", text):
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, got {text[:40]!r}")
    return int(text)


def check_int(value, flag: str, lowest: int, highest: int) -> int | None:
    """``value`` (None passes) as an integer in [lowest, highest], else InputError naming the flag."""
    if value is None:
        return None
    key = flag.lstrip("-").replace("-", "_")
    if value < lowest:
        raise InputError(flag, key, f"must be >= {lowest}, got {value}")
    if value > highest:
        raise InputError(flag, key, f"must be <= {highest:,}, got {value:,}" if value.bit_length() < 200
                         else f"must be <= {highest:,}, got an integer of {value.bit_length()} bits")
    return value


def check_float(value, flag: str, lowest: float, highest: float, open_low: bool = False,
                open_high: bool = False) -> float:
    """``value`` finite and in its range (ends open or closed)."""
    key = flag.lstrip("-").replace("-", "_")
    low = f"({lowest:g}" if open_low else f"[{lowest:g}"
    high = f"{highest:g})" if open_high else f"{highest:g}]"
    if (not math.isfinite(value) or value < lowest or value > highest or (open_low and value == lowest)
            or (open_high and value == highest)):
        raise InputError(flag, key, f"must be a finite number in {low}, {high}, got {value:g}")
    return value


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """--model, --seq, --global-batch, --headroom."""
    p.add_argument("--model", default=defaults.MODEL, help=f"preset name or a .toml file (default {defaults.MODEL})")
    p.add_argument("--seq", type=ascii_int, default=defaults.SEQ, help=f"sequence length (default {defaults.SEQ})")
    p.add_argument("--global-batch", type=ascii_int, default=defaults.GLOBAL_BATCH,
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
    p.add_argument("--workers", type=ascii_int, default=defaults.WORKERS, help=f"CP-SAT workers (default {defaults.WORKERS})")
    p.add_argument("--seed", type=ascii_int, default=defaults.SEED, help=f"CP-SAT random seed (default {defaults.SEED})")


def add_problem_args(p: argparse.ArgumentParser) -> None:
    """--target, --ultraservers | --instances, the workload flags and the output flags."""
    p.add_argument("--target", default=defaults.TARGET,
                   help=f"built-in target name or a .toml file (default {defaults.TARGET})")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ultraservers", type=ascii_int, help="number of UltraServers (scale-up domains) joined by EFA")
    size.add_argument("--instances", type=ascii_int, help="number of instances (for single-instance targets: trn1, trn2)")
    add_workload_args(p)
    add_output_args(p)


def load_runnable_layout(path: str, headroom: float = 0.0) -> tuple[Target, Workload, Layout, Evaluation]:
    """A layout file (``read_layout``: every key checked) scored again by the cost model (``Problem.evaluate``).

    The file's numbers are not trusted (a hand-edited ``problem.model`` keeps the old
    ``fits``); a layout whose memory per chip exceeds the chip's HBM cannot run and raises
    DoesNotFitError (exit 1, as `trnopt evaluate` on a layout that does not fit). The file
    does not record the headroom its solve kept, so by default the check is against the whole
    HBM (``headroom`` 0): a layout trnopt solved with any headroom passes, one no chip holds does not.
    A layout that breaks a rule of the framework the file names (``profile.check_runs``) is
    bad input (exit 2, naming the rule).
    """
    target, workload, layout = read_layout(path)
    check_runs(layout, workload, layout_framework(path), path)
    problem = Problem(workload, target, layout.domains, headroom=headroom)
    evaluation = problem.evaluate(layout)
    if not evaluation.fits:
        raise DoesNotFitError(f"{path}: the layout does not fit: {layout.describe()} needs "
                              f"{evaluation.memory.total / GIB:.1f} GiB per chip running {workload.model.name} "
                              f"on {target.name}, {evaluation.usable_bytes / GIB:.1f} GiB of HBM usable "
                              "(`trnopt evaluate` scores it); nothing written")
    return target, workload, layout, evaluation


def domains_from_args(target: Target, args) -> int | None:
    """--ultraservers N is N domains; --instances N is N / instances-per-domain domains (at most bounds.MAX_CHIPS chips)."""
    if args.ultraservers is not None:
        check_int(args.ultraservers, "--ultraservers", 1, bounds.MAX_DOMAINS)
        if target.instances_per_domain == 1:
            raise InputError("--ultraservers", "ultraservers", f"{target.name} has single-instance domains; "
                             "use --instances")
        check_domains(target, args.ultraservers, "--ultraservers", "ultraservers")
        return args.ultraservers
    if args.instances is not None:
        per = target.instances_per_domain
        check_int(args.instances, "--instances", 1, bounds.MAX_CHIPS)
        if args.instances % per:
            raise InputError("--instances", "instances", f"must be a positive multiple of {per} "
                             f"(instances per {target.name} domain), got {args.instances}")
        check_domains(target, args.instances // per, "--instances", "instances")
        return args.instances // per
    return None


def exclude_from_args(target: Target, domains: int, args) -> list[Target]:
    """--exclude NAMES on the whole machine of ``domains`` domains: the candidate machines left
    (model/partial.py), each name checked (exists, given once) and something left."""
    return candidates(target, domains, parse_names(target, domains, args.exclude))


def lnc_from_args(target: Target, args) -> int | None:
    """--lnc: None (search every allowed value, or the target's default), else one the chip allows."""
    if args.lnc is None:
        return None
    if args.lnc not in target.chip.lnc_allowed:
        raise InputError("--lnc", "lnc", f"LNC={args.lnc} is not allowed on {target.name} "
                         f"(allowed: {', '.join(map(str, target.chip.lnc_allowed))})")
    return args.lnc


def workload_from_args(args) -> Workload:
    check_float(args.headroom, "--headroom", 0.0, 1.0, open_high=True)
    check_int(args.seq, "--seq", 1, bounds.MAX_SEQ)
    check_int(args.global_batch, "--global-batch", 1, bounds.MAX_GLOBAL_BATCH)
    workload = Workload(load_model(args.model), Training(seq=args.seq, global_batch=args.global_batch))
    check_scale(workload, args.model, "--model", "--seq", "seq")
    return workload


def check_search_args(args) -> None:
    """--objective, --time-limit, --workers, --seed (and --top where the command has it) in range."""
    if args.objective not in defaults.OBJECTIVES:
        raise InputError("--objective", "objective", f"must be one of {', '.join(defaults.OBJECTIVES)}")
    check_float(args.time_limit, "--time-limit", 0.0, MAX_TIME_LIMIT_S, open_low=True)
    check_int(args.workers, "--workers", 1, MAX_WORKERS)
    check_int(args.seed, "--seed", 0, MAX_SEED)
    check_int(getattr(args, "top", None), "--top", 0, MAX_TOP)
    if getattr(args, "deterministic_limit", None) is not None:
        check_float(args.deterministic_limit, "--deterministic-limit", 0.0, MAX_TIME_LIMIT_S, open_low=True)
    if getattr(args, "uncertainty", None) is not None:
        check_float(args.uncertainty, "--uncertainty", 0.0, 1.0)


def add_rank_map_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rank-map", metavar="FILE",
                   help="also write one row per rank (CSV, as check-map reads it; '-' for stdout)")


def check_output_args(args) -> None:
    """--json FILE (and --rank-map FILE where the command has it) writable, before the work starts."""
    check_output(args.json, "--json", args.force)
    check_output(getattr(args, "rank_map", None), "--rank-map", args.force)
    rank_map = getattr(args, "rank_map", None)
    if args.json == "-" and rank_map == "-":
        raise InputError("--rank-map", "rank_map", "'-' for both --json and --rank-map; give one a FILE")
    if args.json and rank_map and "-" not in (args.json, rank_map) and same_file(args.json, rank_map):
        raise InputError(rank_map, "--rank-map", f"the same file as --json {args.json}; give each its own file")


def same_file(a: str, b: str) -> bool:
    """Whether two output paths name one file (the same path after resolving links and '..', or one file already)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet: different paths, different files
        return False


def check_rank_map_size(args, ranks: int) -> None:
    """--rank-map FILE holds at most placement.MAX_CSV_RANKS rows; checked before the work where the ranks are known."""
    if getattr(args, "rank_map", None) and ranks > MAX_CSV_RANKS:
        raise InputError("--rank-map", "rank_map", f"{ranks:,} ranks; a rank map file holds at most "
                         f"{MAX_CSV_RANKS:,} rows (the JSON's rank_map gives the rule for every rank)")


def write_rank_map(args, layout, target) -> None:
    """--rank-map FILE: the planned map, streamed."""
    if args.rank_map:
        check_rank_map_size(args, layout.ranks)
        write_stream(args.rank_map, rank_map_csv(layout, target), args.force, "--rank-map")


def text_to_stdout(args) -> bool:
    """The text report goes to stdout unless --json - or --rank-map - takes it."""
    return "-" not in (args.json, getattr(args, "rank_map", None))


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
