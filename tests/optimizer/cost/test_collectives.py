"""Collective times: the seed documents' worked numbers, exactly, and the placement rules."""

from dataclasses import replace

import pytest

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.model.target import Axis, load_target

BLOCK = 4096 * 16384 * 2  # one BF16 activation block, seq 4096 x hidden 16384


def bandwidth_only(span):
    """The span on the seed's links: datasheet bandwidth (achievable 1), no latency term, the plain ring."""
    return tuple((replace(a, latency=0.0, achievable=1.0, collectives="ring"), n) for a, n in span)


def test_seed_allreduce_16_chips_in_the_torus():
    assert cc.ring_allreduce_time(BLOCK, 16, 1024e9) * 1e3 == pytest.approx(0.246, abs=5e-4)


def test_seed_allreduce_over_a_ring_of_4():
    assert cc.ring_allreduce_time(BLOCK, 4, 256e9) * 1e3 == pytest.approx(0.786, abs=5e-4)


def test_seed_allreduce_over_efa():
    assert cc.ring_allreduce_time(BLOCK, 16, 25e9) * 1e3 == pytest.approx(10.07, abs=5e-3)


def test_seed_gradient_allreduce_405b_dp2_over_efa():
    shard = 405e9 * 2 / 64  # BF16 gradients of 405B split over 64 chips (TP16 x PP4)
    assert cc.ring_allreduce_time(shard, 2, 25e9) == pytest.approx(0.506, abs=5e-4)


def test_torus_axes_add_up_to_the_seed_figure():
    t = load_target("trn2")
    span = tuple((a, a.size) for a in t.domain_axes)
    assert cc.collective_time("all_reduce", BLOCK, bandwidth_only(span), 1) * 1e3 == pytest.approx(0.246, abs=5e-4)


def test_group_across_the_ring_runs_at_the_ring_rate():
    x, _, ring = load_target("trn2u").domain_axes
    in_torus = cc.collective_time("all_reduce", BLOCK, bandwidth_only(((x, 4),)), 1)
    across = cc.collective_time("all_reduce", BLOCK, bandwidth_only(((x, 4), (ring, 4))), 1)
    assert across / cc.ring_allreduce_time(BLOCK, 16, 256e9) == pytest.approx(1.0)
    assert across > in_torus


def test_hierarchical_levels_and_shared_chip_links():
    core = Axis("core", 4, "core", 2900e9, 0.0)
    sw = Axis("sw", 8, "switch", 100e9, 0.0)
    # all four ranks of a chip in the group: the chip moves S once, as if it were one rank
    whole_chip = cc.collective_time("all_reduce", BLOCK, bandwidth_only(((core, 4), (sw, 8))), 4)
    expected = cc.ring_allreduce_time(BLOCK, 4, 2900e9) + cc.ring_allreduce_time(BLOCK / 4, 8, 100e9 / 4)
    assert whole_chip == pytest.approx(expected)
    assert expected - cc.ring_allreduce_time(BLOCK, 4, 2900e9) == pytest.approx(cc.ring_allreduce_time(BLOCK, 8, 100e9))
    # one rank per chip in the group, four groups sharing the links: four times slower
    one_per_chip = cc.collective_time("all_reduce", BLOCK, bandwidth_only(((sw, 8),)), 4)
    assert one_per_chip == pytest.approx(4 * cc.ring_allreduce_time(BLOCK, 8, 100e9))


def test_partial_ring_axis_is_a_line_at_half_bandwidth():
    x = Axis("x", 4, "torus", 512e9, 0.0)
    assert cc.axis_bandwidth(x, 4) == 512e9
    assert cc.axis_bandwidth(x, 2) == 256e9
    assert cc.axis_bandwidth(Axis("s", 64, "switch", 2e12, 0.0), 2) == 2e12


def test_alltoall_torus_is_bisection_limited_switch_is_not():
    size = 1e9
    torus = Axis("x", 8, "torus", 512e9, 0.0)
    switch = Axis("s", 8, "switch", 512e9, 0.0)
    t_torus = cc.collective_time("all_to_all", size, bandwidth_only(((torus, 8),)), 1)
    t_switch = cc.collective_time("all_to_all", size, bandwidth_only(((switch, 8),)), 1)
    assert t_switch == pytest.approx(7 / 8 * size / 512e9)
    assert t_torus == pytest.approx(2 * t_switch)  # k/4 = 2 for a ring of 8


def test_latency_term_per_hop():
    sw = Axis("s", 8, "switch", 1e12, 2e-6)
    with_lat = cc.collective_time("all_reduce", 1e6, ((sw, 8),), 1)
    without = cc.collective_time("all_reduce", 1e6, bandwidth_only(((sw, 8),)), 1)
    assert with_lat - without == pytest.approx(2 * 7 * 2e-6)


def test_empty_group_costs_nothing():
    assert cc.collective_time("all_reduce", 1e9, (), 4) == 0.0
