"""`trnopt solve`: the fastest layout that fits, found by CP-SAT, with the report and exports."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from trnopt.optimizer import defaults
from trnopt.optimizer.commands.args import (ascii_int, add_problem_args, add_rank_map_arg, add_search_args, check_output_args,
                                            check_rank_map_size, check_search_args, domains_from_args,
                                            exclude_from_args,
                                            lnc_from_args, text_to_stdout, workload_from_args, write_rank_map,
                                            zero_stages_from_args)
from trnopt.optimizer.commands.degrees import check_degrees, fits_on_no_count
from trnopt.optimizer.commands.output import to_stdout, write_output
from trnopt.optimizer.commands.report import NoOverlapAnswer, solve_dict, solve_text
from trnopt.optimizer.cost.overlap import NO_OVERLAP
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InfeasibleError, InputError
from trnopt.optimizer.frameworks import export
from trnopt.optimizer.frameworks.profile import DEFAULT as DEFAULT_FRAMEWORK
from trnopt.optimizer.frameworks.profile import PROFILES, FrameworkProfile
from trnopt.optimizer.model.layoutfile import partial_dict, problem_dict
from trnopt.optimizer.model.target import GIB, load_target
from trnopt.optimizer.search.domains import (MAX_DOMAINS, domain_flag, fewest_domains, least_memory,
                                             least_memory_found)
from trnopt.optimizer.search.clock import clock
from trnopt.optimizer.search.driver import solve
from trnopt.optimizer.search.partial import on_candidate, solve_partial
from trnopt.optimizer.search.jointsplit import uneven_answer
from trnopt.optimizer.search.stagesplit import split_runners_up


def register(sub) -> None:
    p = sub.add_parser("solve", help="find the fastest layout that fits (CP-SAT)")
    add_problem_args(p)
    add_search_args(p)
    p.add_argument("--lnc", type=ascii_int, help="fix the LNC instead of searching every allowed value")
    add_rank_map_arg(p)
    p.add_argument("--exclude", metavar="NAMES",
                   help="failed instances or chips to plan around, comma-separated, named as the rank map names "
                        "them: d2i3 (domain 2's instance 3), d0i1c5 (its chip 5); needs --ultraservers/--instances")
    p.add_argument("--zero-stages", help="ZeRO stages to search, e.g. 0,1 (default: those the framework runs)")
    p.add_argument("--framework", choices=tuple(PROFILES),
                   help=f"the training framework whose decisions the search may use (default {DEFAULT_FRAMEWORK}; "
                        "nxd with --format nxd): torchtitan = FSDP2/HSDP (ZeRO-3), nxd = ZeRO-0/1")
    p.add_argument("--deterministic-limit", type=float, metavar="SECONDS",
                   help="CP-SAT's deterministic-time budget per solve (a count of its work: the same answer on "
                        f"any machine; default {defaults.SOLVE_DETERMINISTIC_S:g}); --time-limit is only a safety stop")
    p.add_argument("--uncertainty", type=float, default=defaults.UNCERTAINTY,
                   help=f"relative step-time uncertainty: among layouts within it of the fastest, prefer TP on "
                        f"faster links and more headroom (default {defaults.UNCERTAINTY:g}; 0 keeps the fastest)")
    p.add_argument("--top", type=ascii_int, default=defaults.TOP,
                   help=f"runner-up layouts to show (default {defaults.TOP})")
    p.add_argument("--uneven-stages", action="store_true",
                   help="let every layout's pipeline stages take the layer counts that minimise its step (lighter "
                        "stages where the output layer or the activations in flight weigh) and answer the best "
                        "layout and split together, proven over every layout and split, a layout whose even "
                        "split does not fit included (default: even stages)")
    p.add_argument("--format", choices=("text", "json", *export.FORMATS), default="text",
                   help="text (default), json, torchtitan (job config TOML and overrides), nxd (NxD Training "
                        "YAML keys) or env (launch environment lines)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target, workload = load_target(args.target), workload_from_args(args)
    check_search_args(args)
    check_output_args(args)
    if args.json == "-" and args.format in export.FORMATS:
        raise InputError("--json", "json", f"'-' writes the JSON to stdout, where --format {args.format} writes; "
                         "give --json FILE")
    if args.rank_map == "-" and args.format != "text":
        raise InputError("--rank-map", "rank_map", f"'-' writes the rank map to stdout, where --format "
                         f"{args.format} writes; give --rank-map FILE")
    domains = domains_from_args(target, args)
    lnc = lnc_from_args(target, args)
    framework = framework_from_args(args)
    if args.uneven_stages and framework.name == "nxd":
        raise InputError("--uneven-stages", "uneven_stages", "nxd: NxD Training's config has no per-stage layer "
                         "counts (NxDPPModel takes pipeline_cuts only in Python, neuronx_distributed/pipeline/"
                         "model.py); use --framework torchtitan, whose module_fqns_per_model_part takes them")
    problem = Problem(workload, target, domains or 1, args.headroom, objective=args.objective,
                      lnc=(lnc,) if lnc else None, zero_stages=framework_zero_stages(args, framework),
                      recompute=framework.recompute, interleave=framework.interleaved, hsdp=framework.hsdp,
                      rules=framework.rules, instance_blocks=True)
    if args.exclude is not None:
        return run_partial(args, problem, framework)
    tiled = check_degrees(workload, target, problem.lnc_values, domains, MAX_DOMAINS)
    # one deadline for the whole command (the safety stop, on the search's clock): finding the
    # domain count comes out of --time-limit
    deadline = clock() + args.time_limit
    note = ""
    if domains is None:
        found = fewest_domains(problem, workers=args.workers, seed=args.seed, deadline=deadline)
        if found is None:
            need = least_memory_found(replace(problem, domains=tiled), args.workers, args.seed, deadline)
            raise InfeasibleError(fits_on_no_count(workload, target, args.headroom, MAX_DOMAINS, tiled, need))
        if found > 1:
            need = least_memory(problem, args.workers, args.seed, deadline)
            note = (f"no domain count given: {found} is the fewest {target.name} domains on which "
                    f"{workload.model.name} fits with {args.headroom:.0%} headroom (one needs at least "
                    f"{need / GIB:.1f} GiB/chip); pass {domain_flag(target, found)} to choose")
        else:
            note = f"no domain count given: one {target.name} domain is enough"
        problem = replace(problem, domains=found)
    check_rank_map_size(args, max(target.ranks(v, problem.domains) for v in problem.lnc_values))
    result = solve(problem, max(1.0, deadline - clock()), args.workers, args.seed, args.top,
                   deterministic_limit=args.deterministic_limit, uncertainty=args.uncertainty)
    result.domains_note = note
    return answer(args, result, framework)


def run_partial(args: argparse.Namespace, problem: Problem, framework: FrameworkProfile) -> int:
    """--exclude: the best layout on what is left (model/partial.py: every candidate machine searched)."""
    if args.ultraservers is None and args.instances is None:
        raise InputError("--exclude", "exclude", "needs --ultraservers or --instances: the whole machine the "
                         "excluded instances or chips are part of")
    targets, first = [], None
    for cand in exclude_from_args(problem.target, problem.domains, args):
        try:
            check_degrees(problem.workload, cand, problem.lnc_values, on_candidate(problem, cand).domains, MAX_DOMAINS)
            targets.append(cand)
        except InfeasibleError as exc:
            first = first or exc
    if not targets:
        raise left_too_small(args.exclude, problem, first)
    check_rank_map_size(args, max(t.ranks(v, on_candidate(problem, t).domains)
                                  for t in targets for v in problem.lnc_values))
    try:
        result, _ = solve_partial(problem, targets, args.time_limit, args.workers, args.seed, args.top,
                                  deterministic_limit=args.deterministic_limit, uncertainty=args.uncertainty)
    except InfeasibleError as exc:
        raise left_too_small(args.exclude, problem, exc) from None
    return answer(args, result, framework)


def left_too_small(names: str, problem: Problem, exc: InfeasibleError) -> InfeasibleError:
    """Nothing fits on what --exclude leaves: one line naming the flag, the rule and the first candidate's reason."""
    return InfeasibleError(f"--exclude: exclude: excluding {names} leaves no machine on which "
                           f"{problem.workload.model.name} fits (every candidate machine searched); the first: {exc}")


def answer(args: argparse.Namespace, result, framework: FrameworkProfile) -> int:
    """The report, the files and the exports of a search's result (on the machine it searched)."""
    if args.uneven_stages:
        uneven_answer(result)
        if runners := split_runners_up(result.problem, result.best, result.runners_up):
            result.uneven_stages["runners_up"] = runners
    problem, target, workload = result.problem, result.problem.target, result.problem.workload
    no_overlap = no_overlap_answer(problem, result, args)
    info = {**problem_dict(args.target, args.model, workload, problem.domains, framework.name), **partial_dict(target)}
    # files first: a reader that closes stdout early (`| head`) does not lose them
    if args.json and args.json != "-":
        write_output(args.json, solve_dict(result, info, no_overlap), args.force)
    if args.rank_map != "-":
        write_rank_map(args, result.best.layout, target)
    if args.format == "json" or args.json == "-":
        to_stdout(lambda: write_output("-", solve_dict(result, info, no_overlap)))
    elif args.format in export.FORMATS:
        to_stdout(lambda: export.write(args.format, result))
    elif text_to_stdout(args):
        to_stdout(lambda: print(solve_text(result, no_overlap)))
    else:
        to_stdout(lambda: write_rank_map(args, result.best.layout, target))
    for why in (framework.supports(result.best.layout, workload), framework.producible(result.best.layout, target)):
        if why:
            print(f"trnopt: warning: {why}", file=sys.stderr)
    if result.stopped == "time":
        print(f"trnopt: warning: time limit reached; best layout shown, gap {100 * result.gap:.2f}%; the answer may "
              "differ on another machine or under another load (the search's work budget would not)", file=sys.stderr)
    elif result.status != "OPTIMAL":
        print(f"trnopt: warning: the search's work budget ended before its proof; best layout shown, gap "
              f"{100 * result.gap:.2f}% (the same on any machine)", file=sys.stderr)
    return 0


def no_overlap_answer(problem: Problem, result, args: argparse.Namespace) -> NoOverlapAnswer:
    """The answer with every hidden share 0: the same problem with ``NO_OVERLAP`` for the table,
    searched as above within the same limits (--time-limit, --deterministic-limit). No search when
    the chosen layout hides nothing and is the fastest: its step time is unchanged and every other
    layout's only grows, so it stays the answer."""
    bare = replace(problem, overlap=NO_OVERLAP)
    chosen = bare.evaluate(result.best.layout)
    if result.best.step.tp == result.best.step.tp_raw and result.fastest is None:
        return NoOverlapAnswer(chosen, "unchanged", chosen)
    found = solve(bare, args.time_limit, args.workers, args.seed, 0, deterministic_limit=args.deterministic_limit,
                  uncertainty=args.uncertainty)
    return NoOverlapAnswer(found.best, found.status, chosen)


def framework_from_args(args: argparse.Namespace) -> FrameworkProfile:
    """--framework (default torchtitan; nxd when --format nxd names it); a --format it cannot run is bad input."""
    name = args.framework or ("nxd" if args.format == "nxd" else DEFAULT_FRAMEWORK)
    framework = PROFILES[name]
    if args.format in export.FORMATS and args.format not in framework.formats:
        raise InputError("--format", "format", f"{name} cannot run --format {args.format}; its formats are "
                         f"{', '.join(framework.formats)} (or text, json)")
    return framework


def framework_zero_stages(args: argparse.Namespace, framework: FrameworkProfile) -> tuple[int, ...]:
    """The framework's ZeRO stages, narrowed by --zero-stages; none left is bad input."""
    if args.zero_stages is None:
        return framework.zero_stages
    stages = tuple(s for s in zero_stages_from_args(args) if s in framework.zero_stages)
    if not stages:
        raise InputError("--zero-stages", "zero_stages", f"{framework.name} runs ZeRO stage(s) "
                         f"{', '.join(map(str, framework.zero_stages))}, none of {args.zero_stages!r}")
    return stages
