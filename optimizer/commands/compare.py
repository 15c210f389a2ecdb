"""`trnopt compare`: the best layout of one model on several targets, side by side.

Moving a job from Trn2 to Trn3 should change the TP, EP and PP degrees in a configuration,
not the job. This command answers "what would those degrees be, and what would they buy"
by running the same search (``search.solve``, same time limit, seed and workers) on every
target and putting the results in one table. Every number is taken from the Evaluation
that the one cost model returns for the chosen layout; the relative changes are ratios of
those numbers to the same numbers of the baseline row (the first target that has a layout).

Domain counts: targets have domains of different sizes (a Trn2 UltraServer has 64 chips, a
Trn3 Gen2 UltraServer 144), so

- with ``--ultraservers N`` every target gets N domains (N instances for single-instance
  targets such as trn2);
- without it every target gets the fewest of its domains on which the model fits with the
  headroom (``search.fewest_domains``), and the row says so.

Failed instances: ``--exclude TARGET:NAMES`` plans that target on what is left of its N
domains (model/partial.py, every candidate machine searched, as `trnopt solve --exclude`), the
other targets on their whole machines: the names are positions of one machine's instances
(``d1i2``), which mean nothing on another target, so bare names are taken only when one target
is compared.

A target on which no layout fits, or on which the search finds none within the time limit,
gets a row that says why instead of stopping the command, and the other targets keep their
layouts. Exit codes (``EXIT_CODES``, also in ``trnopt compare --help``): 0 when every target
is answered (a layout, or a proof that none fits) and at least one has a layout; 3 when no
target has a layout and every one is proven infeasible; 4 when the time limit left at least
one target without a layout and without a proof (its row says so; the table and --json are
still written, with the other targets' layouts).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.commands.args import (ascii_int, add_output_args, add_search_args, add_workload_args, check_output_args,
                                            check_search_args, workload_from_args)
from trnopt.optimizer.commands.output import write_output
from trnopt.optimizer.errors import InfeasibleError, InputError, TimeLimitError, one_line
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.model.layoutfile import layout_dict, partial_dict
from trnopt.optimizer.model.partial import candidates, describe, parse_names
from trnopt.optimizer.commands.degrees import check_degrees, fits_on_no_count
from trnopt.optimizer.search.domains import MAX_DOMAINS, domain_flag, fewest_domains, least_memory_found
from trnopt.optimizer.search.driver import SearchResult, solve
from trnopt.optimizer.search.partial import on_candidate, solve_partial
from trnopt.optimizer.search.cpsat import SolverMismatch
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.target import GIB, Target, check_domains, load_target
from trnopt.optimizer.model.workload import Workload


# (JSON key, Evaluation -> value, higher is better) for the metrics every row carries
METRICS = (
    ("step_time_s", lambda e: e.step.total, False),
    ("tokens_per_s", lambda e: e.tokens_per_s, True),
    ("tokens_per_s_per_chip", lambda e: e.tokens_per_s / e.layout.chips, True),
    ("mfu", lambda e: e.mfu, True),
    ("memory_headroom_gib", lambda e: (e.usable_bytes - e.memory.total) / GIB, True),
    ("job_mtbf_h", lambda e: e.reliability.job_mtbf_s / 3600, True),
    ("checkpoint_interval_min", lambda e: e.reliability.interval_s / 60, True),
    ("goodput", lambda e: e.reliability.goodput, True),
    ("goodput_tokens_per_s", lambda e: e.goodput_tokens_per_s, True),
)


@dataclass
class Row:
    """One target's answer: a search result, or the reason there is none."""

    target_ref: str
    target: Target
    domains: int | None
    domains_chosen: str            # "given" (--ultraservers) or "fewest" (search.fewest_domains)
    result: SearchResult | None = None
    status: str = "solved"         # solved, infeasible, time_limit (no layout, no proof), error
    reason: str = ""
    exclude: tuple[str, ...] = ()
    """The failed instances or chips of this target's machine (--exclude TARGET:NAMES); () when whole."""

    @property
    def evaluation(self) -> Evaluation | None:
        return self.result.best if self.result else None

    @property
    def note(self) -> str:
        if self.domains is None:
            return ""
        if self.exclude:
            return describe(self.result.problem.target) if self.result else f"excluded {', '.join(self.exclude)}"
        if self.domains_chosen == "given":
            return f"{self.domains} domain(s) as given"
        return f"fewest {self.target.name} domains that fit ({domain_flag(self.target, self.domains)})"


def metrics(e: Evaluation) -> dict[str, float]:
    return {key: get(e) for key, get, _ in METRICS}


def relative(e: Evaluation, base: Evaluation) -> dict[str, float]:
    """Each metric of ``e`` over the baseline's, minus one (0.25 = 25% more)."""
    out = {}
    for key, get, _ in METRICS:
        b = get(base)
        out[key] = get(e) / b - 1 if b else 0.0
    return out


def compare(workload: Workload, targets: list[tuple[str, Target]], domains: int | None, headroom: float,
            objective: str, time_limit: float, workers: int, seed: int, top: int = 0,
            exclude: dict[str, tuple[str, ...]] | None = None) -> list[Row]:
    """Solve the workload on every target (same time limit, seed, workers); one Row per target. A target
    in ``exclude`` (its names checked, ``domains`` given) is solved on what its failed instances leave."""
    rows = []
    for ref, target in targets:
        problem = Problem(workload, target, domains or 1, headroom, objective=objective)
        row = Row(ref, target, domains, "given" if domains else "fewest")
        if exclude and ref in exclude:
            row.exclude = exclude[ref]
            rows.append(_on_partial(row, problem, time_limit, workers, seed, top))
            continue
        try:
            tiled = check_degrees(workload, target, problem.lnc_values, domains, MAX_DOMAINS)
        except InfeasibleError as exc:
            row.status, row.reason = "infeasible", str(exc)
            rows.append(row)
            continue
        if domains is None:
            try:
                found = fewest_domains(problem, workers=workers, seed=seed)
            except TimeLimitError as exc:  # only without a deadline's budget; say so and keep the other rows
                row.status, row.reason = "time_limit", str(exc)
                rows.append(row)
                continue
            if found is None:
                need = least_memory_found(replace(problem, domains=tiled), workers, seed)
                row.status, row.reason = "infeasible", fits_on_no_count(workload, target, headroom, MAX_DOMAINS,
                                                                        tiled, need)
                rows.append(row)
                continue
            row.domains = found
            problem = replace(problem, domains=found)
        try:
            row.result = solve(problem, time_limit, workers, seed, top)
        except InfeasibleError as exc:
            row.status, row.reason = "infeasible", str(exc)
        except TimeLimitError as exc:  # no layout and no proof within the limit: this row only
            row.status, row.reason = "time_limit", str(exc)
        except SolverMismatch as exc:  # a cost-model / CP-SAT disagreement is a bug: say so, keep the other rows
            row.status, row.reason = "error", f"internal error (please report): {exc}"
        rows.append(row)
    return rows


def _on_partial(row: Row, problem: Problem, time_limit: float, workers: int, seed: int, top: int) -> Row:
    """The row of a target with failed instances: every candidate machine left searched (solve_partial)."""
    fits = []
    for cand in candidates(row.target, row.domains, row.exclude):
        try:
            check_degrees(problem.workload, cand, problem.lnc_values, on_candidate(problem, cand).domains, MAX_DOMAINS)
            fits.append(cand)
        except InfeasibleError as exc:
            row.reason = row.reason or str(exc)
    try:
        if not fits:
            raise InfeasibleError(row.reason)
        row.result, _ = solve_partial(problem, fits, time_limit, workers, seed, top)
        row.reason = ""
    except InfeasibleError as exc:
        row.status, row.reason = "infeasible", f"excluding {', '.join(row.exclude)} leaves no machine it fits: {exc}"
    except TimeLimitError as exc:
        row.status, row.reason = "time_limit", str(exc)
    except SolverMismatch as exc:
        row.status, row.reason = "error", f"internal error (please report): {exc}"
    return row


def baseline(rows: list[Row]) -> Row | None:
    return next((r for r in rows if r.evaluation is not None), None)


def compare_dict(rows: list[Row], workload: Workload, settings: dict) -> dict:
    base = baseline(rows)
    out_rows = []
    for r in rows:
        d: dict = {"target": r.target_ref, "status": r.status, "domains": r.domains,
                   "domains_chosen": r.domains_chosen,
                   **({"exclude": list(r.exclude)} if r.exclude else {}),
                   **({"instances_per_domain": partial_dict(r.result.problem.target)["instances_per_domain"]}
                      if r.exclude and r.result else {})}
        if r.evaluation is not None:
            e = r.evaluation
            d.update({"chips": e.layout.chips, "ranks": e.layout.ranks, "solver_status": r.result.status,
                      "gap": r.result.gap, "layout": layout_dict(e.layout), "layout_text": e.layout.describe(),
                      "placement_text": e.layout.placement_text(), **metrics(e),
                      "relative_to_baseline": relative(e, base.evaluation)})
        else:
            d["reason"] = r.reason
        out_rows.append(d)
    return {"model": workload.model.name, "seq": workload.training.seq,
            "global_batch": workload.training.global_batch, **settings,
            "baseline": base.target_ref if base else None, "rows": out_rows}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def compare_text(rows: list[Row], workload: Workload, settings: dict) -> str:
    base = baseline(rows)
    head = (f"trnopt compare: {workload.model.name}, seq {workload.training.seq}, global batch "
            f"{workload.training.global_batch}, objective {settings['objective']}, "
            f"{settings['time_limit_s']:g} s search per target, seed {settings['seed']}")
    cols = ("target", "domains", "chips", "step s", "tokens/s", "tok/s/chip", "MFU", "free GiB", "MTBF h",
            "ckpt min", "goodput", "d step", "d tokens/s", "d goodput tok/s")
    table = [cols]
    for r in rows:
        e = r.evaluation
        mark = "" if r.domains_chosen == "given" or r.domains is None else "*"
        if e is None:
            table.append((r.target_ref, f"{r.domains or '-'}{mark}", "-", r.status.upper().replace("_", " "),
                          *["-"] * (len(cols) - 4)))
            continue
        m, rel = metrics(e), relative(e, base.evaluation)
        is_base = r is base
        table.append((r.target_ref, f"{r.domains}{mark}", str(e.layout.chips), f"{m['step_time_s']:.3f}",
                      f"{m['tokens_per_s']:,.0f}", f"{m['tokens_per_s_per_chip']:,.1f}", f"{100 * m['mfu']:.1f}%",
                      f"{m['memory_headroom_gib']:.1f}", f"{m['job_mtbf_h']:.1f}",
                      f"{m['checkpoint_interval_min']:.1f}", f"{100 * m['goodput']:.1f}%",
                      "base" if is_base else _pct(rel["step_time_s"]),
                      "base" if is_base else _pct(rel["tokens_per_s"]),
                      "base" if is_base else _pct(rel["goodput_tokens_per_s"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [head, ""]
    for row in table:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    lines += ["", "layouts:"]
    for r in rows:
        if r.evaluation is None:
            lines.append(f"  {r.target_ref}: {r.status.replace('_', ' ')}: {r.reason}")
            continue
        e, res = r.evaluation, r.result
        status = "OPTIMAL" if res.status == "OPTIMAL" else f"FEASIBLE, gap {100 * res.gap:.2f}% (time limit)"
        lines.append(f"  {r.target_ref}: {e.layout.describe()} [{e.layout.placement_text() or 'one rank'}]; "
                     f"{status}; {r.note}")
    lines.append("")
    if any(r.domains_chosen == "fewest" for r in rows):
        lines.append("* no --ultraservers given: each target gets the fewest of its domains on which the model "
                     f"fits with {settings['headroom']:.0%} headroom")
    if base is not None:
        lines.append(f"d = relative change against {base.target_ref} (first target with a layout); "
                     "'d step' below 0 is faster")
    return "\n".join(lines)


# -- command ----------------------------------------------------------------------------------
EXIT_CODES = ("exit codes: 0 every target answered (a layout, or proven that none fits) and at least one "
              "has a layout; 2 bad input; 3 no target has a layout, every one proven infeasible; 4 the time "
              "limit left some target without a layout or a proof (its row says so; the other rows and "
              "--json are still written)")


def register(sub) -> None:
    p = sub.add_parser("compare", help="best layout of one model on several targets, side by side",
                       description="Solve one model on several targets with the same search settings and "
                                   "compare step time, throughput, memory and reliability.", epilog=EXIT_CODES)
    p.add_argument("--targets", default=defaults.COMPARE_TARGETS,
                   help=f"comma-separated built-in names or .toml files (default {defaults.COMPARE_TARGETS})")
    p.add_argument("--ultraservers", type=ascii_int,
                   help="domains of every target (default: the fewest that fit, per target)")
    p.add_argument("--exclude", metavar="TARGET:NAMES", action="append",
                   help="failed instances or chips of one target's machine, named as its rank map names them "
                        "(d2i3, d0i1c5), e.g. trn2u:d1i2,d0i0c3: that target is planned on what is left of its "
                        "--ultraservers domains (as `solve --exclude`), the others whole. Once per target; NAMES "
                        "alone only with one target (names of one machine's instances mean nothing on another)")
    add_workload_args(p)
    add_search_args(p, time_help="seconds of search per target")
    add_output_args(p)
    p.set_defaults(run=run)


def parse_targets(text: str) -> list[tuple[str, Target]]:
    refs = [t.strip() for t in text.split(",") if t.strip()]
    if not refs:
        raise InputError("--targets", "targets", "name at least one target")
    if len(set(refs)) != len(refs):
        raise InputError("--targets", "targets", f"a target is named twice: {text}")
    return [(ref, load_target(ref)) for ref in refs]


def parse_exclude(given: list[str] | None, targets: list[tuple[str, Target]], domains: int | None
                  ) -> dict[str, tuple[str, ...]]:
    """--exclude TARGET:NAMES (NAMES alone with one target) -> target ref -> its checked names."""
    if not given:
        return {}
    if domains is None:
        raise InputError("--exclude", "exclude", "needs --ultraservers: the whole machine of each target the "
                         "excluded instances or chips are part of")
    out: dict[str, tuple[str, ...]] = {}
    refs = dict(targets)
    for text in given:
        ref, _, names = text.rpartition(":")
        if not ref:
            if len(targets) > 1:
                raise InputError("--exclude", "exclude", f"{names!r} names instances of one machine, but --targets "
                                 f"compares {len(targets)} targets whose instances are not the same machines; write "
                                 f"TARGET:NAMES, e.g. {targets[0][0]}:{names}, for the target that lost them")
            ref = targets[0][0]
        if ref not in refs:
            raise InputError("--exclude", "exclude", f"{ref!r} is not one of --targets ({', '.join(refs)})")
        if ref in out:
            raise InputError("--exclude", "exclude", f"{ref} is given twice; name all its instances in one "
                             f"--exclude {ref}:NAMES")
        out[ref] = parse_names(refs[ref], domains, names)
        candidates(refs[ref], domains, out[ref])  # something is left, checked before any search
    return out


def run(args: argparse.Namespace) -> int:
    targets = parse_targets(args.targets)
    if args.ultraservers is not None and args.ultraservers < 1:
        raise InputError("--ultraservers", "ultraservers", f"must be >= 1, got {args.ultraservers}")
    for _, target in targets if args.ultraservers is not None else ():
        check_domains(target, args.ultraservers, "--ultraservers", "ultraservers")
    exclude = parse_exclude(args.exclude, targets, args.ultraservers)
    check_search_args(args)
    check_output_args(args)
    workload = workload_from_args(args)
    rows = compare(workload, targets, args.ultraservers, args.headroom, args.objective, args.time_limit,
                   args.workers, args.seed, exclude=exclude)
    settings = {"objective": args.objective, "time_limit_s": args.time_limit, "seed": args.seed,
                "workers": args.workers, "headroom": args.headroom}
    if args.json == "-":
        write_output("-", compare_dict(rows, workload, settings))
    else:
        print(compare_text(rows, workload, settings))
        if args.json:
            write_output(args.json, compare_dict(rows, workload, settings), args.force)
    unanswered = [r for r in rows if r.status == "time_limit"]
    if unanswered:  # one line, as every exit 4; the table above keeps the answered targets
        print(one_line(f"trnopt: time limit: no layout and no proof within {args.time_limit:g} s for "
                       f"{', '.join(r.target_ref for r in unanswered)}; raise --time-limit (the other targets "
                       "are in the table)"), file=sys.stderr)
        return 4
    if baseline(rows) is None:  # one line, as every exit 3
        reasons = "; ".join(f"{r.target_ref}: {r.reason}" for r in rows)
        print(one_line(f"trnopt: infeasible: {workload.model.name} fits on none of the targets ({reasons})"),
              file=sys.stderr)
        return 3
    for r in rows:
        if r.status == "error":
            print(f"trnopt: warning: {r.target_ref}: {r.reason}", file=sys.stderr)
        elif r.result is not None and r.result.status != "OPTIMAL":
            print(f"trnopt: warning: {r.target_ref}: time limit reached; best layout shown, gap "
                  f"{100 * r.result.gap:.2f}%", file=sys.stderr)
    return 0

