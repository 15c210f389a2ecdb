"""The catalog's tables, details and JSON dicts of the built-in targets and presets."""

from __future__ import annotations

import json
import re

import pytest

from trnopt.optimizer.commands.catalog import (model_details, model_dict, models_table, target_details, target_dict,
                                     targets_table)
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, GIB, load_target
from trnopt.optimizer.model.workload import PRESETS, load_model


def _rows(table: str) -> dict[str, list[str]]:
    """First cell of each data line -> the line split on runs of two or more spaces."""
    lines = table.splitlines()[1:]
    return {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line) for line in lines}


def test_targets_table_has_one_line_per_target():
    table = targets_table()
    rows = _rows(table)
    assert list(rows) == list(BUILTIN_TARGETS)
    assert table.splitlines()[0].split()[:2] == ["target", "chips/domain"]
    assert rows["trn2u"][1:] == ["64", "x4(torus) x y4(torus) x ring4(ring)", "96", "667",
                                 "x 512, y 512, ring 256", "25"]
    assert rows["trn3-gen2"][1:] == ["144", "switch144(switch)", "144", "671", "switch 2,199.02", "25"]
    assert rows["trn1"][-1] == "6.25"


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_target_details_shows_every_figure(name):
    t = load_target(name)
    text = target_details(t)
    assert text == target_details(name)
    assert text.startswith(f"{t.name}: {t.description}\n")
    for needle in (t.source, t.instance, t.chip.name, t.topology, t.scale_out.name,
                   f"{t.chips_per_domain} chips", f"{t.chip.physical_cores}", "GiB", "GB/s", "TFLOPS BF16",
                   "KiB per partition", "us per hop", "Gbps per instance", "instance MTBF", "matmul"):
        assert needle in text, needle
    for axis in t.domain_axes:
        assert f"{axis.name:<10} size {axis.size:<4} {axis.kind:<7}" in text


def test_trn2u_details():
    text = target_details("trn2u")
    assert "LNC                  default 2; allowed 1, 2 (ranks per chip: 8 at LNC=1, 4 at LNC=2)" in text
    assert "efa        3,200 Gbps per instance = 25 GB/s per chip, 15 us per hop" in text
    assert "ring       size 4    ring          256 GB/s  1.5 us" in text


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_target_dict_is_json_in_si_units(name):
    t = load_target(name)
    d = json.loads(json.dumps(target_dict(t)))
    assert d["name"] == name and d["chips_per_domain"] == t.chips_per_domain
    assert d["chip"]["hbm_bytes"] == t.chip.hbm_bytes
    assert d["chip"]["lnc_allowed"] == list(t.chip.lnc_allowed)
    assert [a["name"] for a in d["domain_axes"]] == [a.name for a in t.domain_axes]
    assert d["scale_out"]["bandwidth"] == t.scale_out.bandwidth


def test_models_table_has_one_line_per_preset():
    rows = _rows(models_table())
    assert list(rows) == list(PRESETS)
    assert rows["llama3-405b"][1:] == ["126", "16384", "128/8", "53248", "128256", "405.9", "405.9"]
    assert rows["mixtral-8x7b"][1:] == ["32", "4096", "32/8", "8x14336 top-2", "32000", "46.7", "12.9"]
    assert rows["deepseek-v3"][3:5] == ["128 (MLA)", "256x2048 top-8 +1 shared (3 dense: 18432)"]
    assert rows["deepseek-v3"][-2] == "671.0"


@pytest.mark.parametrize("name", PRESETS)
def test_model_details_breakdown(name):
    m = load_model(name)
    text = model_details(m)
    assert text == model_details(name)
    assert text.startswith(f"{m.name}: {m.source}\n")
    assert f"  sum {'':<20} {m.total_params() / 1e9:>9.3f} {m.active_params() / 1e9:>9.3f}" in text
    for part in ("attention", "embeddings", "norms"):
        assert f"\n  {part} " in text
    assert ("routed experts" in text) == (m.moe is not None)
    assert "total: published" in text


def test_deepseek_details():
    text = model_details("deepseek-v3")
    assert "MLA, 128 heads: q_lora 1536, kv_lora 512, qk 128 + rope 64, v 128" in text
    assert "256 routed of FFN 2048, top-8, 1 shared, in 58 MoE layers" in text
    assert "active: published 37 B, +1.49%" in text


@pytest.mark.parametrize("name", PRESETS)
def test_model_dict_is_json(name):
    m = load_model(name)
    d = json.loads(json.dumps(model_dict(m)))
    assert (d["name"], d["layers"], d["total_params"], d["active_params"]) == (
        name, m.layers, m.total_params(), m.active_params())
    assert sum(d["params_by_part"].values()) == m.total_params()
    assert (d["moe"] is None) == (m.moe is None)


def test_units_are_consistent():
    d = target_dict("trn2")
    assert d["chip"]["hbm_bytes"] == 96 * GIB
    assert d["domain_axes"][0]["bandwidth"] == 512 * GB
    assert d["domain_axes"][0]["latency"] == pytest.approx(1.5e-6)
