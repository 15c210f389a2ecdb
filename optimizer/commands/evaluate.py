"""`trnopt evaluate`: score one hand-written layout, or a layout file, with the cost model.

The layout comes from the flags (degrees, placement) on the machine they name, possibly with
failed instances or chips excluded (``--exclude``, model/partial.py), or from a layout file
(``--layout``, the JSON `trnopt solve --json` writes), whose ``problem`` names the machine and
any exclusion: a file is scored on the very machine its solve searched.

Exit 0 when the layout fits, 1 when it does not (the report says by how much), 2 when
the flags do not make a layout of this model on this machine.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import replace

from trnopt.optimizer import defaults
from trnopt.optimizer.commands.args import (ascii_int, add_problem_args, add_rank_map_arg, check_float, check_int,
                                            check_output_args,
                                            check_rank_map_size, domains_from_args, exclude_from_args, lnc_from_args,
                                            text_to_stdout, workload_from_args, write_rank_map)
from trnopt.optimizer.commands.output import to_stdout, write_output
from trnopt.optimizer.commands.report import evaluation_dict, evaluation_lines, rank_map_lines, with_overlap_source
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.cost.stages import split_problem
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model import bounds
from trnopt.optimizer.model.layout import DIMS, RECOMPUTE, Layout, default_placement, parse_placement
from trnopt.optimizer.model.schedules import SCHEDULES
from trnopt.optimizer.frameworks.profile import DEFAULT as DEFAULT_FRAMEWORK
from trnopt.optimizer.frameworks.profile import PROFILES, check_runs, profile
from trnopt.optimizer.model.inputfile import parse_json, read_text
from trnopt.optimizer.model.layoutfile import layout_framework, partial_dict, problem_dict, read_layout
from trnopt.optimizer.model.partial import describe
from trnopt.optimizer.model.placement import rank_map_summary
from trnopt.optimizer.model.target import GIB, Target, check_domains, load_target
from trnopt.optimizer.search.domains import domain_flag


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="score one hand-written layout with the cost model")
    add_problem_args(p)
    p.add_argument("--framework", choices=tuple(PROFILES),
                   help="the framework that will run the layout: every rule it puts on a layout must hold, exit 2 "
                        f"naming the rule (default: {DEFAULT_FRAMEWORK}'s rules on heads, KV heads, the sequence "
                        "split, experts and pipeline stages)")
    p.add_argument("--tp", type=ascii_int, help="tensor-parallel degree (ranks); default: from --placement, else 1")
    p.add_argument("--pp", type=ascii_int, help="pipeline-parallel degree; default: from --placement, else 1")
    p.add_argument("--dp", type=ascii_int, help="data-parallel degree (all DP ranks, experts' included); "
                   "default: from --placement, else the rest of the machine")
    p.add_argument("--ep", type=ascii_int, help="expert-parallel degree (carved out of dp); default 1")
    p.add_argument("--cp", type=ascii_int, help="context-parallel degree; default 1")
    p.add_argument("--zero", type=ascii_int, default=1, help="ZeRO stage 0-3 (default 1)")
    p.add_argument("--recompute", help=f"{', '.join(RECOMPUTE)} (default selective; op, torchtitan's per-op "
                   "checkpointing, with --framework torchtitan, which has no attention-only recomputation)")
    p.add_argument("--micro-batch", type=ascii_int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--interleave", type=ascii_int, default=1, help="interleaved stages per pipeline rank (default 1)")
    p.add_argument("--schedule", help=f"pipeline schedule: {', '.join(SCHEDULES)} (default 1F1B, or "
                   "Interleaved1F1B with --interleave > 1; ZBVZeroBubble and DualPipeV need --interleave 2)")
    p.add_argument("--lnc", type=ascii_int, help="logical NeuronCore config (default: the target's)")
    p.add_argument("--placement", help='each dimension\'s factors on named axes, e.g. "tp=core4,x4,y4;pp=ring4;dp=efa2" '
                   "(default: TP on the fastest axes, then cp, ep, dp, pp)")
    p.add_argument("--stage-layers", metavar="N,N,...",
                   help="layers of each pipeline stage, first to last (pp of them, at least one each, adding up to "
                        "the model's layers): score this uneven split instead of the even one")
    p.add_argument("--exclude", metavar="NAMES",
                   help="failed instances or chips, comma-separated, named as the rank map names them: d2i3 "
                        "(domain 2's instance 3), d0i1c5 (its chip 5); needs --ultraservers/--instances. The layout "
                        "is scored on what is left (the machines `solve --exclude` searches): the first, most "
                        "instances per domain first, on which it tiles (--dp defaults to the rest of that one; "
                        "--placement or the degrees pick another); the rank map goes around the hole")
    p.add_argument("--layout", metavar="FILE",
                   help="score the layout of this file (the JSON `trnopt solve --json` writes) on the machine its "
                        "problem names, its --exclude included: the step time solve reported; the flags that "
                        "describe the problem or the layout must then not be given")
    add_rank_map_arg(p)
    # None marks a flag not given (--layout refuses those given); run() fills in the defaults the help states
    p.set_defaults(run=run, **{key: None for key in FROM_FILE})


FLAGS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "ep": "--ep", "cp": "--cp", "zero": "--zero",
         "recompute": "--recompute", "micro_batch": "--micro-batch", "interleave": "--interleave",
         "schedule": "--schedule", "stage_layers": "--stage-layers",
         "degrees": "--tp/--pp/--dp/--cp"}


# what a layout file gives (its problem and layout objects), with each flag's default without --layout
FROM_FILE = {"target": defaults.TARGET, "ultraservers": None, "instances": None, "model": defaults.MODEL,
             "seq": defaults.SEQ, "global_batch": defaults.GLOBAL_BATCH, "tp": None, "pp": None, "dp": None, "ep": None,
             "cp": None, "zero": 1, "recompute": None, "micro_batch": 1, "interleave": 1, "schedule": None,
             "lnc": None, "placement": None, "stage_layers": None, "exclude": None}


def check_layout_flags(args) -> None:
    """Every layout flag in its range before anything is built from it."""
    for dim in DIMS:
        check_int(getattr(args, dim), f"--{dim}", 1, bounds.MAX_CHIPS * bounds.MAX_PHYSICAL_CORES)
    check_int(args.zero, "--zero", 0, 3)
    check_int(args.micro_batch, "--micro-batch", 1, bounds.MAX_GLOBAL_BATCH)
    check_int(args.interleave, "--interleave", 1, bounds.MAX_LAYERS)
    if args.recompute is None:
        args.recompute = "op" if args.framework and "selective" not in profile(args.framework).recompute else "selective"
    if args.recompute not in RECOMPUTE:
        raise InputError("--recompute", "recompute", f"must be one of {', '.join(RECOMPUTE)}, got {args.recompute!r}")
    if args.schedule is not None and args.schedule not in SCHEDULES:
        raise InputError("--schedule", "schedule", f"must be one of {', '.join(SCHEDULES)}, got {args.schedule!r}")


def degrees_from_args(args, rows: tuple[tuple[int, ...], ...] | None) -> dict[str, int]:
    """Degrees from the flags, else from the placement rows; a flag that disagrees with its row is an error."""
    out = {}
    for dim in DIMS:
        flag = getattr(args, dim)
        from_rows = math.prod(rows[DIMS.index(dim)]) if rows is not None else None
        if dim == "dp" and from_rows is not None:
            from_rows *= out["ep"]
        if flag is not None and from_rows is not None and flag != from_rows:
            raise InputError(f"--{dim}", dim, f"{flag} disagrees with --placement, which gives {from_rows}")
        out[dim] = flag if flag is not None else (from_rows or (0 if dim == "dp" else 1))
    return out


def run(args: argparse.Namespace) -> int:
    if args.layout is not None:
        return run_file(args)
    for key, value in FROM_FILE.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    target, workload = load_target(args.target), workload_from_args(args)
    check_layout_flags(args)
    check_output_args(args)
    if args.placement is not None and (len(args.placement) > 4096 or re.search(r"\d{13}", args.placement)):
        raise InputError("--placement", "placement", "longer than 4096 characters or a factor of more than 12 digits")
    lnc = lnc_from_args(target, args) or target.chip.lnc_default
    domains = domains_from_args(target, args)
    if args.exclude is not None:
        if domains is None:
            raise InputError("--exclude", "exclude", "needs --ultraservers or --instances: the whole machine the "
                             "excluded instances or chips are part of")
        target, domains, layout = on_partial(args, workload, exclude_from_args(target, domains, args), lnc)
    else:
        domains, layout = layout_from_flags(args, workload, target, domains, lnc)
    if args.stage_layers is not None:
        layout = with_stage_layers(args.stage_layers, workload, layout)
    check_runs(layout, workload, args.framework, "--framework")
    check_rank_map_size(args, layout.ranks)
    problem = Problem(workload, target, domains, args.headroom)
    info = {**problem_dict(args.target, args.model, workload, domains, args.framework), **partial_dict(target)}
    return report(args, problem, layout, info)


def run_file(args: argparse.Namespace) -> int:
    """--layout FILE: the file's layout on the file's problem (read_layout: every key checked, the
    partial machine of its ``problem.exclude`` rebuilt), scored as `solve` scored it."""
    given = [key for key in FROM_FILE if getattr(args, key) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise InputError(flag, given[0], f"--layout {args.layout} gives the problem and the layout (its problem "
                         "and layout objects); drop the flag, or drop --layout and describe the layout with flags")
    check_float(args.headroom, "--headroom", 0.0, 1.0, open_high=True)
    check_output_args(args)
    target, workload, layout = read_layout(args.layout)
    named = layout_framework(args.layout)
    if args.framework is not None and named is not None and args.framework != named:
        raise InputError("--framework", "framework", f"{args.framework}, but --layout {args.layout} was solved for "
                         f"{named} (problem.framework); drop --framework")
    framework = args.framework or named
    check_runs(layout, workload, framework, args.layout)
    check_rank_map_size(args, layout.ranks)
    problem = Problem(workload, target, layout.domains, args.headroom)
    recorded = parse_json(args.layout, read_text(args.layout, "--layout"))["problem"]
    info = {**problem_dict(recorded["target"], recorded["model"], workload, layout.domains, framework),
            **partial_dict(target)}
    return report(args, problem, layout, info)


def layout_from_flags(args, workload, target: Target, domains: int | None, lnc: int):
    """(domains, Layout) the flags describe on ``target``: degrees from the flags or the placement,
    --dp defaulting to the rest of the machine, the machine's size from the degrees when not given."""
    per_domain = target.ranks(lnc, 1)
    if domains is None and args.placement is not None:
        # a scale-out factor without a machine size: the user states the machine, trnopt does not guess it
        axis = target.axes(lnc, 1)[-1].name
        count = math.prod(int(f) for f in _scale_out_factors(args.placement, axis))
        if count > 1:
            raise InputError("--placement", axis, f"spreads the layout over {count} {target.name} domains on {axis} "
                             f"but no machine size is given; pass {domain_flag(target, count)}")
    deg = degrees_from_args(args, None if args.placement is None else
                            parse_placement(args.placement, target.axes(lnc, domains or 1)))
    if deg["dp"] == 0:  # the rest of the machine
        if domains is None:
            raise InputError("--dp", "dp", "give --dp, --placement or a machine size (--ultraservers/--instances)")
        deg["dp"] = max(1, target.ranks(lnc, domains) // (deg["tp"] * deg["pp"] * deg["cp"]))
    product = deg["tp"] * deg["pp"] * deg["dp"] * deg["cp"]
    if domains is None:
        if product % per_domain:
            raise InputError("--tp/--pp/--dp", "degrees", f"tp*pp*dp*cp = {product} is not a multiple of the "
                             f"{per_domain} ranks of one {target.name} domain at LNC={lnc}")
        check_domains(target, product // per_domain, "--tp/--pp/--dp", "degrees")
        domains = product // per_domain
    axes = target.axes(lnc, domains)
    if deg["dp"] % deg["ep"]:
        raise InputError("--ep", "ep", f"expert parallelism {deg['ep']} must divide data parallelism {deg['dp']}")
    source = "--placement" if args.placement is not None else None
    try:
        rows = (parse_placement(args.placement, axes) if args.placement is not None else
                default_placement(axes, {**deg, "dp": deg["dp"] // deg["ep"]}))
        layout = Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"], ep=deg["ep"], cp=deg["cp"], zero=args.zero,
                        recompute=args.recompute, micro_batch=args.micro_batch, interleave=args.interleave,
                        schedule=args.schedule or "", lnc=lnc, axes=axes, placement=rows)
    except InputError as exc:
        if exc.source != "layout":
            raise
        flag = source if exc.key in ("placement", "degrees") and source else FLAGS.get(exc.key, "--placement")
        raise InputError(flag, exc.key, exc.rule) from None
    problems = layout.workload_problems(workload)
    if problems:
        key, rule = problems[0]
        raise InputError(source or FLAGS[key], key, rule)
    return domains, layout


def on_partial(args, workload, candidates: list[Target], lnc: int) -> tuple[Target, int, Layout]:
    """(machine, domains, Layout): the first candidate machine left by --exclude (most instances per
    domain first, the order `solve --exclude` searches them in) on which the flags' layout tiles.
    On none, the one error all candidates share, else one line listing what each one refused."""
    errors = []
    for cand in candidates:
        kept = len(cand.remaining.domains)
        try:
            domains, layout = layout_from_flags(args, workload, cand, kept, lnc)
            return cand, domains, layout
        except InputError as exc:
            errors.append((cand, kept, exc))
    if len({str(exc) for _, _, exc in errors}) == 1:
        raise errors[0][2]
    raise InputError("--exclude", "exclude", "the layout tiles none of the machines left: " + "; ".join(
        f"{kept} domain(s) of {cand.instances_per_domain} instance(s) ({cand.ranks(lnc, kept)} ranks at LNC={lnc}): "
        f"{exc.source}: {exc.rule}" for cand, kept, exc in errors))


def report(args: argparse.Namespace, problem: Problem, layout: Layout, info: dict) -> int:
    """The report, the JSON and the rank map of ``layout`` scored on ``problem``; exit 1 when it does not fit."""
    target = problem.target
    e = problem.evaluate(layout)
    doc = {"problem": info, **evaluation_dict(e), "rank_map": rank_map_summary(layout, target)}
    # files first: a reader that closes stdout early (`| head`) does not lose them
    if args.json and args.json != "-":
        write_output(args.json, doc, args.force)
    if args.rank_map != "-":
        write_rank_map(args, layout, target)
    if text_to_stdout(args):
        lines = [describe(target)] if target.remaining else []
        lines += with_overlap_source(evaluation_lines(e, target), e, problem)
        to_stdout(lambda: print("\n".join(lines + [""] + rank_map_lines(e, target))))
    elif args.json == "-":
        to_stdout(lambda: write_output("-", doc))
    else:
        to_stdout(lambda: write_rank_map(args, layout, target))
    if not e.fits:
        print(f"trnopt evaluate: the layout does not fit: {e.memory.total / GIB:.1f} GiB per chip, "
              f"{e.usable_bytes / GIB:.1f} usable", file=sys.stderr)
        return 1
    return 0


def with_stage_layers(text: str, workload, layout: Layout) -> Layout:
    """--stage-layers: the layout with that uneven split, or bad input naming the rule it breaks."""
    if len(text) > 4096 or not re.fullmatch(r"\s*\d{1,6}\s*(,\s*\d{1,6}\s*)*", text):
        raise InputError("--stage-layers", "stage_layers", f"must be whole numbers separated by commas, e.g. 7,9,9,7; "
                         f"got {text[:60]!r}")
    split = tuple(int(v) for v in text.split(","))
    if why := split_problem(workload, layout, split):
        raise InputError("--stage-layers", "stage_layers", why)
    return replace(layout, stage_layers=split)


def _scale_out_factors(text: str, axis: str) -> list[str]:
    """The factors a placement text gives the scale-out axis (e.g. ["2"] for "dp=efa2"; at most 12 digits each)."""
    return re.findall(rf"(?<![A-Za-z_]){re.escape(axis)}([0-9]{{1,12}})(?![0-9])", text)
