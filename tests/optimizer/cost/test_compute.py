"""Compute per layer: what flash attention's causal skipping and sequence parallelism change."""

import dataclasses

import pytest

from trnopt.optimizer.cost.compute import Rank, attention_core_seconds, gemm_seconds, layer_time
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def test_only_flash_attention_skips_the_masked_score_tiles():
    # Megatron-LM's attention computes the whole score matrix; a flash kernel half of it (causal)
    t = load_target("a100")
    rank = Rank.of(t, 1)
    model = load_model("megatron-22b")
    s, tp, b = 2048, 8, 1
    whole = model.heads / tp * b * (gemm_seconds(t, rank, s, model.head_dim, s) + gemm_seconds(t, rank, s, s, model.head_dim))
    flash, _ = attention_core_seconds(Workload(model, Training(seq=s)), t, rank, tp, 1, b)
    stored, _ = attention_core_seconds(Workload(model, Training(seq=s, flash_attention=False)), t, rank, tp, 1, b)
    assert flash == pytest.approx(0.5 * whole)  # the matmuls bind on the A100 (its exponentials are cheap)
    assert stored > whole  # every score, plus the softmax and dropout passes over HBM


def test_without_sequence_parallelism_every_tp_rank_runs_the_norms_on_every_token():
    t = load_target("trn2")
    model = load_model("llama3-8b")
    sp = layer_time(Workload(model, Training(seq=4096)), t, 1, 8, 1, 1, 1, False)
    whole = layer_time(Workload(model, Training(seq=4096, sequence_parallel=False)), t, 1, 8, 1, 1, 1, False)
    assert (whole.matmuls, whole.attention_core) == (sp.matmuls, sp.attention_core)
    assert whole.elementwise > sp.elementwise
    single = layer_time(Workload(model, Training(seq=4096)), t, 1, 1, 1, 1, 1, False)
    alone = layer_time(Workload(model, Training(seq=4096, sequence_parallel=False)), t, 1, 1, 1, 1, 1, False)
    assert alone == single  # one rank: nothing to shard either way


def test_a_named_flash_kernel_runs_its_matmuls_at_its_measured_share_of_the_peak():
    """With ``Efficiency.attention`` (FlashAttention-2 on H100: 35%, the FlashAttention-3 paper), the
    forward's two causal matmuls take their FLOPs at that share of the tensor rate, with no HBM bound
    (a kernel's measured throughput already includes its memory traffic); the backward five for two."""
    t = load_target("h100")
    named = dataclasses.replace(t, efficiency=dataclasses.replace(t.efficiency, attention=0.35))
    model, s, b = load_model("llama3-8b"), 8192, 1
    forward, backward = attention_core_seconds(Workload(model, Training(seq=s)), named, Rank.of(named, 1), 1, 1, b)
    flops = 0.5 * model.heads * b * 2 * (2 * s * model.head_dim * s)  # causal half of QK^T and PV
    assert forward == pytest.approx(flops / (0.35 * t.chip.bf16_flops), rel=1e-3)
    assert backward == pytest.approx(2.5 * forward)
    default, _ = attention_core_seconds(Workload(model, Training(seq=s)), t, Rank.of(t, 1), 1, 1, b)
    assert default != forward  # without a named kernel: the GEMM share and the HBM roofline


def test_fp8_gemms_run_the_linear_layers_at_the_chips_achievable_fp8_rate():
    """Training.fp8_gemms: the projections and the MLP at chip_matmul_fp8 of the FP8 peak (H100: DeepGEMM's
    1,350 of 1,979 TFLOPS) instead of chip_matmul of the BF16 peak; attention stays BF16; a target with no
    FP8 rate (trn2) is unchanged."""
    model = load_model("llama3-70b")
    bf16, fp8 = Workload(model, Training(seq=8192)), Workload(model, Training(seq=8192, fp8_gemms=True))
    t = load_target("h100")
    e = t.efficiency
    speedup = t.chip.fp8_flops * e.chip_matmul_fp8 / (t.chip.bf16_flops * e.chip_matmul)
    slow, fast = layer_time(bf16, t, 1, 8, 1, 1, 1, False), layer_time(fp8, t, 1, 8, 1, 1, 1, False)
    assert fast.mlp == pytest.approx(slow.mlp / speedup, rel=1e-6)  # engine-bound at this size
    assert fast.attention_core == slow.attention_core and fast.elementwise == slow.elementwise
    trn2 = load_target("trn2")
    assert layer_time(fp8, trn2, 1, 8, 1, 1, 1, False) == layer_time(bf16, trn2, 1, 8, 1, 1, 1, False)
