"""Pipeline schedules: each one's bubble and first-stage activations, as their sources state them."""

import dataclasses
import json

import pytest

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.memory import activation_bytes_per_layer, memory_per_chip
from trnopt.optimizer.cost.steptime import step_terms, step_time
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.schedules import SCHEDULES
from trnopt.optimizer.model.layoutfile import layout_dict, read_layout
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

W = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=1024))
PP, TP, DP = 4, 8, 32


def layout(schedule: str = "", interleave: int = 1, recompute: str = "none") -> tuple:
    t = load_target("trn1")
    axes = t.axes(1, 32 // t.instances_per_domain)
    lay = Layout(tp=TP, pp=PP, dp=DP, axes=axes, lnc=1, zero=1, recompute=recompute, interleave=interleave,
                 schedule=schedule, placement=default_placement(axes, {"tp": TP, "dp": DP, "pp": PP}))
    return t, lay


def work(step) -> float:
    return step.compute + step.tp + step.cp + step.ep + step.pp_send


@pytest.mark.parametrize("schedule, interleave, fraction", [
    ("1F1B", 1, lambda p, v, m: (p - 1) / m),                       # Narayanan et al. 2021, sec. 2.2.1
    ("GPipe", 1, lambda p, v, m: (p - 1) / m),
    ("Interleaved1F1B", 2, lambda p, v, m: (p - 1) / (v * m)),      # ibid., sec. 2.2.2
    ("Interleaved1F1B", 4, lambda p, v, m: (p - 1) / (v * m)),
    ("InterleavedZeroBubble", 2, lambda p, v, m: (p - 1) / (3 * v * m)),  # ZB1P's third (Qi et al. 2023)
    ("ZBVZeroBubble", 2, lambda p, v, m: 0.0),                      # ZB-V at T_F = T_B = T_W
    ("DualPipeV", 2, lambda p, v, m: (p - 1) / (3 * m)),            # (PP/2 - 1)(F&B + B - 3W), PP = 2p
])
def test_each_schedule_leaves_its_published_bubble(schedule, interleave, fraction):
    t, lay = layout(schedule, interleave)
    step, m = step_time(W, lay, t), lay.micro_batches(W)
    assert lay.pipeline_schedule == schedule
    assert step.pp_bubble == pytest.approx(fraction(PP, interleave, m) * work(step), rel=1e-12)


def test_the_default_schedules_trees_agree_with_the_named_ones():
    """The search builds its trees for the default schedule of each interleave (schedule None); a layout
    naming that default explicitly holds "" and is scored by the same tree."""
    for v, name in ((1, "1F1B"), (2, "Interleaved1F1B")):
        t, named = layout(name, v)
        _, plain = layout("", v)
        assert named == plain and named.schedule == "" and named.pipeline_schedule == name
        assert step_time(W, named, t) == step_time(W, plain, t)
    t, lay = layout("", 2)
    explicit = step_terms(W, t, lay.axes, lay.lnc, None, "Interleaved1F1B")
    default = step_terms(W, t, lay.axes, lay.lnc, None)
    point = f.decisions(lay, W)
    assert explicit["pp_bubble"].value(point) == pytest.approx(default["pp_bubble"].value(point), rel=1e-12)


def test_first_stage_activations_follow_each_schedule():
    """min(m, p) micro-batches of L/p layers under 1F1B and the zero-bubble schedules; x (1 + (p-1)/(p v))
    interleaved (Korthikanti et al. 2022, 4.2.3); m under GPipe; (2p + 1) / 2 under DualPipeV."""
    base_t, base = layout("1F1B", 1)
    m, layers = base.micro_batches(W), W.model.layers // PP
    one = activation_bytes_per_layer(W, TP, 1, 1, "none") * layers * base.ranks_per_chip
    expected = {("1F1B", 1): min(m, PP), ("GPipe", 1): m, ("ZBVZeroBubble", 2): min(m, PP),
                ("Interleaved1F1B", 2): min(m, PP) * (1 + (PP - 1) / (PP * 2)),
                ("InterleavedZeroBubble", 2): min(m, PP) * (1 + (PP - 1) / (PP * 2)),
                ("DualPipeV", 2): (2 * PP + 1) / 2}
    assert {s for s, _ in expected} == set(SCHEDULES)
    reference = memory_per_chip(W, base, base_t).activations - PP * one  # the working set, the same for all
    for (schedule, v), count in expected.items():
        t, lay = layout(schedule, v)
        assert memory_per_chip(W, lay, t).activations - reference == pytest.approx(count * one, rel=1e-9), schedule


def test_v_schedules_send_twice_1f1bs_bytes():
    """Two stages a rank: twice 1F1B's pipeline communication (Qi et al.'s ZB-V comparison)."""
    t, plain = layout("1F1B", 1)
    _, v = layout("ZBVZeroBubble", 2)
    assert step_time(W, v, t).pp_send == pytest.approx(2 * step_time(W, plain, t).pp_send, rel=1e-12)


@pytest.mark.parametrize("share", [1.0, 112 / 132])
def test_dualpipev_hides_its_sends_under_compute_at_the_rate_communication_leaves(share):
    """DualPipe(V) runs the sends (and the EP all-to-all) under the paired chunk's compute, at the share
    of its rate the communication kernels leave (H800: 112 of 132 SMs, DeepSeek-V3 report 3.2.1-3.2.2;
    1 on trn1, whose collectives run on their own engines): compute / share, sends exposed only past it."""
    t, zbv = layout("ZBVZeroBubble", 2)
    _, dual = layout("DualPipeV", 2)
    t = dataclasses.replace(t, efficiency=dataclasses.replace(t.efficiency, overlap_compute=share))
    plain, overlapped = step_time(W, zbv, t), step_time(W, dual, t)
    assert overlapped.compute == pytest.approx(plain.compute / share, rel=1e-12)
    assert plain.pp_send > 0 and overlapped.pp_send == 0.0 and overlapped.ep == 0.0


@pytest.mark.parametrize("schedule, interleave, rule", [
    ("GPipe", 2, "one stage a rank"), ("1F1B", 2, "one stage a rank"),
    ("ZBVZeroBubble", 4, "exactly two stages"), ("DualPipeV", 1, "exactly two stages"),
    ("InterleavedZeroBubble", 1, "interleave must be >= 2"), ("Zero", 1, "must be one of"),
])
def test_a_schedule_refuses_stage_counts_it_cannot_run(schedule, interleave, rule):
    with pytest.raises(InputError, match=rule) as err:
        layout(schedule, interleave)
    assert err.value.key == "schedule"


def test_layout_files_carry_the_schedule_and_old_files_get_the_default(tmp_path):
    t, lay = layout("DualPipeV", 2)
    doc = {"problem": {"target": "trn1", "model": "llama3-8b", "domains": lay.domains, "seq": 4096,
                       "global_batch": 1024}, "layout": layout_dict(lay)}
    assert doc["layout"]["schedule"] == "DualPipeV"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    assert read_layout(str(path))[2] == lay
    del doc["layout"]["schedule"]
    path.write_text(json.dumps(doc))
    assert read_layout(str(path))[2].pipeline_schedule == "Interleaved1F1B"
    doc["layout"]["schedule"] = "ZBVZeroBubble"
    doc["layout"]["interleave"] = 3
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="exactly two stages") as err:
        read_layout(str(path))
    assert err.value.key == "layout.schedule"
    doc["layout"]["schedule"] = "zbv"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="must be one of") as err:
        read_layout(str(path))
    assert err.value.key == "layout.schedule"
