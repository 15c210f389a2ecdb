"""Compute per layer: what flash attention's causal skipping and sequence parallelism change."""

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
