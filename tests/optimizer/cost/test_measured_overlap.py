"""The simulated-overlap reader: keys (target, kernel, TP, link class, LNC, shape class), the lookup rule, the provenance."""

from __future__ import annotations

import itertools

import pytest

from trnopt.optimizer.cost.overlap import NO_OVERLAP, measured, parse_table, tp_hidden, tp_hidden_source
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import load_target


def table(rows):
    return parse_table({"version": 1, "rows": [
        {"kernel": k, "tp": t, "link_class": c, "channels": 2, "shape": {}, "t_mm": 1, "t_cc": 1, "t_f": 1,
         "hidden_fraction": f, **extra} for k, t, c, f, extra in rows]}, "t.json")


ROWS = [
    ("allgather_matmul", 16, "torus", 0.9, {"target": "trn2", "lnc": 2, "shape_class": "hidden16384"}),
    ("allgather_matmul", 16, "torus", 0.7, {"target": "trn2", "lnc": 2, "shape_class": "hidden8192"}),
    ("matmul_reduce_scatter", 16, "torus", 0.5, {"target": "trn2", "lnc": 2, "shape_class": "hidden16384"}),
    ("allgather_matmul", 16, "torus", 0.2, {"target": "trn2u", "lnc": 2, "shape_class": "hidden16384"}),
    ("allgather_matmul", 16, "torus", 0.4, {"target": "trn2", "lnc": 1, "shape_class": "hidden16384"}),
]


def test_target_lnc_and_shape_class_select_rows():
    t = table(ROWS)
    assert t.fraction("allgather_matmul", 16, "torus", target="trn2", lnc=2, shape_class="hidden16384") == 0.9
    assert t.fraction("allgather_matmul", 16, "torus", target="trn2", lnc=2) == 0.7   # smallest shape class
    assert t.fraction("allgather_matmul", 16, "torus", target="trn2u", lnc=2) == 0.2
    assert t.fraction("allgather_matmul", 16, "torus", target="trn2", lnc=1) == 0.4
    assert t.fraction("allgather_matmul", 32, "torus", target="trn2", lnc=2, shape_class="hidden16384") == 0.9
    assert t.source_of("allgather_matmul", 32, "torus", target="trn2", lnc=2) == "nearest TP16"


def test_a_target_without_rows_hides_nothing_and_says_so():
    t = table(ROWS)
    assert t.fraction("allgather_matmul", 16, "torus", target="trn3-gen2") == 0.0
    assert t.source_of("allgather_matmul", 16, "torus", target="trn3-gen2").startswith(
        "no simulated row for target trn3-gen2")
    assert t.fraction("allgather_matmul", 16, "torus", target="trn2u", lnc=1) == 0.0
    assert "at LNC 1" in t.source_of("allgather_matmul", 16, "torus", target="trn2u", lnc=1)


def test_tp_hidden_with_and_without_a_target():
    t = table(ROWS)
    trn2 = load_target("trn2")
    axes = trn2.axes(2, 1)
    span = ((axes[1], 4), (axes[2], 4))  # TP16 over the torus
    assert tp_hidden(t, span, target="trn2", lnc=2) == pytest.approx((0.7 + 0.5) / 2)
    assert tp_hidden(t, span, target="trn3-gen1", lnc=2) == 0.0
    assert tp_hidden_source(t, span, target="trn3-gen1", lnc=2).startswith("no simulated row for target trn3-gen1")
    assert 0.0 <= tp_hidden(t, span) <= 1.0  # the old two-argument call reads every target's rows
    assert tp_hidden({"torus": 1.5}, span) == 1.0


def test_shipped_table_has_provenance_and_keys():
    t = measured()
    prov = t.doc["provenance"]
    assert {"commit", "command", "date"} <= set(prov) and "benchmarks/overlap_table.py" in prov["command"]
    for r in t.rows:
        assert {"target", "lnc", "shape_class"} <= set(r)
        assert r["hidden_fraction"] == pytest.approx(1 - (r["t_f"] - r["t_mm"]) / r["t_cc"])
    assert t.targets() >= {"trn2", "trn2u"}


def test_step_time_reads_its_own_targets_rows():
    # trn1 and the GPUs have no measured row: their TP communication stays whole; trn2u reads trn2u's
    from trnopt.optimizer.cost.steptime import step_time
    from trnopt.optimizer.model.layout import Layout, default_placement
    from trnopt.optimizer.model.workload import Training, Workload, load_model
    w = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=64))
    for name, lnc in (("trn1", 1), ("a100", 1), ("trn2u", 2)):
        t = load_target(name)
        axes = t.axes(lnc, 2)
        dp = t.ranks(lnc, 2) // 8
        lay = Layout(tp=8, pp=1, dp=dp, axes=axes, placement=default_placement(axes, {"tp": 8, "dp": dp}), zero=1,
                     lnc=lnc)
        s = step_time(w, lay, t, measured())
        if name == "trn2u":
            want = tp_hidden(measured(), lay.span("tp"), "trn2u", 2, "hidden4096")
            assert 0 < want and s.tp == pytest.approx(s.tp_raw * (1 - want))
        else:
            assert s.tp == s.tp_raw > 0, name


@pytest.mark.parametrize("name", ["trn2", "trn2u", "trn3-gen1", "trn3-gen2"])
def test_shipped_table_measures_every_tp_group_the_solver_can_place(name):
    # the rows of benchmarks/overlap_table.py: no layout of the two Llama models reads a
    # degree it was not measured at, on any link class, at either LNC
    from trnopt.optimizer.cost.overlap import TP_KERNELS, shape_class
    from trnopt.optimizer.model.workload import load_model
    from trnopt.optimizer.search.space import group_spans, tp_degrees
    t, target = measured(), load_target(name)
    for lnc in target.chip.lnc_allowed:
        axes = target.axes(lnc, 2)
        for model in map(load_model, ("llama3-405b", "llama3-70b")):
            keys = group_spans(axes, tp_degrees(model.heads, model.kv_heads, target.ranks(lnc, 2)))
            assert keys
            for (tp, cls), kernel in itertools.product(keys, TP_KERNELS):
                key = dict(target=name, lnc=lnc, shape_class=shape_class(model.hidden))
                assert t.source_of(kernel, tp, cls, **key) == "simulated", (name, lnc, model.name, tp, cls, kernel)
                assert t.row(kernel, tp, cls, **key)["shape_class"] == key["shape_class"]


def test_a_row_of_another_width_is_capped_at_what_its_matmul_covers():
    # T_mm / T_cc of the h x h/tp projection grows as h: a row at 16384 with T_mm / T_cc = 0.5
    # covers at most 0.25 of the collective at 8192, and keeps its own 0.45 at 32768
    t = parse_table({"version": 1, "rows": [
        {"kernel": "allgather_matmul", "tp": 32, "link_class": "torus", "channels": 2, "shape": {}, "t_mm": 1.0,
         "t_cc": 2.0, "t_f": 2.1, "hidden_fraction": 0.45, "target": "trn2", "lnc": 2,
         "shape_class": "hidden16384"}]}, "t.json")
    key = dict(target="trn2", lnc=2)
    assert t.lookup("allgather_matmul", 32, "torus", shape_class="hidden16384", **key) == (0.45, "simulated")
    assert t.lookup("allgather_matmul", 32, "torus", shape_class="hidden8192", **key) == (
        pytest.approx(0.25), "simulated at other widths, capped for hidden8192")
    assert t.fraction("allgather_matmul", 32, "torus", shape_class="hidden32768", **key) == 0.45
    assert t.lookup("allgather_matmul", 64, "torus", shape_class="hidden4096", **key) == (
        pytest.approx(0.125), "nearest TP32 at other widths, capped for hidden4096")
    assert t.fraction("allgather_matmul", 32, "torus", **key) == 0.45    # no width asked: the row as measured


def test_a_table_with_provenance_names_its_simulator_version():
    doc = {"version": 1, "rows": [], "provenance": {"commit": "abc"}}
    with pytest.raises(InputError, match="provenance.simulator_version"):
        parse_table(doc, "t.json")
    doc["provenance"]["simulator_version"] = "9.9"
    t = parse_table(doc, "t.json")
    assert t.simulator_version == "9.9" and t.provenance_text() == "simulated (trnopt NKI simulator 9.9)"
    assert table(ROWS).simulator_version is None  # a table written by hand
    shipped = measured()
    assert shipped.simulator_version and shipped.provenance_text().startswith("simulated (trnopt NKI simulator ")


def test_the_switch_hides_nothing_where_the_table_hides_some():
    trn2 = load_target("trn2")
    axes = trn2.axes(2, 1)
    span = ((axes[1], 4), (axes[2], 4))  # TP16 over the torus
    assert tp_hidden(measured(), span, "trn2", 2, "hidden16384") > 0
    assert tp_hidden(NO_OVERLAP, span, "trn2", 2, "hidden16384") == 0.0
    assert tp_hidden_source(NO_OVERLAP, span) == "no overlap table (0)"
