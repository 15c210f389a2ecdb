"""Hostile input through every command, part 2: layout files, rank maps, and valid input at its ends.

Every run goes through fuzzing.cli and its contract. Inputs: the layout file evaluate
writes with one value mistyped (4.9, "4", true, null, Infinity), out of range or
inconsistent with its model, batch or machine, a key added or dropped, broken documents;
the planned rank map with a broken cell, row dropped or repeated, as JSON, with a
byte-order mark; machines 1000x faster or slower than trn2 and a model near the size
bounds, through solve; compare with no target that fits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fuzzing import FUZZ, TIMED_OUT, assert_refused, at, cli, leaves, shipped, valid_layout, write
from hypothesis import given
from hypothesis import strategies as st


INT_KEYS = ("tp", "pp", "dp", "ep", "cp", "zero", "micro_batch", "interleave", "lnc", "domains", "seq",
            "global_batch", "dp_replicate")
JSON_WRONG = [4.9, "4", True, None, [], {}, -4, 0, 10**30, 1e300]
INCONSISTENT = [{"tp": 64}, {"dp": 128}, {"pp": 64}, {"lnc": 0}, {"lnc": 3}, {"domains": 10**9},
                {"global_batch": 1000}, {"seq": 0}, {"ep": 2}, {"zero": 4}, {"recompute": "some"}]


def layout_leaves(data: dict) -> list[tuple]:
    return [p for p in leaves({"problem": data["problem"], "layout": data["layout"]})]


@FUZZ
@given(i=st.integers(0, 100), value=st.sampled_from(JSON_WRONG), kind=st.sampled_from(["value", "add", "drop"]))
def test_mutated_layout_files(tmp_path_factory, i, value, kind):
    tmp = tmp_path_factory.mktemp("l")
    data = json.loads(Path(valid_layout(tmp)).read_text())
    paths = layout_leaves(data)
    path = paths[i % len(paths)]
    parent, key = at(data, path), path[-1]
    bad = True
    if kind == "value":
        bad = key in INT_KEYS or path[-2] in ("tp", "cp", "ep", "dp", "pp") or key in ("target", "model", "recompute",
                                                                                  "schedule")
        bad = bad and not (value == 0 and key == "zero")
        parent[key] = value
    elif kind == "add":
        parent[str(key) + "s"] = 1
    else:
        del parent[key]
        bad = key not in ("ep", "cp", "interleave", "schedule", "dp_replicate", "seq", "global_batch")
    broken = tmp / "broken.json"
    broken.write_text(json.dumps(data))
    for command in (["map", "--layout", broken], ["check-map", "--layout", broken, "--rank-map", tmp / "none.csv"]):
        run = cli(*command)
        if bad:
            assert_refused(run, str(broken))
    if bad:  # refused before the simulator runs
        assert_refused(cli("kernels", "--layout", broken), str(broken))


@pytest.mark.parametrize("change", INCONSISTENT)
def test_layouts_inconsistent_with_their_model_or_machine(tmp_path, change):
    data = json.loads(Path(valid_layout(tmp_path)).read_text())
    for key, value in change.items():
        (data["problem"] if key in data["problem"] else data["layout"])[key] = value
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    assert_refused(cli("map", "--layout", broken), str(broken))


@pytest.mark.parametrize("text", ['{"problem": 5, "layout": {}}', '{"layout": {"tp": Infinity}}',
                                  '{"layout": {"tp": NaN}}', "[" * 1000 + "]" * 1000, '{"layout": ' * 500,
                                  "1" * 5000, '{"problem": {"target": "trn2", "model": "missing.toml", "domains": 1}, '
                                  '"layout": {}}'])
def test_layout_texts(tmp_path, text):
    path = tmp_path / "l.json"
    path.write_text(text)
    run = cli("map", "--layout", path)
    assert_refused(run, str(path))
    if "missing.toml" in text:
        assert "problem.model" in run.err and "missing.toml" in run.err


# -- rank maps ------------------------------------------------------------------------------
def rank_map_csv(tmp: Path) -> tuple[str, list[list[str]]]:
    """The planned map of the valid layout, as `evaluate --rank-map FILE` writes it."""
    valid_layout(tmp)
    run = cli("evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 4, "--dp", 16, "--global-batch", 64,
              "--zero", 3, "--recompute", "full", "--rank-map", tmp / "planned.csv")
    assert run.code == 0, run
    header, *rows = (tmp / "planned.csv").read_text().splitlines()
    return header, [row.split(",") for row in rows]


CELLS = ["-1", "x", "", "1.5", "1" * 5000, "a" * 200_000, "\x1b[2J", "99999999", "0"]


@FUZZ
@given(row=st.integers(0, 63), col=st.integers(0, 3), cell=st.sampled_from(CELLS),
       form=st.sampled_from(["csv", "json", "bom", "drop", "dup"]))
def test_mutated_rank_maps(tmp_path_factory, row, col, cell, form):
    tmp = tmp_path_factory.mktemp("r")
    header, rows = rank_map_csv(tmp)
    path = tmp / ("ranks.json" if form == "json" else "ranks.csv")
    if form == "drop":
        del rows[row]
    elif form == "dup":
        rows.append(rows[row])
    else:
        rows[row][col] = cell
    if form == "json":
        path.write_text(json.dumps([dict(zip(header.split(","), r)) for r in rows]))
    else:
        path.write_text(("\ufeff" if form == "bom" else "") + "\n".join([header, *(",".join(r) for r in rows)]) + "\n")
    run = cli("check-map", "--layout", valid_layout(tmp), "--rank-map", path)
    if cell != "0" or form in ("drop", "dup"):
        assert run.code in (1, 2), run  # a broken map never passes
    refused = (col != 1 and cell != "0") or cell in ("", "a" * 200_000, "\x1b[2J", "1" * 5000)
    if form == "dup" or (form in ("csv", "json", "bom") and refused):
        assert_refused(run, str(path))


def test_planned_rank_map_with_bom_passes(tmp_path):
    header, rows = rank_map_csv(tmp_path)
    path = tmp_path / "ranks.csv"
    path.write_text("\ufeff" + "\n".join([header, *(",".join(r) for r in rows)]) + "\n", encoding="utf-8")
    assert cli("check-map", "--layout", valid_layout(tmp_path), "--rank-map", path).code == 0


# -- valid input at the ends of its ranges ------------------------------------------------------
def extreme_target(factor: float) -> dict:
    data = shipped("machines", "trn2")
    for key in ("hbm_bandwidth_gbs", "bf16_tflops", "fp8_tflops", "on_chip_bandwidth_gbs"):
        data["chip"][key] = min(data["chip"][key] * factor, 1e6)
    for axis in data["axes"]:
        axis["bandwidth_gbs"] *= factor
        axis["latency_us"] = 1e6 if factor < 1 else 0
    data["scale_out"]["bandwidth_gbps_per_instance"] *= factor
    data["reliability"]["instance_mtbf_hours"] = 1e-3 if factor > 1 else 1e9
    return data


def extreme_model() -> dict:  # 9e14 parameters, seq x hidden x layers just under 2^50 at seq 2048
    data = shipped("models", "llama3-8b")
    data.update(hidden=2**17, heads=2**10, kv_heads=2**10, layers=3600, vocab=2**20, ffn=2**19)
    data.pop("head_dim", None)
    return data


@pytest.mark.parametrize("case", ["fast machine", "slow machine", "huge model"])
def test_extreme_but_valid_inputs_get_an_answer(tmp_path, case):
    target, model = "trn2", "llama3-8b"
    if case == "huge model":
        model = str(write(tmp_path, "model.toml", extreme_model()))
    else:
        target = str(write(tmp_path, "target.toml", extreme_target(1e3 if case == "fast machine" else 1e-3)))
    run = cli("solve", "--target", target, "--model", model, "--instances", 1, "--global-batch", 64, "--seq", 2048,
              "--time-limit", 3, "--workers", 2, "--format", "json")
    if run.code == 0:
        data = json.loads(run.out)
        assert data["tokens_per_s"] > 0 and math.isfinite(data["step_time_s"])
    else:
        assert run.code == 3 and ("GiB" in run.err or TIMED_OUT in run.err) and "inf GiB" not in run.err, run.err


def test_compare_with_no_target_that_fits_exits_3_on_one_line(tmp_path):
    tiny = write(tmp_path, "tiny.toml", {"name": "tiny", "layers": 1, "hidden": 64, "heads": 1, "ffn": 128,
                                        "vocab": 1000})
    run = cli("compare", "--targets", "trn2,trn2u", "--model", tiny, "--global-batch", 1, "--time-limit", 5)
    assert run.code == 3 and "no layout of tiny exists on 1 to 64 trn2 domains" in run.err
    assert "trn2u:" in run.err
