"""Hostile input through every command, part 1: target and model files, flags, output paths, special files.

Every run goes through fuzzing.cli and its contract (exit code in 0-3, one-line errors, no
traceback, no hang, stdout under 1 MB); each test adds when exit 0 would be wrong. Inputs:
the shipped target and model files with one value replaced (wrong type, NaN, inf, 1e300,
1e-300 for rates, negative), a key dropped or added, nesting, control characters, a
byte-order mark; every numeric flag at and past its ends and as text; output paths that
cannot be written; a FIFO, /dev/zero, a directory, non-UTF-8 and empty files as every input.
Hypothesis runs derandomized with a bounded number of examples; with test_fuzz_layouts.py
it takes about a minute on a loaded 2-core machine.
"""

from __future__ import annotations

import copy
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fuzzing import FUZZ, MAX_STDOUT, TIMED_OUT, assert_refused, at, cli, leaves, shipped, to_toml, valid_layout, write
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.model.target import BUILTIN_TARGETS
from trnopt.optimizer.model.workload import PRESETS


RATE_SUFFIXES = ("_tflops", "_gbs", "_gbps_per_instance", "_ghz", "hbm_gib", "_mtbf_hours", "_gbs_per_instance")
WRONG_TYPES = ["4", True, [1], {"a": 1}, "", "\x1b[31m"]
NOT_FINITE_OR_ABSURD = [math.nan, math.inf, -math.inf, 1e300, -1.0, -1]
ABSURD_INTS = [2**70, -(2**70), 1e300]

mutation = st.sampled_from(["type", "absurd", "tiny", "drop", "add", "deep", "bom", "control"])


def mutate(data: dict, kind: str, draw_index: int, value_index: int) -> tuple[dict | str, bool, str]:
    """(new data or raw text, whether exit 0 is wrong, the key named) for one mutation of ``kind``."""
    data = copy.deepcopy(data)
    paths = leaves(data)
    path = paths[draw_index % len(paths)]
    parent, key = at(data, path), path[-1]
    old = parent[key]
    name = str(key)
    if kind == "type":
        if isinstance(old, str):
            parent[key] = [1, 2]
        elif isinstance(old, list):
            parent[key] = "4"
        elif isinstance(old, bool):
            parent[key] = 1
        else:
            parent[key] = WRONG_TYPES[value_index % len(WRONG_TYPES)]
        return data, True, name
    if kind == "absurd" and isinstance(old, (int, float)) and not isinstance(old, bool):
        values = ABSURD_INTS if isinstance(old, int) else NOT_FINITE_OR_ABSURD
        parent[key] = values[value_index % len(values)]
        return data, True, name
    if kind == "tiny" and isinstance(old, (int, float)) and not isinstance(old, bool):
        parent[key] = 1e-300
        return data, str(key).endswith(RATE_SUFFIXES), name
    if kind == "drop" and isinstance(parent, dict):
        del parent[key]
        return data, False, name
    if kind == "add":
        (parent if isinstance(parent, dict) else data)[name + "x"] = 1
        return data, True, name + "x"
    if kind == "deep":
        nested: Any = 1
        for _ in range(40 + value_index):
            nested = [nested]
        parent[key] = nested
        return data, True, "nested"
    if kind == "control" and isinstance(old, str):
        parent[key] = old + "\x1b[2J\n"
        return data, True, name
    if kind == "bom":
        return "\ufeff" + to_toml(data), False, ""
    return data, False, ""


@FUZZ
@given(name=st.sampled_from(BUILTIN_TARGETS), kind=mutation, i=st.integers(0, 400), j=st.integers(0, 20))
def test_mutated_target_files(tmp_path_factory, name, kind, i, j):
    content, bad, key = mutate(shipped("machines", name), kind, i, j)
    path = write(tmp_path_factory.mktemp("t"), "target.toml", content)
    shown = cli("targets", "show", path)
    scored = cli("evaluate", "--target", path, "--model", "llama3-8b", "--tp", 1, "--pp", 1,
                 "--instances", 1 if name in ("trn1", "trn2", "a100", "h100") else 4, "--global-batch", 4096)
    if bad:
        assert_refused(shown, str(path))
        assert_refused(scored, str(path))
        assert key in shown.err or kind == "deep", shown.err
    if kind == "bom":
        assert shown.code == 0, shown


@FUZZ
@given(name=st.sampled_from(PRESETS), kind=mutation, i=st.integers(0, 400), j=st.integers(0, 20))
def test_mutated_model_files(tmp_path_factory, name, kind, i, j):
    content, bad, key = mutate(shipped("models", name), kind, i, j)
    path = write(tmp_path_factory.mktemp("m"), "model.toml", content)
    shown = cli("models", "show", path)
    scored = cli("evaluate", "--model", path, "--target", "trn2", "--tp", 1, "--pp", 1, "--dp", 64,
                 "--global-batch", 64)
    if bad:
        assert_refused(shown, str(path))
        assert_refused(scored, str(path))
    if kind == "bom":
        assert shown.code == 0, shown


# -- flags ----------------------------------------------------------------------------------
EVALUATE = ["evaluate", "--target", "trn2", "--model", "llama3-8b"]
INT_FLAGS = {  # flag -> (lowest, highest) valid; a value outside must be refused
    "--seq": (1, 2**26), "--global-batch": (1, 2**26), "--tp": (1, 2**32), "--pp": (1, 2**32),
    "--dp": (1, 2**32), "--ep": (1, 2**32), "--cp": (1, 2**32), "--zero": (0, 3), "--micro-batch": (1, 2**26),
    "--interleave": (1, 2**16), "--lnc": (1, 2), "--instances": (1, 2**18),
}
SEARCH_FLAGS = {"--workers": (1, 64), "--seed": (0, 2**31 - 1), "--top": (0, 50)}
FLOAT_FLAGS = {"--headroom": (0.0, 1.0), "--time-limit": (0.0, 7 * 86400.0)}
int_values = st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 4, 64, 2**31, 2**63, 10**30])
text_values = st.sampled_from(["", "nan", "1e3", "4.5", "0x10", "1" * 5000, "\x00", "--", "  4"])
float_values = st.sampled_from([math.nan, math.inf, -math.inf, 1e-300, 1e300, -0.0, -1.0, 0.5, 1.0])


@FUZZ
@given(flag=st.sampled_from(sorted(INT_FLAGS)), value=int_values)
def test_integer_flags_of_evaluate(flag, value):
    run = cli(*EVALUATE, *(["--tp", 4] if flag != "--tp" else []), flag, value)
    low, high = INT_FLAGS[flag]
    if not low <= value <= high:
        assert_refused(run, flag, "--tp/--pp/--dp")


@FUZZ
@given(flag=st.sampled_from(sorted(INT_FLAGS) + sorted(SEARCH_FLAGS) + sorted(FLOAT_FLAGS)), value=text_values)
def test_flags_that_are_not_numbers(flag, value):
    if flag == "--time-limit" and value in ("1e3", "4.5", "  4"):
        return  # a valid time limit: the search would run
    if flag in SEARCH_FLAGS or flag == "--time-limit":
        run = cli("solve", "--target", "trn2", "--model", "llama3-8b", "--instances", 1, flag, value)
    else:
        run = cli(*EVALUATE, *(["--tp", 4] if flag != "--tp" else []), flag, value)
    if value != "  4" or flag in FLOAT_FLAGS:  # int("  4") is 4; --headroom 4 is out of range
        assert_refused(run, flag)
        assert run.out == ""


@FUZZ
@given(flag=st.sampled_from(sorted(SEARCH_FLAGS) + sorted(FLOAT_FLAGS)), value=st.one_of(int_values, float_values))
def test_search_flags_out_of_range_are_refused_before_solving(flag, value):
    low, high = {**SEARCH_FLAGS, **FLOAT_FLAGS}[flag]
    valid = (isinstance(value, int) or flag in FLOAT_FLAGS) and math.isfinite(value) and low <= value <= high
    valid = valid and not (flag == "--headroom" and value == 1.0) and not (flag == "--time-limit" and value <= 0)
    if flag in SEARCH_FLAGS and isinstance(value, float):
        valid = False
    if valid:
        return  # in range: the search runs (covered by test_small_solves)
    run = cli("solve", "--target", "trn2", "--model", "llama3-8b", "--instances", 1, "--global-batch", 64, flag, value)
    assert_refused(run, flag)
    assert run.out == ""  # refused before any search


@settings(FUZZ, max_examples=4)
@given(model=st.sampled_from(["llama3-8b", "mixtral-8x7b"]), batch=st.sampled_from([1, 7, 64, 1000]),
       instances=st.sampled_from([1, 2, 100000]), lnc=st.sampled_from(["1", "2"]))
def test_small_solves(model, batch, instances, lnc):
    run = cli("solve", "--target", "trn2", "--model", model, "--global-batch", batch, "--instances", instances,
              "--lnc", lnc, "--seq", 4096, "--time-limit", 3, "--workers", 2, "--format", "json")
    if run.code == 0:
        data = json.loads(run.out)
        assert data["layout"]["lnc"] == int(lnc)
        assert batch % (data["layout"]["dp"] * data["layout"]["micro_batch"]) == 0
        assert len(run.out) < MAX_STDOUT
    if run.code == 3:
        assert "GiB" in run.err or "no layout of" in run.err or TIMED_OUT in run.err, run.err


def test_exit_3_is_proven_when_no_degrees_tile_the_machine():
    run = cli("solve", "--target", "trn2", "--model", "llama3-8b", "--instances", 100000, "--time-limit", 5,
              "--seq", 4096)
    assert run.code == 3 and "whatever the memory" in run.err and "largest is 1,048,576" in run.err
    assert "--instances 16384" in run.err


# -- output paths ---------------------------------------------------------------------------
def unwritable(tmp: Path) -> dict[str, str]:
    (tmp / "file").write_text("x")
    (tmp / "link").symlink_to(tmp / "nowhere.json")
    return {"a directory": str(tmp), "a missing folder": str(tmp / "no" / "x.json"),
            "under a file": str(tmp / "file" / "x.json"), "/proc": "/proc/trnopt-x.json",
            "a dangling link": str(tmp / "link"), "an existing file": str(tmp / "file"), "empty": ""}


@pytest.mark.parametrize("command", [
    ["solve", "--target", "trn2", "--model", "llama3-8b", "--instances", 1, "--global-batch", 64, "--json"],
    ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 4, "--dp", 16, "--json"],
    ["compare", "--targets", "trn2", "--model", "llama3-8b", "--global-batch", 64, "--json"],
    ["solve", "--target", "trn2", "--model", "llama3-8b", "--instances", 1, "--global-batch", 64, "--rank-map"],
    ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 4, "--dp", 16, "--rank-map"],
])
def test_output_paths_refused_before_the_work(tmp_path, command):
    for what, path in unwritable(tmp_path).items():
        run = cli(*command, path)
        assert_refused(run, command[-1])
        assert run.out == "", what
    assert not (tmp_path / "nowhere.json").exists()


def test_png_and_kernels_json_refused_before_the_work(tmp_path):
    layout = valid_layout(tmp_path)
    for what, path in unwritable(tmp_path).items():
        assert_refused(cli("map", "--layout", layout, "--png", path), "--png")
        assert_refused(cli("kernels", "--layout", layout, "--json", path), "--json")


def test_json_written_and_compact_on_a_huge_machine(tmp_path):
    out = tmp_path / "e.json"
    run = cli("evaluate", "--target", "trn2u", "--model", "llama3-8b", "--tp", 4, "--dp", 16384, "--pp", 32,
              "--ultraservers", 8192, "--global-batch", 16384, "--json", out)
    assert run.code in (0, 1), run
    assert out.stat().st_size < 2**20
    assert cli("map", "--layout", out).code == 0  # what trnopt writes, it reads back
    assert json.loads(out.read_text())["rank_map"]["ranks"] == 8192 * 64 * 4


# -- special files --------------------------------------------------------------------------
def special_files(tmp: Path) -> dict[str, str]:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    (tmp / "latin1.toml").write_bytes(b"name = \"caf\xe9\"\n")
    (tmp / "empty.json").write_text("")
    return {"fifo": str(fifo), "zero": "/dev/zero", "dir": str(tmp), "latin1": str(tmp / "latin1.toml"),
            "empty": str(tmp / "empty.json"), "none": str(tmp / "none.toml"), "blank": ""}


def test_special_files_as_every_input(tmp_path):
    layout = valid_layout(tmp_path)
    for what, path in special_files(tmp_path).items():
        assert_refused(cli("targets", "show", path), path or "NAME")
        assert_refused(cli("evaluate", "--target", "trn2", "--model", path, "--tp", 4, "--dp", 16),
                       path or "--model", "''")
        assert_refused(cli("map", "--layout", path), path or "--layout", "''")
        assert_refused(cli("check-map", "--layout", layout, "--rank-map", path), path or "--rank-map", "''")


def test_bom_target_and_model_files_load(tmp_path):
    for kind, name, command in (("machines", "trn2", "targets"), ("models", "llama3-8b", "models")):
        text = resources.files("trnopt.targets").joinpath(f"{kind}/{name}.toml").read_text("utf-8")
        path = tmp_path / f"{name}.toml"
        path.write_text("\ufeff" + text, encoding="utf-8")
        assert cli(command, "show", path).code == 0
