"""Memory per chip: the seed documents' numbers, Korthikanti's activation formulas, and monotonicity."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost.evaluate import evaluate
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.cost.memory import (activation_bytes_per_layer, memory_per_chip, recompute_working_set,
                                          sharded_state_per_chip, training_state_bytes, zero_state_per_chip)
from trnopt.optimizer.model.target import GIB, load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

from hsdp_layouts import hsdp_pair

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
    # TP64 past the 8 KV heads replicates each KV head on 8 ranks (NxD's kv_size_multiplier 8), which the
    # seed's formula leaves out: 126 layers x 2 (K, V) x 16384 x 128 x (64 - 8) = 29,595,009,024 more
    # parameters in a TP group, / (tp 64 x pp 4) = 115,605,504 a rank; ZeRO-1 keeps their BF16 weights and
    # gradients (4 B) and shards FP32 master + Adam (12 B) over dp 2: 10 B each, 4 ranks a chip
    kv_state = 115_605_504 * 10 * 4
    assert kv_state == 4_624_220_160
    # the preset counts 405.85B parameters, not the seed's round 405B: scale to compare
    scale = SEED_PARAMS / w.model.total_params()
    assert (mem.state - kv_state) * scale / GIB == pytest.approx(58.9, abs=0.05)
    assert evaluate(w, lay, t).fits


def test_korthikanti_activation_formulas():
    # the paper's attention stores its scores (no flash attention)
    w = Workload(load_model("megatron-22b"), Training(seq=2048, flash_attention=False))
    s, h, a = 2048, 6144, 64
    assert activation_bytes_per_layer(w, 1, 1, 1, "none") == pytest.approx(s * h * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(w, 8, 1, 1, "none") == pytest.approx(s * h / 8 * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(w, 8, 1, 1, "selective") == pytest.approx(34 * s * h / 8)
    assert activation_bytes_per_layer(w, 8, 1, 1, "full") == pytest.approx(2 * s * h / 8)
    assert activation_bytes_per_layer(w, 8, 1, 4, "full") == pytest.approx(4 * 2 * s * h / 8)


def test_korthikanti_activation_formulas_without_sequence_parallelism():
    # ibid. eq. 2, TP alone: s b h (10 + 24 / t + 5 a s / (h t)); full recompute keeps 2 s b h
    w = Workload(load_model("megatron-22b"), Training(seq=2048, flash_attention=False, sequence_parallel=False))
    s, h, a = 2048, 6144, 64
    assert activation_bytes_per_layer(w, 8, 1, 1, "none") == pytest.approx(s * h * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    assert activation_bytes_per_layer(w, 8, 1, 1, "selective") == pytest.approx(s * h * (10 + 24 / 8))
    assert activation_bytes_per_layer(w, 8, 1, 2, "full") == pytest.approx(2 * 2 * s * h)
    assert activation_bytes_per_layer(w, 1, 1, 1, "none") == pytest.approx(s * h * (34 + 5 * a * s / h))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(zero=st.integers(0, 2), recompute=st.sampled_from(["none", "selective", "full"]))
def test_more_sharding_never_raises_memory(zero, recompute):
    t, lay = seed_layout(zero, recompute)
    w = Workload(load_model("llama3-405b"), Training())
    base = memory_per_chip(w, lay, t).total
    assert memory_per_chip(w, dataclasses.replace(lay, zero=zero + 1), t).total <= base
    stronger = {"none": "selective", "selective": "full", "full": "full"}[recompute]
    assert memory_per_chip(w, dataclasses.replace(lay, recompute=stronger), t).total <= base


def _shipped(model: str, instances: int, tp: int, pp: int, dp: int, recompute: str):
    """A configuration AWS ships for NxD Training on trn2.48xlarge (LNC=2, ZeRO-1, seq 8192)."""
    from trnopt.optimizer.cost.problem import Problem
    from trnopt.optimizer.model.layout import default_placement

    t = load_target("trn2")
    w = Workload(load_model(model), Training(seq=8192, global_batch=1024))
    axes = t.axes(2, instances)
    lay = Layout(tp=tp, pp=pp, dp=dp, axes=axes, placement=default_placement(axes, {"tp": tp, "dp": dp, "pp": pp}),
                 zero=1, recompute=recompute, lnc=2)
    return Problem(w, t, instances).evaluate(lay)


def test_aws_llama3_8b_on_one_trn2_at_tp16_without_checkpointing_fits():
    e = _shipped("llama3-8b", 1, 16, 1, 4, "none")
    assert e.fits, e.memory.gib()


def test_aws_llama3_70b_on_8_trn2_at_tp32_pp4_dp4_selective_fits():
    e = _shipped("llama3-70b", 8, 32, 4, 4, "selective")
    assert e.fits, e.memory.gib()


def test_flash_attention_drops_the_score_term_and_mlp_recompute_keeps_attention():
    w = Workload(load_model("llama3-8b"), Training(seq=8192))
    no_flash = Workload(w.model, Training(seq=8192, flash_attention=False))
    none, selective = (activation_bytes_per_layer(w, 4, 1, 1, rc) for rc in ("none", "selective"))
    assert none == selective  # flash attention stores no scores, so selective saves nothing
    assert activation_bytes_per_layer(no_flash, 4, 1, 1, "none") > none
    assert activation_bytes_per_layer(w, 4, 1, 1, "full") < activation_bytes_per_layer(w, 4, 1, 1, "mlp") < none


def test_zero3_buffers_fp32_logits_and_fragmentation_are_counted():
    from trnopt.optimizer.cost.memory import logits_bytes

    w = Workload(load_model("llama3-8b"), Training(seq=8192))
    assert logits_bytes(w, 4, 1, 1) == 8192 * 128256 / 4 * 8
    e3 = _shipped("llama3-8b", 1, 16, 1, 4, "full")
    assert e3.memory.gathered == 0 and e3.memory.fragmentation == pytest.approx(
        (e3.memory.total - e3.memory.reserve - e3.memory.fragmentation) / 20)


def test_hsdp_shards_over_dp_shard_ranks_only():
    w, t, plain, hsdp = hsdp_pair()
    a, b = memory_per_chip(w, plain, t), memory_per_chip(w, hsdp, t)
    for kind in ("weights", "gradients", "optimizer"):
        assert getattr(b, kind) == pytest.approx(4 * getattr(a, kind))  # 16-way shards become 4-way
    assert b.activations == a.activations and b.gathered == a.gathered


def test_hsdp_must_replicate_across_the_scale_out_axis():
    _, _, plain, _ = hsdp_pair()
    with pytest.raises(InputError, match="dp_replicate"):
        dataclasses.replace(plain, dp_replicate=2)  # not dp's factor on efa (4)


def test_every_nth_layer_recompute_keeps_the_mean_layer_and_a_full_working_set():
    w = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=64))
    mean = activation_bytes_per_layer(w, 4, 1, 1, "every-4")
    assert mean == pytest.approx(0.25 * activation_bytes_per_layer(w, 4, 1, 1, "full")
                                 + 0.75 * activation_bytes_per_layer(w, 4, 1, 1, "none"))
    assert recompute_working_set(w, 4, 1, 1, "every-4") == recompute_working_set(w, 4, 1, 1, "full")


def test_attention_activations_follow_the_key_value_width():
    """Korthikanti's 11 s*b*h for multi-head attention; grouped-query K and V are narrower."""
    from trnopt.optimizer.cost.memory import attention_activation_bytes
    from trnopt.optimizer.model.workload import load_model
    assert attention_activation_bytes(load_model("megatron-22b")) == 11
    # llama3-8b: 8 KV heads of 32, head_dim 128 = hidden / heads: 2 + 2 + 4/4 + 2 + 1
    assert attention_activation_bytes(load_model("llama3-8b")) == 8


def test_published_h100_rows_are_scored_on_the_gpu_they_ran_on():
    """torchtitan's Grand Teton H100s have 96 GB HBM2e at 2.4 TB/s; Meta's 405B ran on 80 GB parts."""
    from trnopt.optimizer.cost.calibration import h100_cases
    from trnopt.optimizer.model.target import load_target
    target = load_target("h100")
    for case in h100_cases():
        hbm = 96e9 if "torchtitan" in case.label else 80e9
        assert case.hbm[0] == hbm, case.label
        assert case.row(target).evaluation.usable_bytes == hbm * 0.9, case.label
