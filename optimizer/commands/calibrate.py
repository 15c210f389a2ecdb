"""`trnopt calibrate`: a target's achievable link rates and latencies from nccom-test runs, and its compute
utilisation from a measured step time, written as a new target file.

Per run (optimizer/cost/nccom.py): the alpha-beta fit of time against message size, and the
link class the run measures on the target (the slowest links of its group's outermost
level: the torus inside an instance, the UltraServer ring across its instances, EFA across
UltraServers). Per link class, innermost first: the achievable share of the datasheet
bandwidth and the per-hop latency at which the cost model's collective formula
(optimizer/cost/collectives.py, ``coefficients``) reproduces the fitted slope and intercept,
averaged over the runs of that class. The compute utilisation: the one factor on the
target's efficiency shares (matmul, elementwise) at which the cost model's step time of the
given layout equals the measured one.

The new file is the target's file with those values replaced (comments kept) and a
``[calibration]`` table recording what was measured, when, each run's fit and its error,
and for every constant whether it is "measured" or still the "datasheet" figure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from trnopt.optimizer.commands.output import write_output
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.cost.nccom import (Fit, MeasurementError, Run, fit_run, linear_from, measured_link, model_time,
                                         read_runs, run_domains)
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layoutfile import read_layout
from trnopt.optimizer.model.inputfile import read_text
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, Target, load_target, parse_target

MIN_ACHIEVABLE = 1e-4


@dataclass(frozen=True)
class RunResult:
    run: Run
    fit: Fit
    link: str
    """The link class the run measures (torus, ring, switch, scale_out; core: on one chip, not used)."""
    names: tuple[str, ...]
    """The target's link tables of that class in the run's group."""
    achievable: float | None
    latency_s: float | None
    note: str
    fit_from: float = 0.0
    """Smallest message size (bytes) the fit used: the cost model's linear view starts there."""


@dataclass(frozen=True)
class StepResult:
    layout: str
    measured_s: float
    before_s: float
    after_s: float
    scale: float


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


def _bisect(f, lo: float, hi: float, goal: float, increasing: bool, steps: int = 80) -> float:
    """x in [lo, hi] with f(x) = goal for a monotone f."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) < goal) is increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def solve_run(target: Target, run: Run, fit: Fit, names: tuple[str, ...]) -> tuple[float, float, str]:
    """(achievable, latency s, note): the values of the named links at which the cost model's
    seconds per byte and fixed seconds of the run equal the fit's beta and alpha."""
    notes = []
    per_byte = lambda a: model_time(with_links(target, names, achievable=a), run)[0]  # noqa: E731
    if per_byte(1.0) >= fit.beta_s_per_byte:
        achievable = 1.0
        notes.append("bandwidth at or above the datasheet figure: kept 1.0")
    elif per_byte(MIN_ACHIEVABLE) <= fit.beta_s_per_byte:
        raise MeasurementError(run.path, run.header_line, f"measured bandwidth is below {MIN_ACHIEVABLE:.2%} of "
                               f"the datasheet figure of {'+'.join(names)} on {target.name}: wrong target, ranks "
                               "or nodes?")
    else:
        achievable = _bisect(per_byte, MIN_ACHIEVABLE, 1.0, fit.beta_s_per_byte, increasing=False)
    fixed = lambda lat: model_time(with_links(target, names, latency=lat), run)[1]  # noqa: E731
    if fit.alpha_s <= fixed(0.0):
        latency = 0.0
        notes.append("fitted alpha at or below what the other links' latencies give: latency 0")
    else:
        hi = max(fit.alpha_s, 1e-9)
        while fixed(hi) < fit.alpha_s and hi < 1.0:
            hi *= 2
        latency = _bisect(fixed, 0.0, hi, fit.alpha_s, increasing=True)
    return achievable, latency, "; ".join(notes)


def calibrate_links(target: Target, runs: list[Run]) -> tuple[Target, list[RunResult]]:
    """The target with every measured link class fitted, innermost class first, and each run's result."""
    start = {id(run): linear_from(target, run) for run in runs}
    fits = [(run, fit_run(run, start[id(run)])) for run in runs]
    classes: dict[tuple[str, ...], list[tuple[Run, Fit, str]]] = {}
    results: list[RunResult] = []
    for run, fit in fits:
        link, names = measured_link(target, run)
        if not names:
            results.append(RunResult(run, fit, link, (), None, None, "inside one chip: trnopt's targets have no "
                                     "link table for on-chip traffic; not used", start[id(run)]))
            continue
        classes.setdefault(names, []).append((run, fit, link))

    def depth(item):  # inner classes first: fewer domains, then fewer nodes
        return min((run_domains(target, r), r.nodes) for r, _, _ in item[1])

    current = target
    for names, members in sorted(classes.items(), key=depth):
        solved = [(run, fit, link, *solve_run(current, run, fit, names)) for run, fit, link in members]
        achievable = sum(s[3] for s in solved) / len(solved)
        latency = sum(s[4] for s in solved) / len(solved)
        current = with_links(current, names, achievable=achievable, latency=latency)
        results += [RunResult(run, fit, link, names, a, lat, note, start[id(run)])
                    for run, fit, link, a, lat, note in solved]
    return current, results


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


# -- the new file -----------------------------------------------------------------------------------
HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"-]+)\s*\]\]?\s*(#.*)?$")


def _blocks(lines: list[str]) -> list[tuple[str, int, int]]:
    """(table name, first line index, end index) of every table header in the file."""
    heads = [(m.group(1), i) for i, line in enumerate(lines) if (m := HEADER.match(line))]
    return [(name, i, heads[k + 1][1] if k + 1 < len(heads) else len(lines)) for k, (name, i) in enumerate(heads)]


def _set(lines: list[str], start: int, end: int, key: str, value: str, comment: str, after: str) -> None:
    """Replace ``key = ...`` in lines[start:end], or insert it after the ``after`` key's line."""
    pattern = re.compile(rf"^(\s*){re.escape(key)}\s*=")
    text = f"{key} = {value}"
    text = f"{text:32s} # {comment}"
    for i in range(start, end):
        if pattern.match(lines[i]):
            lines[i] = pattern.match(lines[i]).group(1) + text
            return
    anchor = re.compile(rf"^\s*{re.escape(after)}\s*=")
    at = next((i for i in range(start, end) if anchor.match(lines[i])), start)
    lines.insert(at + 1, text)


def _value(x: float) -> str:
    return f"{x:.6g}" if "e" not in f"{x:.6g}" else f"{x:.6e}"


def new_target_text(source: str, target: Target, calibrated: Target, results: list[RunResult],
                    step: StepResult | None, source_name: str, nccom: str, when: str) -> str:
    lines = source.splitlines()
    cut = next((i for name, i, _ in _blocks(lines) if name.strip('"').startswith("calibration")), len(lines))
    lines = lines[:cut]
    while lines and not lines[-1].strip():
        lines.pop()
    measured = {n for r in results for n in r.names}
    by_name = {a.name: a for a in (*calibrated.domain_axes, calibrated.scale_out)}
    old = {a.name: a for a in (*target.domain_axes, target.scale_out)}
    note = f"measured: trnopt calibrate {when[:10]} (nccom-test), see [calibration]"
    for name in sorted(measured):
        for table, start, end in reversed(_blocks(lines)):
            is_axis = table == "axes" and any(re.match(rf'^\s*name\s*=\s*"{re.escape(name)}"', lines[i])
                                              for i in range(start, end))
            if is_axis or (table == "scale_out" and name == calibrated.scale_out.name):
                a = by_name[name]
                _set(lines, start, end, "latency_us", _value(a.latency * 1e6),
                     f"{note}; datasheet {old[name].latency * 1e6:g}", after="latency_us")
                _set(lines, start, end, "achievable", _value(a.achievable),
                     f"{note}; of the datasheet bandwidth", after="latency_us")
                break
    if step is not None:
        for table, start, end in _blocks(lines):
            if table == "efficiency":
                eff = calibrated.efficiency
                _set(lines, start, end, "matmul", _value(eff.matmul), f"measured step time x {step.scale:.4g} "
                     f"(was {target.efficiency.matmul:g})", after="matmul")
                _set(lines, start, end, "elementwise", _value(eff.elementwise), f"measured step time x "
                     f"{step.scale:.4g} (was {target.efficiency.elementwise:g})", after="matmul")
                if any(re.match(r"^\s*fitted_on\s*=", lines[i]) for i in range(start, end)):
                    _set(lines, start, end, "fitted_on", _toml_str(f"step time of {Path(step.layout).name} "
                                                                   f"(trnopt calibrate {when[:10]})"),
                         "what the shares were fitted on", after="fitted_on")
                break
    lines = [f"# Calibrated by `trnopt calibrate` ({when}) from {source_name}: measured values replace the",
             "# datasheet ones where the [calibration] table at the end says so.", *lines]
    lines += ["", *calibration_table(target, calibrated, results, step, source_name, nccom, when)]
    return "\n".join(lines) + "\n"


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def calibration_table(target: Target, calibrated: Target, results: list[RunResult], step: StepResult | None,
                      source_name: str, nccom: str, when: str) -> list[str]:
    measured = {n for r in results for n in r.names}
    out = ["[calibration]",
           "# What `trnopt calibrate` measured and fitted (a record; the target loader does not read it).",
           f"written = {_toml_str(when)}",
           f"from = {_toml_str(source_name)}",
           f"nccom = {_toml_str(nccom)}",
           "model = \"alpha-beta fit t = alpha + beta * size per run (weights 1/t^2), on the sizes the cost model's "
           "linear view describes (fit_from_bytes: the Neuron runtime's ring algorithms); per link class the "
           "achievable share and per-hop latency at which optimizer/cost/collectives.py reproduces beta and alpha\"",
           "",
           "[calibration.constants]"]
    for a in (*calibrated.domain_axes, calibrated.scale_out):
        key = "scale_out" if a is calibrated.scale_out else f"axes.{a.name}"
        status = "measured" if a.name in measured else "datasheet"
        out += [f'"{key}.achievable" = "{status}"', f'"{key}.latency_us" = "{status}"']
    eff = "measured" if step else "source file"
    out += [f'"efficiency.matmul" = "{eff}"', f'"efficiency.elementwise" = "{eff}"']
    for r in results:
        out += ["", "[[calibration.runs]]",
                f"file = {_toml_str(r.run.path)}",
                f"op = {_toml_str(r.run.op)}",
                f"ranks = {r.run.ranks}",
                f"nodes = {r.run.nodes}",
                f"link = {_toml_str('+'.join(r.names) + f' ({r.link})' if r.names else r.link)}",
                f"points = {r.fit.points}",
                f"fit_from_bytes = {int(r.fit_from)}",
                f"alpha_us = {_value(r.fit.alpha_s * 1e6)}",
                f"bus_bandwidth_gbs = {_value(r.fit.bus_bandwidth(r.run.op, r.run.ranks) / GB)}",
                f"rms_rel_error = {_value(r.fit.rms_rel_error)}",
                f"max_rel_error = {_value(r.fit.max_rel_error)}"]
        if r.achievable is not None:
            out += [f"achievable = {_value(r.achievable)}", f"latency_us = {_value(r.latency_s * 1e6)}"]
        if r.note:
            out.append(f"note = {_toml_str(r.note)}")
    if step is not None:
        out += ["", "[calibration.step_time]",
                f"layout = {_toml_str(step.layout)}",
                f"measured_s = {_value(step.measured_s)}",
                f"modelled_before_s = {_value(step.before_s)}",
                f"modelled_after_s = {_value(step.after_s)}",
                f"efficiency_scale = {_value(step.scale)}"]
    return out


def source_text(name_or_path: str) -> tuple[str, str]:
    """(text, name) of the target's file, built-in or the user's."""
    if name_or_path in BUILTIN_TARGETS:
        path = f"machines/{name_or_path}.toml"
        return resources.files("trnopt.targets").joinpath(path).read_text("utf-8"), f"targets/{path}"
    return read_text(name_or_path, "--target", kind="target file"), name_or_path


# -- command ----------------------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a target's link rates (nccom-test) and compute utilisation (a step time)",
                       description="Read nccom-test output (a file or a directory of files; each names its "
                                   "operation, ranks and nodes in a '# nccom-test -r R -N N ... OP' or "
                                   "'# trnopt: op=OP ranks=R nodes=N' line or a file name like allr_r64_N2.txt), "
                                   "fit alpha-beta per run, and write a copy of the target with the achievable "
                                   "bandwidth share and latency of every measured link class, and optionally "
                                   "the compute utilisation from a measured step time of a known layout.")
    p.add_argument("--target", required=True, help="built-in target name or a .toml file")
    p.add_argument("--nccom", required=True, metavar="FILE_OR_DIR", help="nccom-test output file or directory")
    p.add_argument("--step-time", nargs=2, metavar=("LAYOUT.json", "SECONDS"),
                   help="a measured step time of a layout (the JSON `trnopt solve --json` writes)")
    p.add_argument("--out", required=True, metavar="NEW.toml", help="the calibrated target file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = load_target(args.target)
    text, source_name = source_text(args.target)
    runs = read_runs(args.nccom)
    calibrated, results = calibrate_links(target, runs)
    step = None
    if args.step_time:
        layout_path, seconds_text = args.step_time
        try:
            seconds = float(seconds_text)
        except ValueError:
            seconds = float("nan")
        if not math.isfinite(seconds) or seconds <= 0:
            raise InputError("--step-time", "seconds", f"must be a positive number of seconds, got {seconds_text!r}")
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
        print(f"  {Path(r.run.path).name}: {r.run.op} on {r.run.ranks} ranks / {r.run.nodes} node(s) measures "
              f"{'+'.join(r.names) or r.link}: alpha {r.fit.alpha_s * 1e6:.1f} us, bus "
              f"{r.fit.bus_bandwidth(r.run.op, r.run.ranks) / GB:.1f} GB/s (fit error {r.fit.rms_rel_error:.2%} rms)"
              f" -> {what}" + (f" [{r.note}]" if r.note else ""))
    if step is not None:
        print(f"  step time {step.measured_s:g} s: modelled {step.before_s:.4g} s before, efficiency shares x "
              f"{step.scale:.4f} -> {step.after_s:.4g} s")
    return 0
