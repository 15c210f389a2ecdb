"""MoE as it runs: the routed experts at the tokens each gets, the routing imbalance, node-limited
routing, expert TP's gather and the MoE layers' TP traffic."""

import dataclasses

import pytest

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost.compute import Rank, gemm_seconds, layer_time
from trnopt.optimizer.cost.steptime import step_time
from trnopt.optimizer.cost.terms import moe_mlp_collectives, tp_collectives
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def with_moe(name, **moe):
    m = load_model(name)
    return dataclasses.replace(m, moe=dataclasses.replace(m.moe, **moe))


def h800_layout(gpus, tp, pp, dp, ep, etp=None, recompute="selective"):
    t = load_target("h800")
    axes = t.axes(1, gpus // t.chips_per_domain)
    ep_dp = ep // (tp // (etp or tp))
    return Layout(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, axes=axes, lnc=1, zero=1, recompute=recompute,
                  placement=default_placement(axes, {"tp": tp, "ep": ep_dp, "dp": dp // ep_dp, "pp": pp}))


def test_routing_imbalance_scales_the_routed_experts_only():
    t = load_target("h100")
    h, experts = 4096, 8
    times = {}
    for r in (1.0, 2.0):
        w = Workload(with_moe("mixtral-8x7b", routing_imbalance=r), Training(seq=4096, global_batch=64))
        times[r] = layer_time(w, t, 1, 1, 1, 1, 8, True).mlp
    router = gemm_seconds(t, Rank.of(t, 1), 4096, h, experts)
    routed = times[1.0] - router  # Mixtral has no shared expert
    assert times[2.0] - times[1.0] == pytest.approx(routed, rel=0.02)


def test_folded_ep_runs_the_same_expert_flops_as_ep_from_dp():
    """TP2 with experts TP-split over 32 EP ranks, and TP2 x EP64 with expert TP 1: each rank holds
    the same share of expert weights and runs the same expert FLOPs (wider, fewer experts)."""
    t = load_target("h800")
    w = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    split = layer_time(w, t, 1, 2, 1, 1, 32, True, etp=2).mlp
    folded = layer_time(w, t, 1, 2, 1, 1, 64, True, etp=1).mlp
    assert folded == pytest.approx(split, rel=0.15)


def test_expert_tp_pays_its_gather_and_the_fold_does_not():
    w = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    t = load_target("h800")
    split = step_time(w, h800_layout(1024, 2, 16, 32, 32), t)
    folded = step_time(w, h800_layout(1024, 2, 16, 32, 64, etp=1), t)
    # the same TP traffic (attention only in MoE layers); EP over TP2 x DP32 on the fold
    assert split.tp_raw == pytest.approx(folded.tp_raw)
    assert split.ep > folded.ep


def test_moe_layers_keep_only_attentions_tp_collectives():
    assert tp_collectives("none", 4) - moe_mlp_collectives("none", 4) == 8
    assert tp_collectives("full", 4) - moe_mlp_collectives("full", 4) == 12
    t = load_target("h800")
    dense_w = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    lay = h800_layout(1024, 2, 16, 32, 32)
    n_moe = step_time(dense_w, lay, t).tp_raw
    # DeepSeek-V3: 3 dense layers of 61, 16 stages of ceil(61/16) = 4 layers: the busiest stage is all MoE
    dense = dataclasses.replace(dense_w.model, moe=None, ffn=18432)
    n_dense = step_time(Workload(dense, dense_w.training), dataclasses.replace(lay, ep=1, placement=default_placement(
        lay.axes, {"tp": 2, "dp": 32, "pp": 16})), t).tp_raw
    assert n_moe == pytest.approx(n_dense / 2, rel=1e-6)


def test_node_limited_routing_cuts_the_scale_out_share():
    t = load_target("h800")
    lay = h800_layout(2048, 1, 16, 128, 64)
    span = lay.ep_span()
    outer = cc.all_to_all_scale_out(span)
    assert 0 < outer < cc.coefficients("all_to_all", span)[0]
    training = Training(seq=4096, global_batch=1024)
    limited = step_time(Workload(with_moe("deepseek-v3", route_nodes=4), training), lay, t).ep
    free = step_time(Workload(with_moe("deepseek-v3", route_nodes=0), training), lay, t).ep
    # top-8 to at most 4 of the 8 nodes: half the scale-out bytes. Per stage 4 MoE layers x 4
    # all-to-alls (selective recompute), 16 stages; B s top_k h a / R bytes a rank per unit
    count, per_rank = 4 * 4 * 16, 1024 * 4096 * 8 * 7168 * 2 / 2048
    assert free - limited == pytest.approx(count * per_rank * 0.5 * outer, rel=1e-9)
    # inside one node (EP8 on NVLink) the limit changes nothing
    inside = h800_layout(2048, 1, 16, 128, 8)
    assert step_time(Workload(with_moe("deepseek-v3", route_nodes=4), training), inside, t).ep == pytest.approx(
        step_time(Workload(with_moe("deepseek-v3", route_nodes=0), training), inside, t).ep)
