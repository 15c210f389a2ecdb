"""Collectives as the Neuron runtime runs them: algorithm by size and group shape, hierarchical
stages, fixed costs and achievable shares fitted on Neuron's own nccom-test examples."""

from dataclasses import replace
from importlib import resources

import pytest

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import load_target, parse_target
from trnopt.optimizer.model.tomlcheck import read_toml

MIB = 2**20


def datasheet(span):
    return tuple((replace(a, achievable=1.0), f) for a, f in span)


def fit_spans():
    """The nccom-test groups on datasheet links: trn2 ranks 0-15 (4 ranks x chips 0-3, torus x);
    two trn1.32xlarge, 2 ranks x 16 chips each."""
    core, x, _, _ = load_target("trn2").axes(2, 1)
    core1, x1, y1, efa1 = load_target("trn1").axes(1, 2)
    return datasheet(((core, 4), (x, 4))), datasheet(((core1, 2), (x1, 4), (y1, 4), (efa1, 2)))


def trn2_group(chips=4, per_chip=4, domains=1):
    core, x, y, efa = load_target("trn2").axes(2, domains)
    span = [(core, per_chip)] if per_chip > 1 else []
    span += [(x, min(chips, 4))] + ([(y, chips // 4)] if chips > 4 else [])
    if domains > 1:
        span.append((efa, domains))
    return tuple(span)


def test_fit_gives_the_shipped_constants_and_shares():
    fit = cc.fit_runtime(*fit_spans())
    for name in ("launch", "ring_setup", "rdh_step", "internode"):
        assert getattr(fit.runtime, name) == pytest.approx(getattr(cc.NEURON, name), rel=1e-3), name
    for target in ("trn1", "trn2", "trn2u", "trn3-gen1", "trn3-gen2"):
        t = load_target(target)
        for axis in t.domain_axes:
            # trn1's torus share is fitted on its published step times (test_calibration.py)
            share = fit.neuronlink if target != "trn1" else axis.achievable
            assert (axis.collectives, axis.achievable) == ("neuron", pytest.approx(share, abs=5e-4)), target
        assert (t.scale_out.collectives, t.scale_out.achievable) == ("neuron", pytest.approx(fit.efa, abs=5e-4))
    # NCCL, not the Neuron runtime: the plain ring, at Calculon's published shares (NVLink 0.65,
    # InfiniBand 0.9)
    for target, shares in (("a100", {0.65, 0.9}), ("h100", {0.65, 0.9})):
        t = load_target(target)
        assert {a.collectives for a in (*t.domain_axes, t.scale_out)} == {"ring"}
        assert {a.achievable for a in (*t.domain_axes, t.scale_out)} == shares


def test_fit_reproduces_the_nccom_test_points():
    """Points the fit uses within 1% (16 ranks) and 4% (two instances); the others within the
    stated bands, each printed (pytest -s shows the table)."""
    trn2_16, trn1_64 = fit_spans()
    print("\n" + cc.fit_report(trn2_16, trn1_64))
    fit = cc.fit_runtime(trn2_16, trn1_64)
    shipped = cc.Fit(cc.NEURON, round(fit.neuronlink, 3), round(fit.efa, 3))
    for run, size, measured, model, measured_alg, model_alg in cc.fit_rows(trn2_16, trn1_64, shipped):
        err = model / measured - 1
        if run.startswith("trn2"):
            assert model_alg == measured_alg, size
            band = 0.50 if size == 131072 else 0.01  # Mesh at 128 KiB: measured 574 us, the model 302 us
        elif size <= 64 or size >= 512 * MIB:
            band = 0.04
        elif MIB <= size <= 8 * MIB:
            band = 0.15
        elif size >= 16 * MIB:
            band = 0.50  # the trn2 ring setup over-predicts trn1's (SDK 2.10) from 16 to 256 MiB
        else:
            band = 0.61  # trn1's floor rose from 128 B to 512 KiB; the model's Mesh stays flat
        assert abs(err) <= band, (run, size, measured, model)


def test_algorithm_switches_at_the_documented_sizes():
    span, rt = trn2_group(), cc.NEURON
    assert cc.algorithm("all_reduce", 4, span, 4) == "mesh"
    assert cc.algorithm("all_reduce", rt.mesh_max * (1 - 1e-9), span, 4) == "mesh"
    assert cc.algorithm("all_reduce", rt.mesh_max, span, 4) == "rdh"
    assert cc.algorithm("all_reduce", rt.rdh_max * (1 - 1e-9), span, 4) == "rdh"
    assert cc.algorithm("all_reduce", rt.rdh_max, span, 4) == "kangaring"
    assert cc.algorithm("all_reduce", 32 * MIB, span, 4) == "kangaring"  # as the nccom-test run shows
    assert (rt.mesh_max, rt.rdh_max) == (1e6, 12 * MIB)


def test_kangaring_needs_every_rank_of_its_chips():
    size = 512 * MIB
    assert cc.algorithm("all_reduce", size, trn2_group(per_chip=4), 4) == "kangaring"
    assert cc.algorithm("all_reduce", size, trn2_group(per_chip=2), 4) == "ring"  # half of each chip
    assert cc.algorithm("all_reduce", size, trn2_group(per_chip=1), 4) == "ring"  # one rank per chip
    assert cc.algorithm("all_reduce", size, trn2_group(per_chip=1), 1) == "ring"  # LNC groups of one


def test_rdh_needs_a_power_of_two_of_chips():
    core, x, _, _ = load_target("trn2").axes(2, 1)
    three = ((core, 4), (x, 3))
    assert cc.algorithm("all_reduce", 4 * MIB, three, 4) == "kangaring"
    assert cc.algorithm("all_reduce", 4 * MIB, trn2_group(chips=8), 4) == "rdh"


def test_kangaring_halves_the_hops_and_cuts_hbm_traffic():
    size = 512 * MIB
    kr = cc.stages("all_reduce", size, trn2_group(per_chip=4), 4)
    ring = cc.stages("all_reduce", size, trn2_group(per_chip=2), 4)  # half of each chip's ranks: Ring
    assert [s.hops for s in kr] == [16 // 2 - 1] * 2 and [s.hops for s in ring] == [8 - 1] * 2
    # per rank-hop: reduce-scatter 2R1W -> 3R1W for two ranks (4 touches), all-gather 1R1W -> 1R2W (3)
    per_byte_kr = cc.hbm_bytes("all_reduce", size, trn2_group(per_chip=4), 4) / (4 * 15 / 16 * size)
    per_byte_ring = cc.hbm_bytes("all_reduce", size, trn2_group(per_chip=2), 4) / (4 * 7 / 8 * size)
    assert (per_byte_kr, per_byte_ring) == (pytest.approx(3.5), pytest.approx(5.0))


def test_hierarchical_order_and_stage_sizes():
    span, size = trn2_group(chips=16, per_chip=4, domains=4), 256 * MIB
    n_node = 64
    ag = cc.stages("all_gather", size, span, 4)
    rs = cc.stages("reduce_scatter", size, span, 4)
    ar = cc.stages("all_reduce", size, span, 4)
    assert [(s.scope, s.op) for s in ag] == [("inter", "all_gather"), ("intra", "all_gather")]
    assert [(s.scope, s.op) for s in rs] == [("intra", "reduce_scatter"), ("inter", "reduce_scatter")]
    assert [(s.scope, s.op) for s in ar] == [("intra", "reduce_scatter"), ("inter", "all_reduce"),
                                             ("intra", "all_gather")]
    assert [s.size for s in ar] == [size, size / n_node, size]
    assert cc.algorithm("all_reduce", size, span, 4) == "kangaring+rdh"  # 4 MiB reach EFA: RDH on 4 nodes
    assert cc.algorithm("all_reduce", 4 * n_node * MIB * 4, span, 4) == "kangaring+ring"
    total = cc.collective_time("all_reduce", size, span, 4)
    rt = cc.NEURON
    assert total == pytest.approx(rt.launch + rt.ring_setup + rt.internode + sum(s.seconds for s in ar))


def test_all_reduce_is_reduce_scatter_then_all_gather():
    for span in (trn2_group(), trn2_group(chips=16, domains=2)):
        for size in (1e3, 4 * MIB, 512 * MIB):
            ar = sum(s.seconds for s in cc.stages("all_reduce", size, span, 4))
            rs = sum(s.seconds for s in cc.stages("reduce_scatter", size, span, 4))
            ag = sum(s.seconds for s in cc.stages("all_gather", size, span, 4))
            assert ar == pytest.approx(rs + ag)


def test_coefficients_are_the_large_message_view():
    for span in (trn2_group(), trn2_group(per_chip=1), trn2_group(chips=16, domains=2)):
        a, b = cc.coefficients("all_reduce", span, 4)
        for size in (2 * 1024 * MIB, 8 * 1024 * MIB):
            assert size * a + b == pytest.approx(cc.collective_time("all_reduce", size, span, 4))
        assert cc.collective_time("all_reduce", 2 * MIB, span, 4) < 2 * MIB * a + b  # RDH beats the ring there


def test_ranks_on_one_chip_share_its_links():
    one = trn2_group(per_chip=1)
    t4 = cc.stages("all_gather", 512 * MIB, one, 4)[0]
    t1 = cc.stages("all_gather", 512 * MIB, one, 1)[0]
    hops = t1.hops * load_target("trn2").domain_axes[0].latency
    assert t4.seconds - hops == pytest.approx(4 * (t1.seconds - hops))


def test_contention_stretches_only_the_byte_time():
    span, size = trn2_group(), 512 * MIB
    slow = replace(cc.NEURON, contention=1.5)
    base = cc.collective_time("all_reduce", size, span, 4)
    bytes_only = size * cc.coefficients("all_reduce", cc.replace_latency(span, 0.0), 4)[0]
    assert cc.collective_time("all_reduce", size, span, 4, slow) - base == pytest.approx(0.5 * bytes_only)


def test_tp_and_dp_on_the_same_links_share_them():
    core, x, y, _ = load_target("trn2").axes(2, 1)
    tp = ((core, 4), (x, 4))
    dp_same = ((y, 4),)  # one rank per chip: y links, shared with no other group here
    dp_x = ((x, 4),)
    size = 512 * MIB
    t_tp = cc.collective_time("all_reduce", size, tp, 4)
    apart = cc.concurrent_time([("all_reduce", size, tp), ("all_reduce", size, dp_same)], 4)
    shared = cc.concurrent_time([("all_reduce", size, tp), ("all_reduce", size, dp_x)], 4)
    assert apart == pytest.approx(max(t_tp, cc.collective_time("all_reduce", size, dp_same, 4)))
    assert shared > apart
    assert cc.concurrent_time([("all_reduce", size, tp)], 4) == pytest.approx(t_tp)
    assert cc.concurrent_time([("all_reduce", size, dp_x)] * 2, 4) > cc.collective_time("all_reduce", size, dp_x, 4)


def test_ring_axes_keep_the_plain_ring():
    sw = ((replace(load_target("a100").domain_axes[0], latency=0.0, achievable=1.0), 8),)
    assert cc.algorithm("all_reduce", 1e3, sw, 1) == "ring"
    assert cc.collective_time("all_reduce", 1e9, sw, 1) == pytest.approx(cc.ring_allreduce_time(1e9, 8, 300e9))


def test_achievable_scales_the_ring_bandwidth():
    x = replace(load_target("a100").domain_axes[0], latency=0.0)
    half = ((replace(x, achievable=0.5), 8),)
    assert cc.collective_time("all_reduce", 1e9, half, 1) == pytest.approx(cc.ring_allreduce_time(1e9, 8, 150e9))


def test_a_target_mixing_runtimes_is_bad_input(tmp_path):
    text = resources.files("trnopt.targets").joinpath("machines/trn2.toml").read_text()
    broken = text.replace('collectives = "neuron"               # hierarchical', 'collectives = "ring" # hierarchical', 1)
    assert broken != text
    with pytest.raises(InputError, match="collectives"):
        parse_target(read_toml("bad.toml", broken), "bad.toml")
    with pytest.raises(InputError, match="collectives"):
        parse_target(read_toml("bad.toml", text.replace('"neuron"', '"nccl"')), "bad.toml")
