"""nccom-test output: the parser, the alpha-beta fit, and what a run measures on a target.

nccom-test (Neuron's collective benchmark, "NCCOM-TEST User Guide") prints one row per
message size under the header ``size(B) count(elems) type time(us) algbw(GB/s)
busbw(GB/s)`` (an ``algorithm`` column with --show-algorithm; ``time:avg`` / ``time:pNN``
columns in place of ``time(us)`` in some releases) and the footer ``Avg bus bandwidth:
X GB/s``. Per the guide, time is the P50 in microseconds, algbw = size / time in GiB/s
although the column says GB/s, and busbw = algbw x 2(r-1)/r for all-reduce, x (r-1)/r
for all-gather, reduce-scatter and all-to-all, x 1 for permute / send-receive (the
nccl-tests "bus bandwidth" convention, NVIDIA nccl-tests doc/PERFORMANCE.md).

The table does not say on how many ranks and nodes it ran; a file gives them in one of
three ways (first match wins):

1. a line ``# trnopt: op=all_reduce ranks=64 nodes=2 [ultraservers=1] [lnc=2]`` anywhere
   before the table (``ultraservers``: how many scale-up domains the nodes span, default
   as few as hold them; ``lnc``: the LNC nccom-test ran at, default the target's);
2. the nccom-test command line as the tool's users paste it, e.g. the first line
   ``# nccom-test -r 64 -N 2 -b 8 -e 1GB -f 2 -d fp32 allr`` (``$`` or ``#`` prefix and
   ``VAR=value`` assignments allowed; ``-r/--nworkers``, ``-N/--nnodes``, the operation);
3. the file name: ``<op>_r<ranks>_N<nodes>.txt``, e.g. ``allr_r64_N2.txt``.

What a run measures on a target: optimizer/cost/nccom_run.py.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.inputfile import read_text
from trnopt.optimizer.model.target import GIB

OPS = {"all_reduce": "all_reduce", "allr": "all_reduce", "all_gather": "all_gather", "allg": "all_gather",
       "reduce_scatter": "reduce_scatter", "redsct": "reduce_scatter", "alltoall": "all_to_all",
       "all_to_all": "all_to_all", "permute": "p2p", "sendrecv": "p2p"}
DTYPE_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "fp16": 2, "bf16": 2, "uint32": 4, "int32": 4,
               "fp32": 4, "fp8": 1, "fp8e4": 1, "fp8e5": 1}
MIN_SIZES = 3
MAX_COUNT = 2**20
"""Largest rank, node or domain count a file or flag may state (far above any Neuron cluster)."""
MAX_SIZE = 2**50
"""Largest message size (bytes) a row may state (1 PiB; nccom-test's -e tops out far below)."""
NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?"
"""A decimal number in ASCII digits (Python's float() also takes other scripts' digits and '_')."""
TIME_DROP = 0.03
"""How far (relative) a row's time may fall below a smaller size's before the table is refused:
the guide's two-instance example has 1,315 us at 128 KiB and 1,311 us at 256 KiB."""
ALGBW_DROP = 0.75
"""How far (relative) the largest size's algbw may fall below the best of the table before it is
refused: the runtime's switch from RDH to a ring adds a fixed ring setup that halves algbw
just above the switch in the cost model (collectives.Runtime.ring_setup), after which it
climbs again; a table whose bandwidth ends below a quarter of its best is falling.
"""
MIN_GROWTH = 1.05
"""The largest message must take at least this many times the smallest's: else the table never
leaves the latency floor and measures no bandwidth."""


class MeasurementError(InputError):
    """A malformed measurement file: ``FILE:LINE: rule`` (exit 2)."""

    def __init__(self, path: str, line: int, rule: str):
        super().__init__(path, str(line), rule)
        Exception.__init__(self, f"{self.source}:{line}: {self.rule}")


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw: 2(r-1)/r all-reduce; (r-1)/r all-gather, reduce-scatter, all-to-all; 1 point-to-point."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class Row:
    line: int
    size: int
    """Bytes per rank: the buffer (all-reduce), the gathered output (all-gather), the unreduced input."""
    time_s: float
    algbw: float
    busbw: float


@dataclass(frozen=True)
class Run:
    """One nccom-test table: an operation on ``ranks`` ranks over ``nodes`` instances."""

    path: str
    op: str
    """The cost model's name: all_reduce, all_gather, reduce_scatter, all_to_all or p2p."""
    ranks: int
    nodes: int
    domains: int | None
    """Scale-up domains the nodes span (None: as few as hold them)."""
    lnc: int | None
    """The LNC nccom-test ran at (None: the target's default)."""
    header_line: int
    """The line that gave the operation, ranks and nodes (for error messages)."""
    rows: tuple[Row, ...]


# -- parsing -------------------------------------------------------------------------------------
def _shape_from_header(lines: list[str]) -> tuple[dict, int]:
    """Keys found in a ``# trnopt:`` line or an nccom-test command line, and that line's number."""
    for n, raw in enumerate(lines, 1):
        text = raw.strip().lstrip("#$ ").strip()
        if text.startswith("trnopt:"):
            found = {}
            for item in text[len("trnopt:"):].split():
                key, eq, value = item.partition("=")
                if not eq or key not in ("op", "ranks", "nodes", "ultraservers", "lnc"):
                    raise MeasurementError("", n, f"expected key=value with key op, ranks, nodes, ultraservers or "
                                           f"lnc, got {item!r}")
                found[key] = value
            return found, n
        if "nccom-test" in text:
            try:
                words = shlex.split(text)
            except ValueError:
                words = text.split()
            words = words[words.index(next(w for w in words if w.endswith("nccom-test"))) + 1:]
            found, i = {}, 0
            while i < len(words):
                w = words[i]
                if w in ("-r", "--nworkers", "-N", "--nnodes") and i + 1 < len(words):
                    found["ranks" if w in ("-r", "--nworkers") else "nodes"] = words[i + 1]
                    i += 2
                    continue
                if w in OPS:
                    found["op"] = w
                i += 1
            return found, n
    return {}, 1


def _int_value(path: str, line: int, key: str, value: str) -> int:
    """A positive integer in ASCII digits, at most MAX_COUNT (a 5,000-digit count is refused, not parsed)."""
    if not re.fullmatch(r"[0-9]{1,9}", str(value)) or not 1 <= int(value) <= MAX_COUNT:
        raise MeasurementError(path, line, f"{key} must be an integer from 1 to {MAX_COUNT:,} in ASCII digits, got "
                               f"{str(value)[:40]!r}")
    return int(value)


def parse(text: str, path: str, given: dict[str, str] | None = None) -> Run:
    """One nccom-test output; MeasurementError naming the file, the line and the rule.

    ``given``: the shape calibrate's flags state (keys op, ranks, nodes; values as typed),
    for files that state none: nccom-test prints no command line. A file that states a
    different value than a flag is refused.
    """
    lines = text.splitlines()
    try:
        shape, at = _shape_from_header(lines)
    except MeasurementError as exc:
        raise MeasurementError(path, int(exc.key), exc.rule) from None
    name = Path(path).name
    for key, value in (given or {}).items():
        if key in shape and (OPS.get(shape[key]) if key == "op" else shape[key].lstrip("0")) != \
                (OPS.get(value) if key == "op" else value.lstrip("0")):
            raise MeasurementError(path, at, f"the file gives {key} {shape[key]!r}, --{key} {value!r}")
        shape[key] = value
    m = re.search(r"(?:^|[_.-])r([0-9]+)(?:[_.-]N([0-9]+))?(?:[_.-]|$)", name)
    if "ranks" not in shape and m:
        shape["ranks"], shape["nodes"] = m.group(1), m.group(2) or "1"
    if "op" not in shape:
        op = next((o for o in sorted(OPS, key=len, reverse=True) if re.match(rf"{o}(?:[_.-]|$)", name)), None)
        if op:
            shape["op"] = op
    if "ranks" not in shape or "op" not in shape:
        raise MeasurementError(path, at, "rank count or operation not given: pass --op, --ranks and --nodes, "
                               "start the file with the command (# nccom-test -r 64 -N 2 ... allr) or a "
                               "'# trnopt: op=all_reduce ranks=64 nodes=2' line, or name it like allr_r64_N2.txt")
    if shape["op"] not in OPS:
        raise MeasurementError(path, at, f"unknown operation {shape['op']!r}; one of {', '.join(sorted(OPS))}")
    op = OPS[shape["op"]]
    ranks = _int_value(path, at, "ranks", shape["ranks"])
    nodes = _int_value(path, at, "nodes", shape.get("nodes", "1"))
    if ranks % nodes:
        raise MeasurementError(path, at, f"{ranks} ranks do not divide equally over {nodes} nodes")
    if ranks < 2:
        raise MeasurementError(path, at, "a collective needs at least 2 ranks")
    domains = _int_value(path, at, "ultraservers", shape["ultraservers"]) if "ultraservers" in shape else None
    lnc = _int_value(path, at, "lnc", shape["lnc"]) if "lnc" in shape else None
    rows = _table(lines, path, op, ranks)
    return Run(path, op, ranks, nodes, domains, lnc, at, tuple(rows))


def _table(lines: list[str], path: str, op: str, ranks: int) -> list[Row]:
    start = next((n for n, raw in enumerate(lines, 1) if raw.split()[:1] == ["size(B)"]), None)
    if start is None:
        raise MeasurementError(path, len(lines) or 1, "no nccom-test table: expected a header line starting "
                               "with size(B)")
    cols = lines[start - 1].split()
    need = {"size(B)", "count(elems)", "type", "algbw(GB/s)", "busbw(GB/s)"}
    times = [c for c in cols if re.fullmatch(r"time(:(avg|p\d+))?(\(us\))?", c)]
    if not need <= set(cols) or not times:
        missing = sorted(need - set(cols)) or ["time(us)"]
        raise MeasurementError(path, start, f"header lacks {', '.join(missing)}")
    time_col = next((c for c in times if c.startswith("time(")), None) or \
        next((c for c in times if "avg" in c), times[0])
    idx = {c: cols.index(c) for c in (*need, time_col)}
    rows, footer, factor = [], None, bus_factor(op, ranks)
    for n in range(start + 1, len(lines) + 1):
        raw = lines[n - 1].strip()
        if not raw:
            continue
        if raw.startswith("Avg bus bandwidth"):
            m = re.fullmatch(rf"Avg bus bandwidth\s*:\s*({NUMBER})\s*GB/s", raw)
            if m is None or not math.isfinite(float(m.group(1))):
                raise MeasurementError(path, n, "expected 'Avg bus bandwidth: <number>GB/s' (a finite number in "
                                       "ASCII digits)")
            footer = (n, float(m.group(1)))
            break
        words = raw.split()
        if len(words) != len(cols):
            raise MeasurementError(path, n, f"expected {len(cols)} columns ({' '.join(cols)}), got {len(words)}"
                                   + (" (a failed benchmark row)" if "Failure" in raw else ""))
        rows.append(_row(path, n, words, idx, time_col, factor))
    if footer is None:
        raise MeasurementError(path, len(lines), "no 'Avg bus bandwidth' footer: the output is cut short")
    if len({r.size for r in rows}) < MIN_SIZES:
        raise MeasurementError(path, start, f"needs at least {MIN_SIZES} message sizes for the alpha-beta fit, "
                               f"got {len({r.size for r in rows})}")
    _physical(path, rows)
    mean = sum(r.busbw for r in rows) / len(rows)
    if abs(mean - footer[1]) > 0.01 + 0.01 * footer[1]:
        raise MeasurementError(path, footer[0], f"Avg bus bandwidth {footer[1]:g} GB/s is not the mean of the "
                               f"busbw column ({mean:.4f})")
    return rows


def _physical(path: str, rows: list[Row]) -> None:
    """Refuse a table no link could produce: sizes out of order, a time that falls as the size
    grows, algbw that falls (time growing faster than the size), or no growth at all."""
    for prev, row in zip(rows, rows[1:]):
        if row.size <= prev.size:
            raise MeasurementError(path, row.line, f"size(B) {row.size} does not grow down the table (line "
                                   f"{prev.line}: {prev.size}): nccom-test prints each size once, smallest first")
    slowest = rows[0]
    for row in rows[1:]:
        if row.time_s < slowest.time_s * (1 - TIME_DROP) - 2e-6:
            raise MeasurementError(path, row.line, f"time falls as the size grows ({row.time_s * 1e6:g} us for "
                                   f"{row.size} B, {slowest.time_s * 1e6:g} us for {slowest.size} B on line "
                                   f"{slowest.line}): no link moves more bytes in less time")
        slowest = row if row.time_s > slowest.time_s else slowest
    best = max(rows, key=lambda r: r.size / r.time_s)
    rate, top = rows[-1].size / rows[-1].time_s, best.size / best.time_s
    if rate < top * (1 - ALGBW_DROP):
        raise MeasurementError(path, rows[-1].line, f"bandwidth falls as the size grows (algbw {rate / GIB:.3g} GiB/s "
                               f"for {rows[-1].size} B, {top / GIB:.3g} for {best.size} B on line {best.line}): time "
                               "grows faster than the size")
    if rows[-1].time_s < rows[0].time_s * MIN_GROWTH:
        raise MeasurementError(path, rows[-1].line, f"time does not grow with the size ({rows[0].time_s * 1e6:g} us "
                               f"for {rows[0].size} B, {rows[-1].time_s * 1e6:g} us for {rows[-1].size} B): the "
                               "table never leaves the latency floor and measures no bandwidth")


def _number(path: str, n: int, col: str, text: str) -> float:
    if not re.fullmatch(NUMBER, text):
        raise MeasurementError(path, n, f"{col} must be a finite number >= 0 in ASCII digits, got {text[:40]!r}")
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise MeasurementError(path, n, f"{col} must be a finite number >= 0, got {text!r}")
    return value


def _row(path: str, n: int, words: list[str], idx: dict, time_col: str, factor: float) -> Row:
    size_t, count_t, dtype = words[idx["size(B)"]], words[idx["count(elems)"]], words[idx["type"]]
    if not re.fullmatch(r"[0-9]{1,16}", size_t) or not re.fullmatch(r"[0-9]{1,16}", count_t) or \
            not 1 <= int(size_t) <= MAX_SIZE:
        raise MeasurementError(path, n, f"size(B) and count(elems) must be integers from 1 to {MAX_SIZE} in ASCII "
                               f"digits, got {size_t[:40]!r} {count_t[:40]!r}")
    if dtype not in DTYPE_BYTES:
        raise MeasurementError(path, n, f"unknown type {dtype!r}; one of {', '.join(DTYPE_BYTES)}")
    size, count = int(size_t), int(count_t)
    if size != count * DTYPE_BYTES[dtype]:
        raise MeasurementError(path, n, f"size(B) {size} is not count(elems) {count} x {DTYPE_BYTES[dtype]} bytes "
                               f"of {dtype}")
    time_us = _number(path, n, time_col, words[idx[time_col]])
    if time_us <= 0:
        raise MeasurementError(path, n, f"{time_col} must be > 0")
    algbw, busbw = (_number(path, n, c, words[idx[c]]) for c in ("algbw(GB/s)", "busbw(GB/s)"))
    # algbw is size / time in GiB/s (the guide), rounded to 2 decimals from an unrounded time
    # (tolerance: the 2-decimal rounding of both bandwidths and the whole-microsecond time)
    expect = size / (time_us * 1e-6) / GIB
    slack = 0.006 + expect * (0.01 + 0.6 / time_us)
    if abs(algbw - expect) > slack and abs(algbw - expect * GIB / 1e9) > slack * GIB / 1e9:
        raise MeasurementError(path, n, f"algbw {algbw:g} is not size / time = {expect:.3f} GiB/s")
    if abs(busbw - algbw * factor) > 0.016 + 0.01 * busbw:
        raise MeasurementError(path, n, f"busbw {busbw:g} is not algbw x {factor:.4g} for this operation and "
                               "rank count")
    return Row(n, size, time_us * 1e-6, algbw, busbw)


def read_runs(path: str, given: dict[str, str] | None = None) -> list[Run]:
    """Every nccom-test output in a file, or in the regular files of a directory (sorted by name);
    ``given`` as in ``parse``."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise MeasurementError(path, 1, "directory holds no files")
    else:
        files = [p]
    # regular files only, within the loaders' size limit (a FIFO or /dev/zero is refused, not read)
    return [parse(read_text(str(f), "--nccom", kind="nccom-test output"), str(f), given) for f in files]


# -- the alpha-beta fit --------------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    """``t(S) = alpha + beta * S`` fitted on one run, with its error."""

    alpha_s: float
    beta_s_per_byte: float
    rms_rel_error: float
    max_rel_error: float
    points: int

    def bus_bandwidth(self, op: str, ranks: int) -> float:
        """Bytes/s of bus bandwidth the fit implies: bus factor / beta (the busbw of a large message)."""
        return bus_factor(op, ranks) / self.beta_s_per_byte


def fit_alpha_beta(sizes: list[float], times: list[float]) -> Fit:
    """Weighted least squares of ``t = alpha + beta * S`` with weights 1 / t^2.

    The Hockney (alpha-beta) model of a message's time (Hockney 1994; Thakur et al. 2005).
    Weighting every residual by 1/t minimises the relative error, so that the small
    messages, which carry alpha, count as much as the large ones, which carry beta.
    Closed form of the 2x2 normal equations: with w = 1/t^2,
    beta = (Sw Swxy - Swx Swy) / (Sw Swxx - Swx^2), alpha = (Swy - beta Swx) / Sw.
    """
    w = [1 / t**2 for t in times]
    sw = sum(w)
    swx = sum(wi * x for wi, x in zip(w, sizes))
    swy = sum(wi * y for wi, y in zip(w, times))
    swxx = sum(wi * x * x for wi, x in zip(w, sizes))
    swxy = sum(wi * x * y for wi, x, y in zip(w, sizes, times))
    det = sw * swxx - swx * swx
    if det <= 0:
        raise ValueError("the fit needs at least two distinct message sizes")
    beta = (sw * swxy - swx * swy) / det
    alpha = (swy - beta * swx) / sw
    rel = [(alpha + beta * x - t) / t for x, t in zip(sizes, times)]
    return Fit(alpha, beta, math.sqrt(sum(r * r for r in rel) / len(rel)), max(abs(r) for r in rel), len(rel))


def fit_run(run: Run, min_size: float = 0.0) -> Fit:
    """The fit on the run's rows of at least ``min_size`` bytes (all rows when fewer than MIN_SIZES are);
    MeasurementError when its slope is not positive (a time that does not grow with the size)."""
    rows = [r for r in run.rows if r.size >= min_size]
    if len({r.size for r in rows}) < MIN_SIZES:
        rows = list(run.rows)
    fit = fit_alpha_beta([r.size for r in rows], [r.time_s for r in rows])
    if fit.beta_s_per_byte <= 0:
        raise MeasurementError(run.path, rows[-1].line, f"the time of the messages from {rows[0].size} B up does not "
                               "grow with their size: no link has an unbounded bandwidth")
    return fit
