"""torchtitan's per-op SAC ("op"): what it keeps and what it runs again, against the save list written out
by hand (torchtitan 0.2.2 _apply_op_sac: odd aten.mm calls of a block saved, plus the attention kernel's
output and the reduce-scatters' outputs)."""

import pytest

from trnopt.optimizer.cost.compute import Rank, gemm_seconds, layer_time
from trnopt.optimizer.cost.memory import activation_bytes_per_layer, recompute_working_set
from trnopt.optimizer.cost.steptime import backward_144ths
from trnopt.optimizer.cost.terms import tp_collectives
from trnopt.optimizer.frameworks.profile import NXD, TORCHTITAN
from trnopt.optimizer.model.layout import RECOMPUTE
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

W8 = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=16))
SBH = 8192 * 2 * 4096  # s * b * h at micro-batch 2


def test_op_keeps_the_block_input_wq_wv_attention_w1_and_w2_outputs():
    # Llama 3 8B: q = 1, kv = 8 * 128 / 4096, f = 14336 / 4096, 32 heads' FP32 logsumexp
    q, kv, f = 1.0, 0.25, 3.5
    by_hand = 2 + 2 * q + 2 * kv + (2 * q + 4 * 32 / 4096) + 2 * f + 2
    assert by_hand == pytest.approx(15.53125)
    assert activation_bytes_per_layer(W8, 1, 1, 2, "op") == pytest.approx(by_hand * SBH)
    assert activation_bytes_per_layer(W8, 1, 1, 2, "selective") == pytest.approx(36 * SBH)


def test_op_under_tensor_parallelism_keeps_w2s_unreduced_output_whole():
    # TP8 with sequence parallelism: the block input and the two reduce-scatter outputs are s/8 long,
    # the column-parallel outputs 1/8 wide, w2's partial sums [s, h] whole on every rank
    q, kv, f, t = 1.0, 0.25, 3.5, 8
    by_hand = 2 / t + (2 * q + 2 * kv + 2 * q + 4 * 32 / 4096 + 2 * f) / t + 2 + 4 / t
    assert activation_bytes_per_layer(W8, t, 1, 2, "op") == pytest.approx(by_hand * SBH)
    # context parallelism halves the tokens of every kept tensor
    assert activation_bytes_per_layer(W8, t, 2, 2, "op") == pytest.approx(by_hand * SBH / 2)


def test_op_sits_between_full_and_no_recompute_and_its_working_set_is_the_rest():
    for t in (1, 2, 8):
        full, op, none = (activation_bytes_per_layer(W8, t, 1, 1, m) for m in ("full", "op", "none"))
        assert full < op < none
        assert recompute_working_set(W8, t, 1, 1, "op") == pytest.approx(none - op)


def test_op_runs_wk_wo_w3_and_the_elementwise_work_again():
    target = load_target("h100")
    rank = Rank.of(target, 1)
    m, tokens = W8.model, 8192 * 2
    for tp in (1, 8):
        lt = layer_time(W8, target, 1, tp, 1, 2, 1, False)
        wk = gemm_seconds(target, rank, tokens, m.hidden, m.kv_heads / tp * m.head_dim)
        wo = gemm_seconds(target, rank, tokens, m.heads / tp * m.head_dim, m.hidden)
        w3 = gemm_seconds(target, rank, tokens, m.hidden, m.ffn / tp)
        assert lt.unsaved_matmuls == pytest.approx(wk + wo + w3)
        assert lt.training("op") - lt.training("none") == pytest.approx(wk + wo + w3 + lt.elementwise)
        assert lt.training("none") < lt.training("op") < lt.training("full")


def test_op_regathers_the_sequence_parallel_inputs_and_its_backward_share_is_exact():
    assert tp_collectives("op", 4) == 4 * 4 + 4 and tp_collectives("none", 4) == 16
    assert backward_144ths("op") == 102  # (2 + 3/7) / (3 + 3/7) = 17/24 of 144


def test_torchtitan_offers_op_not_korthikanti_selective_and_nxd_the_reverse():
    assert "op" in RECOMPUTE
    assert "op" in TORCHTITAN.recompute and "selective" not in TORCHTITAN.recompute
    assert "selective" in NXD.recompute and "op" not in NXD.recompute

