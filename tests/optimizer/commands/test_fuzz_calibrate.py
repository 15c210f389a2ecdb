"""Hostile input through calibrate (nccom-test tables and its flags) and compare (its flags).

Every run goes through fuzzing.cli and its contract (exit code in 0-3, one-line errors, no
traceback, no exit 70, no hang); each test adds when exit 0 would be wrong. Tables start
from a valid one the cost model times (nccom_tables.model_table, the algorithm by size) and
take one mutation: a cell replaced by a hostile token, a line dropped, doubled or moved, the
times made flat, reversed or noisy past what a link does, the header or footer changed.
Hypothesis runs derandomized with a bounded number of examples.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fuzzing import FUZZ, assert_refused, cli
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.model.target import load_target

_spec = importlib.util.spec_from_file_location("nccom_tables", Path(__file__).parents[1] / "cost" / "nccom_tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

# a cell's replacement, and whether a table holding it must be refused wherever it lands
TOKENS = [(".", True), ("1.2.3", True), ("\u00b2", True), ("\u0666\u0664", True), ("\uff14", True), ("9" * 5000, True),
          ("-1", True), ("nan", True), ("inf", True), ("1e999", True), ("1_0", True), ("0x10", True),
          ("\x1b[2J", True), ("0", True), ("", True), ("1e-300", True)]
MUTATIONS = ("cell", "drop", "double", "swap", "flat", "reverse", "spike", "footer", "header", "truncate", "scale")
RUN = ("trn2u", "all_reduce", 64, 1)


def _valid() -> list[str]:
    name, op, ranks, nodes = RUN
    return tables.model_table(load_target(name), op, ranks, nodes).splitlines()


VALID = _valid()
ROWS = range(2, len(VALID) - 1)  # 0-based indices of the table's rows (after the command and the header)


def _times(lines: list[str], times: list[int]) -> list[str]:
    """The rows with their time(us) replaced and algbw, busbw and the footer kept consistent with them."""
    out = lines[:2]
    busbws = []
    for i, t in zip(ROWS, times):
        size, count, dtype = lines[i].split()[:3]
        algbw = int(size) / (t * 1e-6) / 2**30
        busbw = algbw * 2 * 63 / 64
        busbws.append(round(busbw, 2))
        out.append(f"{size:>12} {count:>15} {dtype:>8} {t:>11} {algbw:>14.2f} {busbw:>14.2f}")
    return out + [f"Avg bus bandwidth:      {sum(busbws) / len(busbws):.4f}GB/s"]


def mutate(kind: str, i: int, j: int) -> tuple[str, bool]:
    """(the mutated table, whether exit 0 is wrong)."""
    lines = list(VALID)
    row, other = ROWS[i % len(ROWS)], ROWS[j % len(ROWS)]
    times = [int(lines[r].split()[3]) for r in ROWS]
    if kind == "cell":
        token, garbage = TOKENS[j % len(TOKENS)]
        cells = lines[row].split()
        col = i % len(cells)
        cells[col] = token
        lines[row] = " ".join(cells)
        # 0 (or nearly) is a real algbw or busbw of a small message
        return "\n".join(lines), garbage and not (col >= 4 and token in ("0", "1e-300"))
    if kind == "drop":
        del lines[row]
        return "\n".join(lines), False  # a table with a size left out is still a table
    if kind == "double":
        lines.insert(row, lines[row])
        return "\n".join(lines), True  # the same size twice: nccom-test prints each once
    if kind == "swap":
        if row == other:
            return "\n".join(lines), False
        lines[row], lines[other] = lines[other], lines[row]
        return "\n".join(lines), True  # sizes out of order
    if kind == "flat":
        return "\n".join(_times(lines, [times[0]] * len(times))), True
    if kind == "reverse":
        return "\n".join(_times(lines, times[::-1])), True
    if kind == "spike":  # the largest message ten times faster than the one before: times fall
        times[-1] = max(1, times[-2] // 10)
        return "\n".join(_times(lines, times)), True
    if kind == "footer":
        lines[-1] = ["Avg bus bandwidth: .GB/s", "Avg bus bandwidth: 1.2.3GB/s", "Avg bus bandwidth:",
                     "Avg bus bandwidth: \u0664GB/s", "Avg bus bandwidth: 1e999GB/s", "Avg bus"][j % 6]
        return "\n".join(lines), True
    if kind == "header":
        lines[1] = lines[1].replace(["size(B)", "time(us)", "busbw(GB/s)", "type"][j % 4], "x")
        return "\n".join(lines), True
    if kind == "truncate":
        return "\n".join(lines[:row]), True  # no footer: cut short
    # scale: a time from a faster machine in the middle of the table (algbw no longer size / time)
    cells = lines[row].split()
    cells[3] = str(int(cells[3]) * (2 + j % 7))
    lines[row] = " ".join(cells)
    return "\n".join(lines), True


@FUZZ
@given(kind=st.sampled_from(MUTATIONS), i=st.integers(0, 200), j=st.integers(0, 200))
def test_mutated_nccom_tables(tmp_path_factory, kind, i, j):
    tmp = tmp_path_factory.mktemp("nccom")
    text, garbage = mutate(kind, i, j)
    path = tmp / "allr_r64_N1.txt"
    path.write_text(text, encoding="utf-8")
    run = cli("calibrate", "--target", RUN[0], "--nccom", path, "--out", tmp / "cal.toml")
    if garbage:
        assert_refused(run, str(path))
    if run.code == 2:
        assert run.err.startswith(f"trnopt: error: {path}:") or "--" in run.err, run.err


SHAPES = [("--op", ["allr", "allg", "bogus", "", "\u0627", "ALLR", "allr;rm", "-1"]),
          ("--ranks", ["64", "0", "-1", "\u0666\u0664", "\uff16\uff14", "9" * 5000, "1e3", "64.0", "", "2"]),
          ("--nodes", ["1", "0", "\u0661", "9" * 5000, "3", "65", "x"])]


@FUZZ
@given(op=st.sampled_from(SHAPES[0][1]), ranks=st.sampled_from(SHAPES[1][1]), nodes=st.sampled_from(SHAPES[2][1]))
def test_shape_flags_of_raw_nccom_test_output(tmp_path_factory, op, ranks, nodes):
    tmp = tmp_path_factory.mktemp("raw")
    path = tmp / "out.txt"
    path.write_text("\n".join(VALID[1:]), encoding="utf-8")  # no command line: nccom-test prints none
    run = cli("calibrate", "--target", "trn2u", "--nccom", path, "--op", op, "--ranks", ranks, "--nodes", nodes,
              "--out", tmp / "cal.toml")
    if (op, ranks, nodes) != ("allr", "64", "1"):
        # every other shape is wrong for this table (its busbw is all-reduce's on 64 ranks) or not a shape
        assert_refused(run, "--op", "--ranks", "--nodes", str(path))
    else:
        assert run.code == 0 and (tmp / "cal.toml").exists()


def test_the_unmutated_table_and_shape_calibrate():
    """The fuzz tests' starting points are accepted: the refusals above are the mutations'."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "allr_r64_N1.txt"
        path.write_text("\n".join(VALID), encoding="utf-8")
        assert cli("calibrate", "--target", "trn2u", "--nccom", path, "--out", Path(d) / "a.toml").code == 0
        path.write_text("\n".join(VALID[1:]), encoding="utf-8")
        assert cli("calibrate", "--target", "trn2u", "--nccom", path, "--op", "allr", "--ranks", "64", "--nodes", "1",
                   "--out", Path(d) / "b.toml").code == 0


COMPARE_BAD = [("--targets", ["", ",", "trn2u,,trn2u", "nope", "x" * 5000, "trn2u,trn2u", "\x00", "/dev/zero"]),
               ("--ultraservers", ["0", "-1", "\u0663", "1e3", "abc", "99999999999999999999", ""]),
               ("--time-limit", ["0", "-1", "nan", "inf", "1e308", "x", ""]),
               # (the shared integer flags still read other scripts' digits: int("\u0661") is 1; not fuzzed here)
               ("--seed", ["-1", "1.5", "2147483648"]),
               ("--workers", ["0", "65", "two"]),
               ("--global-batch", ["0", "-4", "1e9"]),
               ("--objective", ["fastest", "", "step-time;x"])]


@settings(FUZZ, max_examples=30)
@given(which=st.integers(0, len(COMPARE_BAD) - 1), k=st.integers(0, 50))
def test_compare_flags(which, k):
    flag, values = COMPARE_BAD[which]
    value = values[k % len(values)]
    run = cli("compare", "--model", "llama3-8b", "--targets", "trn2,trn3-gen1", "--time-limit", 5, flag, value)
    assert_refused(run, flag, flag.lstrip("-").replace("-", "_"), "target", "global", value[:20] or "--")
    assert run.out == ""  # refused before any search
