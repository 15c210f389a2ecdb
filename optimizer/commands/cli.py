"""The `trnopt` command line.

Exit codes: 0 success, 1 a check found a problem, 2 bad input (one line naming the
file, the key and the rule), 3 no feasible layout (with the explanation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from trnopt.optimizer.commands import catalog
from trnopt.optimizer.commands import checkmap
from trnopt.optimizer.commands import compare
from trnopt.optimizer.frameworks import export
from trnopt.kernels import command as kernelscmd
from trnopt.optimizer.commands import map as mapview
from trnopt.optimizer.errors import InfeasibleError, InputError
from trnopt.optimizer.cost.evaluate import DEFAULT_HEADROOM, evaluate
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.layoutfile import problem_dict
from trnopt.optimizer.cost.overlap import measured as measured_overlap
from trnopt.optimizer.commands.report import evaluation_dict, evaluation_lines, rank_map_lines, solve_dict, solve_text
from trnopt.optimizer.search.driver import domain_flag, fewest_domains, least_memory, solve
from trnopt.optimizer.search.cpsat import DEFAULT_WORKERS
from trnopt.optimizer.search.space import OBJECTIVES, Problem
from trnopt.optimizer.model.target import GIB, Target, load_target
from trnopt.optimizer.model.workload import DEFAULT_MODEL, Training, Workload, load_model

DEFAULT_TARGET = "trn2u"


def write_output(path: str, payload: dict | str | bytes, force: bool = False, flag: str = "--json") -> None:
    """Write JSON, text or bytes to a file, or to stdout for '-'; never overwrite a file unless forced."""
    data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload, indent=2) + "\n"
    if path == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        return
    out = Path(path)
    if out.exists() and not force:
        raise InputError(path, flag, "file exists; trnopt never overwrites a file (pass --force to replace it)")
    if isinstance(data, bytes):
        out.write_bytes(data)
    else:
        out.write_text(data, encoding="utf-8")


def add_problem_args(p: argparse.ArgumentParser, model_default: str | None = DEFAULT_MODEL) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="built-in target name or a .toml file (default trn2u)")
    p.add_argument("--model", default=model_default, help=f"preset name or a .toml file (default {model_default})")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ultraservers", type=int, help="number of UltraServers (scale-up domains) joined by EFA")
    size.add_argument("--instances", type=int, help="number of instances (for single-instance targets: trn1, trn2)")
    p.add_argument("--seq", type=int, default=8192, help="sequence length (default 8192)")
    p.add_argument("--global-batch", type=int, default=1024, help="sequences per step (default 1024)")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM, help="HBM share kept free (default 0.10)")
    p.add_argument("--json", metavar="FILE", help="also write JSON to FILE ('-' for stdout only)")
    p.add_argument("--force", action="store_true", help="allow --json to replace an existing file")


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


# -- commands ------------------------------------------------------------------------------
CATALOGS = {  # command -> (loader, details text, JSON dict, listing)
    "targets": (load_target, catalog.target_details, catalog.target_dict, catalog.targets_table),
    "models": (load_model, catalog.model_details, catalog.model_dict, catalog.models_table),
}


def cmd_catalog(args) -> int:
    """`trnopt targets|models [show NAME] [--json]`."""
    load, details, as_dict, listing = CATALOGS[args.command]
    if args.action == "show":
        if not args.name:
            raise InputError(f"trnopt {args.command} show", "NAME", f"name one (trnopt {args.command} lists them)")
        item = load(args.name)
        print(json.dumps(as_dict(item), indent=2) if args.as_json else details(item))
    else:
        print(listing())
    return 0


def cmd_evaluate(args) -> int:
    target, workload = load_target(args.target), workload_from_args(args)
    lnc = args.lnc or target.chip.lnc_default
    product = args.tp * args.pp * args.dp * args.cp
    domains = domains_from_args(target, args)
    if domains is None:
        per_domain = target.ranks(lnc, 1)
        if product % per_domain:
            raise InputError("--tp/--pp/--dp", "degrees", f"tp*pp*dp*cp = {product} is not a multiple of the "
                             f"{per_domain} ranks of one {target.name} domain at LNC={lnc}")
        domains = product // per_domain
    axes = target.axes(lnc, domains)
    degrees = {"tp": args.tp, "cp": args.cp, "ep": args.ep, "dp": args.dp // max(args.ep, 1), "pp": args.pp}
    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, cp=args.cp, zero=args.zero,
                    recompute=args.recompute, micro_batch=args.micro_batch, interleave=args.interleave, lnc=lnc,
                    axes=axes, placement=default_placement(axes, degrees))
    problems = layout.workload_problems(workload)
    if problems:
        raise InputError("layout", "degrees", problems[0])
    e = evaluate(workload, layout, target, args.headroom, measured_overlap())
    if args.json != "-":
        print("\n".join(evaluation_lines(e, target) + [""] + rank_map_lines(e, target)))
    if args.json:
        write_output(args.json, {"problem": problem_dict(args.target, args.model, workload, domains),
                                 **evaluation_dict(e)}, args.force)
    return 0


def cmd_solve(args) -> int:
    target, workload = load_target(args.target), workload_from_args(args)
    if args.objective not in OBJECTIVES:
        raise InputError("--objective", "objective", f"must be one of {', '.join(OBJECTIVES)}")
    domains = domains_from_args(target, args)
    problem = Problem(workload, target, domains or 1, args.headroom, args.objective,
                      lnc=(args.lnc,) if args.lnc else None, zero_stages=zero_stages_from_args(args),
                      hidden=measured_overlap())  # TP overlap measured by the kernels (targets/measured/overlap.json)
    note = ""
    if domains is None:
        found = fewest_domains(problem, workers=args.workers, seed=args.seed)
        if found is None:
            raise InfeasibleError(f"{workload.model.name} fits on no count of {target.name} domains up to 64 "
                                  f"with {args.headroom:.0%} headroom")
        if found > 1:
            need = least_memory(problem, args.workers, args.seed)
            note = (f"no domain count given: {found} is the fewest {target.name} domains on which "
                    f"{workload.model.name} fits with {args.headroom:.0%} headroom (one needs at least "
                    f"{need / GIB:.1f} GiB/chip); pass {domain_flag(target, found)} to choose")
        else:
            note = f"no domain count given: one {target.name} domain is enough"
        problem = replace(problem, domains=found)
    result = solve(problem, args.time_limit, args.workers, args.seed, args.top)
    result.domains_note = note
    info = problem_dict(args.target, args.model, workload, problem.domains)
    if args.format == "json" or args.json == "-":
        write_output("-", solve_dict(result, info))
    elif args.format in export.FORMATS:
        export.write(args.format, result)
    else:
        print(solve_text(result))
    if args.json and args.json != "-":
        write_output(args.json, solve_dict(result, info), args.force)
    if result.status != "OPTIMAL":
        print(f"trnopt: warning: time limit reached; best layout shown, gap {100 * result.gap:.2f}%",
              file=sys.stderr)
    return 0


# -- parser ----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="trnopt", description="Parallel layouts and overlap kernels for AWS Trainium.")
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("targets", help="list the built-in targets, or show one")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", dest="as_json", action="store_true", help="JSON instead of text")
    p.set_defaults(run=cmd_catalog)

    p = sub.add_parser("models", help="list the model presets, or show one")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", dest="as_json", action="store_true", help="JSON instead of text")
    p.set_defaults(run=cmd_catalog)

    p = sub.add_parser("evaluate", help="score one hand-written layout with the cost model")
    add_problem_args(p)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--zero", type=int, default=1)
    p.add_argument("--recompute", default="selective")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--interleave", type=int, default=1)
    p.add_argument("--lnc", type=int, help="logical NeuronCore config (default: the target's)")
    p.set_defaults(run=cmd_evaluate)

    p = sub.add_parser("solve", help="find the fastest layout that fits (CP-SAT)")
    add_problem_args(p)
    p.add_argument("--objective", default="step-time", help="step-time (default) or goodput")
    p.add_argument("--lnc", type=int, help="fix the LNC instead of searching every allowed value")
    p.add_argument("--zero-stages", help="ZeRO stages to search, e.g. 0,1 (default all; 0,1 with --format nxd)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for the whole search (default 60)")
    p.add_argument("--top", type=int, default=3, help="runner-up layouts to show (default 3)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"CP-SAT workers (default {DEFAULT_WORKERS})")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")
    p.add_argument("--format", choices=("text", "json", *export.FORMATS), default="text",
                   help="text (default), json, nxd (NxD Training YAML keys) or env (launch environment lines)")
    p.set_defaults(run=cmd_solve)
    for command in (compare, mapview, checkmap, kernelscmd):
        command.register(sub)
    return top


def zero_stages_from_args(args) -> tuple[int, ...]:
    """--zero-stages 0,1 restricts the search; --format nxd implies 0,1 (NxD Training has ZeRO-1 only)."""
    if args.zero_stages is None:
        return (0, 1) if args.format == "nxd" else (0, 1, 2, 3)
    try:
        stages = tuple(sorted({int(v) for v in args.zero_stages.split(",")}))
    except ValueError:
        stages = ()
    if not stages or not set(stages) <= {0, 1, 2, 3}:
        raise InputError("--zero-stages", "zero_stages", f"must be a comma list of 0-3, got {args.zero_stages!r}")
    return stages


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except InputError as exc:
        if args.debug:
            raise
        print(f"trnopt: error: {exc}", file=sys.stderr)
        return 2
    except InfeasibleError as exc:
        if args.debug:
            raise
        print(f"trnopt: infeasible: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) left: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: say so in one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"trnopt: internal error ({type(exc).__name__}: {exc}); please report it, "
              "and rerun with --debug for the traceback", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
