"""The file `trnopt calibrate` writes: a copy of the target's file with the measured values
replaced (comments kept) and a ``[calibration]`` table recording what was measured, when,
each run's fit and its error, and for every constant whether it is "measured" or still the
"datasheet" figure; and the results that table records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from trnopt.optimizer.cost.nccom import Fit, Run
from trnopt.optimizer.model.inputfile import read_text
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, Target


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
    """Smallest message size (bytes) the alpha-beta fit used: the cost model's linear view starts there."""
    model_rms_rel_error: float = 0.0
    """RMS over the run's rows of (cost model at the calibrated values - measured) / measured."""
    model_max_rel_error: float = 0.0
    """Largest of those relative errors."""
    latency_measured: bool = True
    """Whether the runs measured the class's hop latency (False: faster than the runtime's fixed costs allow)."""


@dataclass(frozen=True)
class StepResult:
    layout: str
    measured_s: float
    before_s: float
    after_s: float
    scale: float


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
    timed = {n for r in results if r.latency_measured for n in r.names}
    by_name = {a.name: a for a in (*calibrated.domain_axes, calibrated.scale_out)}
    old = {a.name: a for a in (*target.domain_axes, target.scale_out)}
    note = f"measured: trnopt calibrate {when[:10]} (nccom-test), see [calibration]"
    for name in sorted(measured):
        for table, start, end in reversed(_blocks(lines)):
            is_axis = table == "axes" and any(re.match(rf'^\s*name\s*=\s*"{re.escape(name)}"', lines[i])
                                              for i in range(start, end))
            if is_axis or (table == "scale_out" and name == calibrated.scale_out.name):
                a = by_name[name]
                if name in timed:
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
           "model = \"per link class (the class that limits each run in the cost model), the achievable share and "
           "per-hop latency at which optimizer/cost/collectives.py's time, the algorithm chosen by size, is closest "
           "to every row of its runs (least squares of the relative error; rms_rel_error, max_rel_error: that "
           "model against the rows); alpha_us and bus_bandwidth_gbs: the alpha-beta line t = alpha + beta * size "
           "(weights 1/t^2) on the sizes from fit_from_bytes (the Neuron runtime's ring algorithms)\"",
           "",
           "[calibration.constants]"]
    for a in (*calibrated.domain_axes, calibrated.scale_out):
        key = "scale_out" if a is calibrated.scale_out else f"axes.{a.name}"
        timed = any(a.name in r.names and r.latency_measured for r in results)
        out += [f'"{key}.achievable" = "{"measured" if a.name in measured else "datasheet"}"',
                f'"{key}.latency_us" = "{"measured" if timed else "datasheet"}"']
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
                f"alpha_beta_rms_rel_error = {_value(r.fit.rms_rel_error)}"]
        if r.achievable is not None:
            out += [f"achievable = {_value(r.achievable)}", f"latency_us = {_value(r.latency_s * 1e6)}",
                    f"rms_rel_error = {_value(r.model_rms_rel_error)}", f"max_rel_error = {_value(r.model_max_rel_error)}"]
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
