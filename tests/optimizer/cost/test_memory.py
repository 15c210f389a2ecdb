"""Memory per chip: the seed documents' numbers, Korthikanti's activation formulas, and monotonicity."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost.evaluate import evaluate
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.cost.memory import (activation_bytes_per_layer, memory_per_chip, sharded_state_per_chip,
                                     training_state_bytes, zero_state_per_chip)
from trnopt.optimizer.model.target import GIB, load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

SEED_PARAMS = 405e9  # the seed documents count Llama 3 405B as 405e9 parameters


def test_seed_training_state_405b():
    assert training_state_bytes(SEED_PARAMS) / GIB == pytest.approx(6035, abs=0.5)
    assert 64 * 96 == 6144  # one UltraServer's HBM, GiB


@pytest.mark.parametrize("ultraservers, expected", [(1, 94.3), (2, 47.1), (4, 23.6)])
def test_seed_fully_sharded_state_per_chip(ultraservers, expected):
    assert sharded_state_per_chip(SEED_PARAMS, 64 * ultraservers) / GIB == pytest.approx(expected, abs=0.05)


def test_seed_tp16_pp4_dp2_zero1():
    state = zero_state_per_chip(SEED_PARAMS, model_parallel_chips=64, dp=2, zero=1)
    assert state / GIB == pytest.approx(58.9, abs=0.05)
    assert 96 - state / GIB == pytest.approx(37.1, abs=0.05)


def seed_layout(zero=1, recompute="full") -> tuple:
    """The seed's hand layout on two trn2u: 16 chips of TP (x 4 logical cores at LNC=2), PP4, DP2."""
    t = load_target("trn2u")
    axes = t.axes(2, 2)
    lay = Layout(tp=64, pp=4, dp=2, axes=axes, placement=default_placement(axes, {"tp": 64, "pp": 4, "dp": 2}),
                 zero=zero, recompute=recompute, lnc=2)
    return t, lay


def test_seed_layout_state_through_the_cost_model():
    t, lay = seed_layout()
    w = Workload(load_model("llama3-405b"), Training())
    mem = memory_per_chip(w, lay, t)
    # the preset counts 405.85B parameters, not the seed's round 405B: scale to compare
    scale = SEED_PARAMS / w.model.total_params()
    assert mem.state * scale / GIB == pytest.approx(58.9, abs=0.05)
    assert evaluate(w, lay, t).fits


def test_korthikanti_activation_formulas():
    w = Workload(load_model("megatron-22b"), Training(seq=2048))
    s, h, a = 2048, 6144, 64
    assert activation_bytes_per_layer(w, 1, 1, 1, "none") == pytest.approx(s * h * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(w, 8, 1, 1, "none") == pytest.approx(s * h / 8 * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(w, 8, 1, 1, "selective") == pytest.approx(34 * s * h / 8)
    assert activation_bytes_per_layer(w, 8, 1, 1, "full") == pytest.approx(2 * s * h / 8)
    assert activation_bytes_per_layer(w, 8, 1, 4, "full") == pytest.approx(4 * 2 * s * h / 8)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(zero=st.integers(0, 2), recompute=st.sampled_from(["none", "selective", "full"]))
def test_more_sharding_never_raises_memory(zero, recompute):
    t, lay = seed_layout(zero, recompute)
    w = Workload(load_model("llama3-405b"), Training())
    base = memory_per_chip(w, lay, t).total
    assert memory_per_chip(w, dataclasses.replace(lay, zero=zero + 1), t).total <= base
    stronger = {"none": "selective", "selective": "full", "full": "full"}[recompute]
    assert memory_per_chip(w, dataclasses.replace(lay, recompute=stronger), t).total <= base
