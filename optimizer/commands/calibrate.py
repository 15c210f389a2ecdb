"""`trnopt calibrate`: a target's achievable link rates and latencies from nccom-test runs, and its compute
utilisation from a measured step time, written as a new target file (calibfile.py).

Per run (optimizer/cost/nccom.py parses it; nccom_run.py places it on the target): the link
class it measures is the one that limits it in the cost model, the largest share of its
modelled byte time among the classes it crosses that no run on fewer nodes measured. A
hierarchical collective across UltraServers sends only 1/(ranks per domain) of its data
per rank over EFA (collectives.stages), so such a table mostly measures the domain's links
unless those are measured first; EFA is read from what remains. Per class, innermost runs
first: the achievable share of the datasheet bandwidth and the per-hop latency at which the
cost model's time (optimizer/cost/collectives.py ``collective_time``, the algorithm chosen by
size) is closest to every row of the class's runs, least squares of the relative error.
When a table's small messages are faster than the runtime's own fixed costs allow (latency
0), the share comes from the slope of its large messages instead. The compute utilisation:
the one factor on the target's efficiency shares (matmul, elementwise) at which the cost
model's step time of the given layout equals the measured one.

A table no link could produce is refused naming the file, the line and the rule: times that
fall as the size grows, bandwidth that falls or never grows (nccom.py), a share above
MAX_ACHIEVABLE or below MIN_ACHIEVABLE of the datasheet.
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import tomllib
from dataclasses import replace
from pathlib import Path

from trnopt.optimizer.commands.output import write_output
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.commands.calibfile import RunResult, StepResult, new_target_text, source_text
from trnopt.optimizer.cost.nccom import MAX_COUNT, NUMBER, OPS, MeasurementError, Run, fit_run, read_runs
from trnopt.optimizer.cost.nccom_run import (byte_shares, linear_from, link_classes, model_time, run_domains,
                                             run_span, run_times)
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layoutfile import read_layout
from trnopt.optimizer.model.target import GB, Target, load_target, parse_target

MIN_ACHIEVABLE = 1e-4
"""Least achievable share of a datasheet bandwidth a fit may return (below: not the machine named)."""
MAX_ACHIEVABLE = 1.10
"""Most a fit may return: a table up to 10% faster than the datasheet is read as noise (kept 1.0), faster is refused."""
SEARCH_ACHIEVABLE = 2.0
"""Largest share ``fit_links`` searches (the caller refuses above MAX_ACHIEVABLE)."""
MAX_STEPS = 40
"""Gauss-Newton steps of ``fit_links`` (it converges in a few on the model's piecewise-linear time)."""
MIN_SHARE = 0.2
"""Least share of a run's modelled byte time its class must carry for the run to measure it."""


# -- links ------------------------------------------------------------------------------------------
def with_links(target: Target, names: tuple[str, ...], achievable: float | None = None,
               latency: float | None = None) -> Target:
    """The target with the named link tables' achievable share and/or latency replaced."""
    def change(a):
        if a.name not in names:
            return a
        return replace(a, achievable=a.achievable if achievable is None else achievable,
                       latency=a.latency if latency is None else latency)
    return replace(target, domain_axes=tuple(change(a) for a in target.domain_axes),
                   scale_out=change(target.scale_out))


def _class_params(target: Target, names: tuple[str, ...]) -> tuple[float, float]:
    """(achievable, latency s) of a link class: the mean over its tables (they share one after calibration)."""
    axes = [a for a in (*target.domain_axes, target.scale_out) if a.name in names]
    return sum(a.achievable for a in axes) / len(axes), sum(a.latency for a in axes) / len(axes)


def _residuals(target: Target, runs: list[Run], names: tuple[str, ...], inverse: float, latency: float) -> list[float]:
    """(model - measured) / measured on every row of the runs, the class at 1/inverse and latency."""
    t = with_links(target, names, achievable=1 / inverse, latency=latency)
    return [(m - row.time_s) / row.time_s for run in runs for m, row in zip(run_times(t, run), run.rows)]


def fit_links(target: Target, runs: list[Run], names: tuple[str, ...]) -> tuple[float, float, bool]:
    """(achievable, latency s, latency pinned at 0) of the named link class at which the cost model's
    time of every row of ``runs`` (collectives.collective_time: the algorithm chosen by size) is
    closest to the measured one, in relative error (least squares).

    Unknowns u = 1 / achievable and the hop latency L: the model's time is linear in both on
    each algorithm's size range (byte time proportional to u, hops times L), so Gauss-Newton
    with finite-difference derivatives converges in a few steps; each step is halved until the
    squared error falls (a kink where another class becomes the slowest, or the latency bound,
    can make a full step overshoot). u stays within [1 / SEARCH_ACHIEVABLE, 10 / MIN_ACHIEVABLE]
    (the caller refuses the ends) and L >= 0: when the table's fixed time is below what the
    runtime's own fixed costs give at L = 0, L is 0 and u is fitted alone.
    """
    a0, lat0 = _class_params(target, names)
    # a level's hops take its slowest axis's latency (collectives.levels): start at or above the others
    # of the class's level, where the rows depend on it
    spans = [run_span(target, run)[0] for run in runs]
    level = next(a.level for span in spans for a, _ in span if a.name in names)
    lat0 = max([lat0] + [a.latency for span in spans for a, _ in span if a.level == level])
    lo, hi = 1 / SEARCH_ACHIEVABLE, 10 / MIN_ACHIEVABLE  # past both refusal bounds, so that they can bite
    res = lambda u, lat: _residuals(target, runs, names, u, lat)  # noqa: E731
    sse = lambda r: sum(e * e for e in r)  # noqa: E731
    x, pinned = (min(hi, max(lo, 1 / a0)), lat0), False
    r = res(*x)
    for _ in range(MAX_STEPS):
        hu, hl = x[0] * 1e-4, max(x[1] * 1e-4, 1e-8)
        ju = [(a - b) / hu for a, b in zip(res(x[0] + hu, x[1]), r)]
        jl = [0.0] * len(r) if pinned else [(a - b) / hl for a, b in zip(res(x[0], x[1] + hl), r)]
        suu, sll, sul = sum(v * v for v in ju), sum(v * v for v in jl), sum(a * b for a, b in zip(ju, jl))
        sur, slr = sum(v * e for v, e in zip(ju, r)), sum(v * e for v, e in zip(jl, r))
        det = suu * sll - sul * sul
        if suu <= 0:  # the class does not move these rows at this share
            break
        step = ([-sur / suu, 0.0] if det <= 1e-9 * suu * max(sll, 1e-300) else
                [(-sur * sll + slr * sul) / det, (-slr * suu + sur * sul) / det])
        if x[1] + step[1] < 0:  # the rows want a negative latency: hold it at 0, fit u alone from here
            x, pinned = (x[0], 0.0), True
            r = res(*x)
            continue
        for _ in range(30):  # halve the step until the error falls
            new = (min(hi, max(lo, x[0] + step[0])), max(0.0, x[1] + step[1]))
            r_new = res(*new)
            if sse(r_new) <= sse(r):
                break
            step = [step[0] / 2, step[1] / 2]
        else:
            break
        done = abs(new[0] - x[0]) <= 1e-9 * x[0] and abs(new[1] - x[1]) <= 1e-12
        x, r = new, r_new
        if done:
            break
    return 1 / x[0], x[1], x[1] == 0.0


def slope_share(target: Target, run: Run, names: tuple[str, ...]) -> float:
    """The named class's achievable share at which the cost model's seconds per byte of the run
    (``nccom.model_time``, the linear view of the runtime's ring algorithms) equal the slope of
    the alpha-beta line through the run's large messages (``nccom.fit_run`` from
    ``nccom.linear_from``): a measure of the bandwidth that does not depend on the fixed costs,
    for tables whose fixed time the runtime's fixed costs do not describe. Bisection on the
    share (the seconds per byte fall as it grows), within [MIN_ACHIEVABLE / 10, SEARCH_ACHIEVABLE]."""
    beta = fit_run(run, linear_from(target, run)).beta_s_per_byte
    lo, hi = MIN_ACHIEVABLE / 10, SEARCH_ACHIEVABLE
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if model_time(with_links(target, names, achievable=mid), run)[0] > beta:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def solve_class(target: Target, runs: list[Run], names: tuple[str, ...]) -> tuple[float, float | None, str]:
    """(achievable, latency s or None when the runs cannot measure it, note) of the named class from its
    runs; a table no link of that class could produce (far above the datasheet, or below
    MIN_ACHIEVABLE of it) is refused naming the run."""
    notes = []
    for run in runs:  # each run alone first: an impossible one is named
        achievable, _, pinned = fit_links(target, [run], names)
        achievable = slope_share(target, run, names) if pinned else achievable
        rule = (f"faster than the datasheet figure of {'+'.join(names)} on {target.name} allows "
                f"({achievable:.3g} of it)" if achievable > MAX_ACHIEVABLE else
                f"slower than {MIN_ACHIEVABLE:.2%} of the datasheet figure of {'+'.join(names)} on {target.name}"
                if achievable < MIN_ACHIEVABLE else "")
        if rule:
            raise MeasurementError(run.path, run.header_line, f"measured bandwidth is {rule}: no link of that "
                                   "class produces this table (wrong target, op, ranks or nodes?)")
    achievable, latency, pinned = fit_links(target, runs, names)
    if pinned:  # small messages faster than the runtime's fixed costs: the slope carries the bandwidth
        achievable = sum(slope_share(target, run, names) for run in runs) / len(runs)
    if achievable > 1.0:
        achievable, latency, pinned = fit_links(with_links(target, names, achievable=1.0), runs, names)
        achievable = 1.0
        notes.append("bandwidth at the datasheet figure (within noise): kept 1.0")
    if pinned:  # no latency >= 0 reproduces the small messages: the latency is not measured
        run = min(runs, key=lambda r: r.rows[0].time_s)
        floor = run_times(with_links(target, names, latency=0.0), run)[0]
        notes.append(f"{Path(run.path).name}: {run.rows[0].time_s * 1e6:.0f} us at {run.rows[0].size} B, below the "
                     f"cost model's {floor * 1e6:.0f} us at zero hop latency (the runtime's fixed costs): latency "
                     f"not measured, kept {_class_params(target, names)[1] * 1e6:g} us")
        return achievable, None, "; ".join(notes)
    return achievable, latency, "; ".join(notes)


def calibrate_links(target: Target, runs: list[Run]) -> tuple[Target, list[RunResult]]:
    """The target with every measured link class fitted, innermost runs first, and each run's result.

    Runs are taken by depth (fewer domains, then fewer nodes first). Each measures the link
    class with the largest share of its modelled byte time (``nccom.byte_shares``) among the
    classes it crosses that no shallower run has measured, at the values fitted so far: a
    multi-node table's time less what the inner classes, as measured, take is what its outer
    class takes. A run whose best such class carries under MIN_SHARE of its byte time is not
    used (it cannot tell that class's bandwidth from noise). A class's achievable share and
    latency are fitted on every row of all its runs of one depth at once (``solve_class``).
    """
    start = {id(run): linear_from(target, run) for run in runs}
    fits = {id(run): fit_run(run, start[id(run)]) for run in runs}
    results: dict[int, RunResult] = {}
    depths = sorted({(run_domains(target, r), r.nodes) for r in runs})
    current, measured = target, set()
    for depth in depths:
        classes: dict[tuple[str, ...], list[Run]] = {}
        for run in (r for r in runs if (run_domains(target, r), r.nodes) == depth):
            shares = {k: v for k, v in byte_shares(current, run).items() if k not in measured}
            names = max(shares, key=shares.get) if shares else ()
            if not names or shares[names] < MIN_SHARE:
                link = next((k for k, n in link_classes(current, run) if n == names), "core")
                why = ("inside one chip: trnopt's targets have no link table for on-chip traffic" if link == "core"
                       else "every link class it crosses is measured by a shallower run" if not shares else
                       f"{'+'.join(names)} carries only {shares[names]:.0%} of its modelled byte time")
                results[id(run)] = RunResult(run, fits[id(run)], link, (), None, None, why, start[id(run)])
                continue
            classes.setdefault(names, []).append(run)
        for names, members in classes.items():
            achievable, fitted, note = solve_class(current, members, names)
            current = with_links(current, names, achievable=achievable, latency=fitted)
            latency = _class_params(current, names)[1]
            measured.add(names)
            for run in members:
                link = next(k for k, n in link_classes(current, run) if n == names)
                errors = [abs(e) for e in _residuals(current, [run], names, 1 / achievable, latency)]
                results[id(run)] = RunResult(run, fits[id(run)], link, names, achievable, latency, note,
                                             start[id(run)], math.sqrt(sum(e * e for e in errors) / len(errors)),
                                             max(errors), fitted is not None)
    return current, [results[id(run)] for run in runs]


# -- compute ----------------------------------------------------------------------------------------
def calibrate_compute(target: Target, layout_path: str, seconds: float) -> tuple[Target, StepResult]:
    """The efficiency shares scaled by one factor so that the layout's modelled step time is ``seconds``."""
    layout_target, workload, layout = read_layout(layout_path)
    if layout_target.name != target.name:
        raise InputError(layout_path, "problem.target", f"the layout is for {layout_target.name}, the calibration "
                         f"for {target.name}")
    layout = replace(layout, axes=target.axes(layout.lnc, layout.domains))  # on the calibrated links
    eff = target.efficiency

    def at(k: float) -> Target:
        return replace(target, efficiency=replace(eff, matmul=min(1.0, eff.matmul * k),
                                                  elementwise=min(1.0, eff.elementwise * k)))

    def step(k: float) -> float:
        return Problem(workload, at(k), layout.domains, overlap={}).evaluate(layout).step.total

    k_max = 1 / min(eff.matmul, eff.elementwise)
    fastest, slowest = step(k_max), step(1e-3)
    if seconds < fastest:
        raise InputError("--step-time", "seconds", f"{seconds:g} s is faster than the cost model allows for this "
                         f"layout even at 100% of the engines' peak ({fastest:.4g} s)")
    if seconds > slowest:
        raise InputError("--step-time", "seconds", f"{seconds:g} s is slower than the cost model gives at 0.1% of "
                         f"the fitted shares ({slowest:.4g} s): wrong layout?")
    lo, hi = math.log(1e-3), math.log(k_max)
    for _ in range(80):
        mid = (lo + hi) / 2
        if step(math.exp(mid)) > seconds:
            lo = mid
        else:
            hi = mid
    k = math.exp((lo + hi) / 2)
    return at(k), StepResult(layout_path, seconds, step(1.0), step(k), k)


# -- command ----------------------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a target's link rates (nccom-test) and compute utilisation (a step time)",
                       description="Read nccom-test output (a file or a directory of files), fit every measured "
                                   "link class's achievable bandwidth share and per-hop latency to the cost model, "
                                   "and write a copy of the target with them, and optionally the compute "
                                   "utilisation from a measured step time of a known layout. nccom-test does not "
                                   "print its command: give the operation, ranks and nodes with --op, --ranks and "
                                   "--nodes (for every file), or per file in a '# nccom-test -r R -N N ... OP' or "
                                   "'# trnopt: op=OP ranks=R nodes=N' line or a name like allr_r64_N2.txt; a file "
                                   "that says otherwise than a flag is refused.",
                       epilog="Each run measures the link class that limits it in the cost model (the largest share "
                              "of its byte time among the classes no run on fewer nodes measured); a table whose "
                              "times fall as the size grows, whose bandwidth falls or never grows, or that no link "
                              "of its class could produce is refused naming the file and line.")
    p.add_argument("--target", required=True, help="built-in target name or a .toml file")
    p.add_argument("--nccom", required=True, metavar="FILE_OR_DIR", help="nccom-test output file or directory")
    p.add_argument("--op", metavar="OP", help=f"the operation nccom-test ran ({', '.join(OPS)})")
    p.add_argument("--ranks", metavar="R", help="nccom-test's -r: ranks (workers) in all")
    p.add_argument("--nodes", metavar="N", help="nccom-test's -N: instances the ranks run on (default 1)")
    p.add_argument("--step-time", nargs=2, metavar=("LAYOUT.json", "SECONDS"),
                   help="a measured step time of a layout (the JSON `trnopt solve --json` writes)")
    p.add_argument("--out", required=True, metavar="NEW.toml", help="the calibrated target file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=run)


def shape_flags(args: argparse.Namespace) -> dict[str, str]:
    """The run shape --op, --ranks and --nodes give, checked as a file's would be."""
    given = {k: v for k, v in (("op", args.op), ("ranks", args.ranks), ("nodes", args.nodes)) if v is not None}
    if "op" in given and given["op"] not in OPS:
        raise InputError("--op", "op", f"unknown operation {given['op'][:40]!r}; one of {', '.join(OPS)}")
    for key in ("ranks", "nodes"):
        if key in given and (not re.fullmatch(r"[0-9]{1,9}", given[key]) or not 1 <= int(given[key]) <= MAX_COUNT):
            raise InputError(f"--{key}", key, f"must be an integer from 1 to {MAX_COUNT:,} in ASCII digits, got "
                             f"{given[key][:40]!r}")
    return given


def run(args: argparse.Namespace) -> int:
    given = shape_flags(args)
    target = load_target(args.target)
    text, source_name = source_text(args.target)
    runs = read_runs(args.nccom, given)
    calibrated, results = calibrate_links(target, runs)
    step = None
    if args.step_time:
        layout_path, seconds_text = args.step_time
        seconds = float(seconds_text) if re.fullmatch(NUMBER, seconds_text.strip()) else float("nan")
        if not math.isfinite(seconds) or seconds <= 0:
            raise InputError("--step-time", "seconds", f"must be a positive number of seconds in ASCII digits, got "
                             f"{seconds_text[:40]!r}")
        calibrated, step = calibrate_compute(calibrated, layout_path, seconds)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = new_target_text(text, target, calibrated, results, step, source_name, args.nccom, when)
    parse_target(tomllib.loads(new), args.out)  # the file must load as a target
    if args.out != "-" and Path(args.out).suffix != ".toml":
        raise InputError(args.out, "--out", "must end in .toml (load_target reads a path by its suffix)")
    write_output(args.out, new, args.force, flag="--out")
    print(f"trnopt calibrate: {target.name} from {len(runs)} nccom-test run(s) -> {args.out}")
    for r in results:
        what = (f"achievable {r.achievable:.3f}, latency {r.latency_s * 1e6:.2f} us/hop" if r.achievable is not None
                else "not used")
        print(f"  {Path(r.run.path).name}: {r.run.op} on {r.run.ranks} ranks / {r.run.nodes} node(s) "
              f"{'measures ' + '+'.join(r.names) if r.names else 'crosses ' + r.link}: alpha {r.fit.alpha_s * 1e6:.1f} us, bus "
              f"{r.fit.bus_bandwidth(r.run.op, r.run.ranks) / GB:.1f} GB/s -> {what}"
              + (f" (model error {r.model_rms_rel_error:.2%} rms)" if r.achievable is not None else "")
              + (f" [{r.note}]" if r.note else ""))
    if step is not None:
        print(f"  step time {step.measured_s:g} s: modelled {step.before_s:.4g} s before, efficiency shares x "
              f"{step.scale:.4f} -> {step.after_s:.4g} s")
    return 0
