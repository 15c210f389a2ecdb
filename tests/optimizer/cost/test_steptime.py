"""Step time: placement costs, and the properties every valid layout must have."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost.evaluate import evaluate
from trnopt.optimizer.model.layout import Layout, default_placement, hsdp_spans
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.cost.steptime import model_flops, step_time
from trnopt.optimizer.cost.terms import tp_collectives
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

from hsdp_layouts import hsdp_pair


def tp16(ring: bool) -> tuple:
    """TP over 16 chips of one trn2u, inside an instance (x, y) or across the ring (x, ring); DP on cores."""
    t = load_target("trn2u")
    axes = t.axes(2, 1)  # core4 x4 y4 ring4 efa1
    tp = (1, 4, 1, 4, 1) if ring else (1, 4, 4, 1, 1)
    dp = (4, 1, 4, 1, 1) if ring else (4, 1, 1, 4, 1)
    one = (1,) * 5
    lay = Layout(tp=16, pp=1, dp=16, axes=axes, placement=(tp, one, one, dp, one), zero=1, lnc=2)
    return t, lay


def no_latency(lay: Layout) -> Layout:
    return dataclasses.replace(lay, axes=tuple(dataclasses.replace(a, latency=0.0, achievable=1.0, collectives="ring")
                                               for a in lay.axes))


def test_tp_across_the_ring_costs_four_times_the_torus():
    w = Workload(load_model("llama3-405b"), Training())
    t, inside = tp16(ring=False)
    _, across = tp16(ring=True)
    # without hop latencies (the seed's bandwidth-only ring formula)
    a = step_time(w, no_latency(inside), t).tp_raw
    b = step_time(w, no_latency(across), t).tp_raw
    assert b / a == pytest.approx(4.0)


def test_hidden_fraction_scales_exposed_tp():
    # 16 KV heads: TP16 replicates none, so no K/V gradient all-reduce (which the kernels do not hide) is in tp
    w = Workload(dataclasses.replace(load_model("llama3-405b"), kv_heads=16), Training())
    t, lay = tp16(ring=False)
    raw = step_time(w, lay, t)
    hid = step_time(w, lay, t, overlap={"torus": 0.9})
    assert hid.tp_raw == raw.tp_raw
    assert hid.tp == pytest.approx(0.1 * raw.tp)


def test_model_flops_is_6nd_plus_attention():
    w = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=8))
    m, tokens = w.model, 4096 * 8
    assert model_flops(w) == pytest.approx(6 * m.active_params() * tokens + 12 * 4096 * m.layers * 4096 * tokens)


def small_problem():
    t = load_target("trn2")
    w = Workload(load_model("llama3-8b"), Training(seq=2048, global_batch=32))
    return Problem(w, t, 1, lnc=(2,))


LAYOUTS = list(Space(small_problem(), 2).layouts())


@settings(max_examples=150, deadline=None, derandomize=True)
@given(index=st.integers(0, len(LAYOUTS) - 1), factor=st.sampled_from([1.5, 2.0, 10.0]))
def test_properties_over_valid_layouts(index, factor):
    p = small_problem()
    lay = LAYOUTS[index]
    e = evaluate(p.workload, lay, p.target)
    assert math.isfinite(e.step.total) and e.step.total > 0
    assert math.isfinite(e.memory.total) and e.memory.total > 0
    assert all(v >= 0 for v in e.step.as_dict().values())
    # more bandwidth on every link never raises the step time
    faster_axes = tuple(dataclasses.replace(a, bandwidth=a.bandwidth * factor) for a in lay.axes)
    faster = dataclasses.replace(lay, axes=faster_axes)
    assert step_time(p.workload, faster, p.target).total <= e.step.total * (1 + 1e-12)


def test_hsdp_gathers_inside_the_domain_and_the_replicas_exchange_one_shard():
    w, t, plain, hsdp = hsdp_pair()
    a, b = step_time(w, plain, t), step_time(w, hsdp, t)
    assert b.compute == a.compute and b.tp == a.tp
    # one ZeRO-3 gather: over 16 ranks across EFA, or over the 4 inside a server
    shard, replicas = hsdp_spans(plain.span("dp"))
    assert [a.name for a, _ in shard] == ["switch"] and [a.name for a, _ in replicas] == ["efa"]
    assert b.zero3 < a.zero3 / 10
    # the gradients: a reduce-scatter inside the server plus an all-reduce of a quarter of them over EFA
    assert b.dp != a.dp


def test_every_nth_layer_recompute_is_the_mean_of_full_and_none():
    w = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=64))
    t = load_target("trn2")
    axes = t.axes(2, 1)

    def lay(rc):
        return Layout(tp=16, pp=2, dp=2, axes=axes, placement=default_placement(axes, {"tp": 16, "dp": 2, "pp": 2}),
                      zero=3, recompute=rc, lnc=2)
    none, full, half = (step_time(w, lay(rc), t) for rc in ("none", "full", "every-2"))
    assert half.compute == pytest.approx((none.compute + full.compute) / 2, rel=1e-9)
    assert none.compute < half.compute < full.compute
    # 16 layers a stage, 8 of them recomputed: TP all-reduce equivalents 4 * 16 + 2 * 8
    assert tp_collectives("every-2", 16) == 80 and tp_collectives("full", 16) == 96
    # every 4th layer needs 4 to divide the stage's layers: 126 / 2 = 63 does not
    w405 = Workload(load_model("llama3-405b"), Training(seq=8192, global_batch=64))
    assert any(key == "recompute" and "every-4" in rule for key, rule in lay("every-4").workload_problems(w405))


def test_zero3_reduce_scatters_every_micro_batch_and_the_step_all_reduces_nothing():
    # FSDP without HSDP: no gradient collective at the step; per micro-batch 2 gathers + 1 reduce-scatter
    w, t, plain, _ = hsdp_pair()
    one = step_time(w, plain, t)
    assert one.dp == 0.0
    # no compute to hide under: the exposed ZeRO-3 time is m (2 g + r), r = g / 2 (the same bytes, half the hops)
    e = t.engines
    bare = dataclasses.replace(t, engines=dataclasses.replace(e, tensor_hz=e.tensor_hz * 1e9, vector_hz=e.vector_hz * 1e9,
                                                                scalar_hz=e.scalar_hz * 1e9),
                               chip=dataclasses.replace(t.chip, hbm_bandwidth=t.chip.hbm_bandwidth * 1e9),
                               efficiency=dataclasses.replace(t.efficiency, microbatch_overhead_s=0.0))
    slow = dataclasses.replace(t, engines=dataclasses.replace(e, tensor_hz=e.tensor_hz / 1e6))
    fast, hidden = step_time(w, plain, bare), step_time(w, plain, slow)
    # under slow compute only one layer's collectives show: ZeRO-1's last all-reduce bucket, ZeRO-3's
    # first gather and last reduce-scatter (half an all-reduce's bytes and hops)
    layers = math.ceil(80 / 9)
    r = step_time(w, dataclasses.replace(plain, zero=1), slow).dp * layers / 2
    g = hidden.zero3 * layers - r
    m = plain.micro_batches(w)
    assert fast.zero3 == pytest.approx(m * (2 * g + r), rel=1e-6)
    assert r > 0.1 * g


def test_the_optimizer_step_reads_the_state_and_clips_the_gradients():
    w = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=64))
    t = load_target("trn2")
    axes = t.axes(1, 1)
    lay = Layout(tp=8, pp=1, dp=16, axes=axes, placement=default_placement(axes, {"tp": 8, "dp": 16}), zero=1, lnc=1)
    params = w.model.total_params() / 128  # ZeRO-1 shards the state over all 128 ranks
    per_param = 2 * w.training.state_bytes_per_param + 3 * w.training.grad_bytes
    rank_bandwidth = t.chip.hbm_bandwidth / t.chip.logical_cores(1)
    assert step_time(w, lay, t).optimizer == pytest.approx(params * per_param / rank_bandwidth, rel=1e-9)


def test_tp_collectives_are_timed_at_their_size_by_the_runtimes_algorithm():
    # an 8 MiB TP block (llama3-8b, seq 1024): RDH at that size, cheaper than the large-message line
    from dataclasses import replace

    from trnopt.optimizer.cost import collectives as cc
    w = Workload(load_model("llama3-8b"), Training(seq=1024, global_batch=64))
    t = load_target("trn2")
    # a fixed-cost share at which RDH beats the large-message line at 8 MiB, not the fitted one
    t = replace(t, efficiency=replace(t.efficiency, collective_fixed_share=0.1))
    axes = t.axes(2, 1)
    lay = Layout(tp=4, pp=1, dp=16, axes=axes, placement=default_placement(axes, {"tp": 4, "dp": 16}), zero=1,
                 recompute="none", lnc=2)
    share = t.efficiency.collective_fixed_share
    runtime = replace(cc.NEURON, launch=cc.NEURON.launch * share, ring_setup=cc.NEURON.ring_setup * share)
    size, span, c = 1024 * 4096 * 2, lay.span("tp"), axes[0].size
    assert cc.algorithm("all_reduce", size, span, c, runtime) == "rdh"
    once = cc.collective_time("all_reduce", size, span, c, runtime)
    per_byte, fixed = cc.coefficients("all_reduce", span, c, runtime)
    assert once < size * per_byte + fixed
    count = tp_collectives("none", w.model.layers) * lay.micro_batches(w)
    assert step_time(w, lay, t).tp == pytest.approx(count * once, rel=1e-9)
    # the ring attention's K/V gathers too: 2 a layer and micro-batch, the whole sequence of the rank's KV heads
    lay_cp = Layout(tp=4, cp=2, pp=1, dp=8, axes=axes, placement=default_placement(axes, {"tp": 4, "cp": 2, "dp": 8}),
                    zero=1, recompute="none", lnc=2)
    kv = 1024 * max(w.model.kv_heads, 4) / 4 * 2 * w.model.head_dim * 2
    gather = cc.collective_time("all_gather", kv, lay_cp.span("cp"), c, runtime)
    assert step_time(w, lay_cp, t).cp == pytest.approx(2 * w.model.layers * lay_cp.micro_batches(w) * gather, rel=1e-9)
