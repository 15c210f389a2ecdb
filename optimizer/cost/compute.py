"""Compute time of one transformer layer per rank and micro-batch, operation by operation,
on the chip's engines.

A GEMM [M, K] x [K, N] runs on TensorE as ceil(K / rows) x (stationary tiles) x (moving
tiles) instructions; one instruction with a stationary tile of s columns and a moving tile
of n columns issues every max(min(c0, s), n) cycles, c0 = 64 ("Trainium/Inferentia2
Architecture Guide for NKI", TensorE cost model: initiation interval max(N,
MM_INIT_LATENCY); the simulator's nc_matmul uses the same rule), at the TensorE clock on
each of the rank's physical cores (LNC of them). Either operand may be the moving one; the
faster orientation is taken. Narrow shapes lose where tiles are partly filled and where
the HBM roofline binds: a GEMM is never faster than its bytes (inputs and output in BF16)
at the rank's share of HBM bandwidth.

Non-matmul work (norms, residual adds, the gated activation, RoPE, the softmax's
exponentials, cross-entropy) runs on VectorE or ScalarE at their documented rates
(elements per cycle x clock, the "Compute Engine Specifications" tables of the NKI
architecture guides), each pass bounded by its HBM bytes. Flash attention keeps the
scores on chip (Dao et al., "FlashAttention", 2022): its matmuls and exponentials overlap,
so its time is the larger of the two; causal masking skips half of the score tiles; the
backward runs five matmuls for the forward's two (recomputing the scores).

GEMMs run at ``Efficiency.gemm_share`` of TensorE's rate: the chip's achievable share
(``chip_matmul``, stated per generation with its source) times the framework's
(``Efficiency.matmul``); with ``Training.fp8_gemms`` the linear layers' GEMMs run at the chip's
achievable FP8 share (``chip_matmul_fp8``) of its FP8 peak instead (``fp8_target``). The framework's shares (``matmul``, ``elementwise``) and the fixed
cost per micro-batch are fitted on published step times (calibration.py); nothing here
is a fitted curve of width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from trnopt.optimizer.model.layout import recompute_mix
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload

BF16 = 2
FP32 = 4
CAUSAL = 0.5  # share of score tiles a causal mask leaves to a flash-attention kernel
FLASH_BACKWARD_MATMULS = 5 / 2  # backward matmuls per forward matmul (scores recomputed)


def _tiles(n: int, size: int) -> list[tuple[int, int]]:
    """(count, tile size) of the full tiles and the remainder when n is cut into tiles of ``size``."""
    full, rest = divmod(n, size)
    return [(full, size)] + ([(1, rest)] if rest else [])


def matmul_cycles(m: int, k: int, n: int, rows: int, stationary: int, moving: int, min_cycles: int) -> int:
    """TensorE cycles of [m, k] x [k, n] with m on the stationary side:
    ceil(k / rows) * sum over (stationary tile s, moving tile t) of max(min(min_cycles, s), t)."""
    per_k = sum(cs * cm * max(min(min_cycles, s), t)
                for cs, s in _tiles(m, stationary) for cm, t in _tiles(n, moving))
    return math.ceil(k / rows) * per_k


@dataclass(frozen=True)
class Rank:
    """What one rank has of its chip: physical cores (its LNC) and its share of HBM bandwidth."""

    cores: int
    hbm_bandwidth: float

    @classmethod
    def of(cls, target: Target, lnc: int) -> Rank:
        return cls(lnc, target.chip.hbm_bandwidth / target.chip.logical_cores(lnc))


def gemm_seconds(target: Target, rank: Rank, m: float, k: float, n: float, count: float = 1.0,
                 share: float | None = None) -> float:
    """``count`` GEMMs [m, k] x [k, n] on one rank: max(TensorE cycles / (clock * cores * share),
    BF16 bytes (m k + k n + m n) / the rank's HBM bandwidth), the faster orientation; share is
    ``Efficiency.gemm_share``. Given a ``share`` (a kernel's measured throughput, its memory traffic
    included), the time is the engine's alone at that share."""
    if min(m, k, n) <= 0 or count <= 0:
        return 0.0
    e, eff = target.engines, target.efficiency
    mi, ki, ni = (max(1, math.ceil(x)) for x in (m, k, n))
    cycles = min(matmul_cycles(mi, ki, ni, e.pe_rows, e.stationary_fmax, e.moving_fmax, e.matmul_min_cycles),
                 matmul_cycles(ni, ki, mi, e.pe_rows, e.stationary_fmax, e.moving_fmax, e.matmul_min_cycles))
    engine = cycles / (e.tensor_hz * rank.cores * (eff.gemm_share if share is None else share))
    memory = BF16 * (m * k + k * n + m * n) / rank.hbm_bandwidth if share is None else 0.0
    return count * max(engine, memory)


def elementwise_seconds(target: Target, rank: Rank, elements: float, bytes_moved: float, engine: str) -> float:
    """One pass of ``elements`` on VectorE or ScalarE: max(elements / (lanes * clock * cores * share),
    bytes / the rank's HBM bandwidth)."""
    e, eff = target.engines, target.efficiency
    hz, lanes = (e.vector_hz, e.vector_lanes) if engine == "vector" else (e.scalar_hz, e.scalar_lanes)
    return max(elements / (lanes * hz * rank.cores * eff.elementwise), bytes_moved / rank.hbm_bandwidth)


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer for one micro-batch on one rank, by part."""

    attention_core: float       # attention scores, softmax and output, forward
    attention_backward: float   # the same, backward
    projections: float          # attention projections, forward
    mlp: float                  # MLP or router + experts, forward
    elementwise: float          # norms, residuals, activation, RoPE, forward
    unsaved_matmuls: float      # the GEMMs torchtitan's per-op SAC does not save, forward (``_unsaved_matmuls``)

    @property
    def matmuls(self) -> float:
        return self.projections + self.mlp

    @property
    def forward(self) -> float:
        return self.attention_core + self.matmuls + self.elementwise

    def training(self, recompute: str) -> float:
        """Forward + backward (+ what recomputation repeats): the backward of a GEMM is two GEMMs
        (input and weight gradients), of elementwise work two passes; full recompute repeats
        the forward, selective the attention core, MLP-only the MLP's matmuls, torchtitan's per-op SAC
        ("op") the GEMMs it does not save and all the elementwise work (its save list holds no
        elementwise op; the attention kernel's output is saved, so the attention core is not repeated:
        torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``)."""
        backward = 2 * self.matmuls + self.attention_backward + 2 * self.elementwise
        repeats = {"none": 0.0, "selective": self.attention_core, "full": self.forward, "mlp": self.mlp,
                   "op": self.unsaved_matmuls + self.elementwise}
        repeat = sum(share * repeats[mode] for mode, share in recompute_mix(recompute))  # every-n: the mean layer
        return self.forward + backward + repeat


def attention_core_seconds(workload: Workload, target: Target, rank: Rank, tp: int, cp: int,
                           b: int) -> tuple[float, float]:
    """(forward, backward) of attention for b sequences: per head and sequence the scores [s/cp, s]
    and the output [s/cp, d_v] as GEMMs over the causal share of tiles.

    Flash attention: the exponentials on ScalarE overlap the matmuls (the larger of the two),
    causal masking skips the tiles above the diagonal, and the backward runs five matmuls for
    the forward's two. Without it (Megatron-LM's attention, as in Korthikanti et al. 2022) the
    whole [s/cp, s] score matrix is computed (one batched GEMM, ``torch.baddbmm`` in
    Megatron-LM's ``ParallelSelfAttention``, the causal mask applied inside the fused softmax,
    so no tile is skipped) and written to HBM, then the softmax and dropout read and write it
    (5 activation-sized passes and a 1-byte mask per score), and the backward repeats the
    matmuls twice and the passes twice.
    """
    mdl, s = workload.model, workload.training.seq
    heads = mdl.heads / tp
    d_qk, d_v = _head_dims(workload)
    q = s / cp
    share = CAUSAL if workload.training.flash_attention else 1.0
    kernel = target.efficiency.attention if workload.training.flash_attention else None
    matmul = share * heads * b * (gemm_seconds(target, rank, q, d_qk, s, share=kernel)
                                  + gemm_seconds(target, rank, q, s, d_v, share=kernel))
    scores = share * heads * b * q * s
    if workload.training.flash_attention:
        exps = elementwise_seconds(target, rank, scores, 0.0, "scalar")
        return max(matmul, exps), max(FLASH_BACKWARD_MATMULS * matmul, exps)
    passes = elementwise_seconds(target, rank, 3 * scores, (5 * workload.training.activation_bytes + 1) * scores,
                                 "vector")
    return matmul + passes, 2 * (matmul + passes)


def _head_dims(workload: Workload) -> tuple[int, int]:
    mdl = workload.model
    if mdl.mla is None:
        return mdl.head_dim, mdl.head_dim
    return mdl.mla.qk_nope_head_dim + mdl.mla.qk_rope_head_dim, mdl.mla.v_head_dim


def fp8_target(target: Target) -> Target:
    """``target`` with TensorE at its FP8 GEMM rate: the clock scaled by (FP8 peak / BF16 peak) x
    (chip_matmul_fp8 / chip_matmul), so that ``gemm_seconds`` at the framework's share runs FP8 GEMMs at
    chip_matmul_fp8 x matmul of the FP8 peak; unchanged when the target states no FP8 rate. Bytes stay
    BF16's (FP8 inputs would cut them: only HBM-bound GEMMs would gain)."""
    eff = target.efficiency
    if eff.chip_matmul_fp8 is None:
        return target
    ratio = target.chip.fp8_flops / target.chip.bf16_flops * eff.chip_matmul_fp8 / eff.chip_matmul
    return replace(target, engines=replace(target.engines, tensor_hz=target.engines.tensor_hz * ratio))


@lru_cache(maxsize=65536)
def layer_time(workload: Workload, target: Target, lnc: int, tp: int, cp: int, b: int, ep: int,
               moe: bool, etp: int | None = None) -> LayerTime:
    """One layer's forward parts for b sequences of s / cp tokens on one rank of a TP group of tp
    (GEMMs on T tokens and N / tp; norms and residuals on T / tp tokens with sequence
    parallelism, on all T without it); a MoE layer's experts split etp ways (None: tp)."""
    mdl, h = workload.model, workload.model.hidden
    rank = Rank.of(target, lnc)
    tokens = workload.training.seq / cp * b
    linear = fp8_target(target) if workload.training.fp8_gemms else target  # the linear layers' GEMMs
    # attention projections: Q, K, V (KV heads replicated when tp exceeds them) and the output
    if mdl.mla is None:
        kv = max(mdl.kv_heads, tp) / tp
        projections = (gemm_seconds(linear, rank, tokens, h, (mdl.heads / tp + 2 * kv) * mdl.head_dim)
                       + gemm_seconds(linear, rank, tokens, mdl.heads / tp * mdl.head_dim, h))
        rope = tokens * (mdl.heads / tp + kv) * mdl.head_dim
    else:
        projections = _mla_seconds(workload, linear, rank, tokens, tp)
        rope = tokens * mdl.heads / tp * mdl.mla.qk_rope_head_dim
    if moe:  # the router's small GEMM goes with the experts' (at FP8 under fp8_gemms)
        mlp, width = _moe_seconds(workload, linear, rank, tokens, tp, tp if etp is None else etp, ep)
    else:
        mlp = _ffn_seconds(linear, rank, mdl.gated_mlp, tokens, h, mdl.ffn / tp, 1)
        width = mdl.ffn / tp
    # the block the norms and residuals work on, elements: a sequence-parallel rank's s/tp tokens,
    # or every token when TP runs without sequence parallelism
    sp = tokens / (tp if workload.training.sequence_parallel else 1) * h
    elementwise = (
        2 * elementwise_seconds(target, rank, 3 * sp, 3 * BF16 * sp, "vector")        # two RMSNorms
        + 2 * elementwise_seconds(target, rank, 2 * sp, 3 * BF16 * sp, "vector")      # two residual adds
        + elementwise_seconds(target, rank, tokens * width, 2 * BF16 * tokens * width, "scalar")  # activation
        + (elementwise_seconds(target, rank, 2 * tokens * width, 3 * BF16 * tokens * width, "vector")
           if mdl.gated_mlp else 0.0)                                                  # gate product
        + elementwise_seconds(target, rank, 4 * rope, 2 * BF16 * rope, "vector"))      # RoPE on q and k
    attention, attention_backward = attention_core_seconds(workload, target, rank, tp, cp, b)
    return LayerTime(attention, attention_backward, projections, mlp, elementwise,
                     _unsaved_matmuls(workload, linear, rank, tokens, tp, moe, projections + mlp))


def _unsaved_matmuls(workload: Workload, target: Target, rank: Rank, tokens: float, tp: int, moe: bool,
                     matmuls: float) -> float:
    """Forward seconds of the GEMMs torchtitan's per-op SAC recomputes in the backward (torchtitan 0.2.2,
    torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``: a block's even-numbered aten.mm
    calls are not saved). A dense Llama block calls wq, wk, wv, wo, w1, w3, w2 in that order
    (torchtitan/models/llama3/model/model.py), so wk, wo and w3 run again; with a 2-matrix MLP
    (wq, wk, wv, wo, w1, w2) wk, wo and w2. Where the block's mm order is not modelled (MLA's
    projections, MoE's router and grouped expert GEMMs) every second GEMM is taken as half of
    ``matmuls``, the layer's GEMM time."""
    mdl, h = workload.model, workload.model.hidden
    if mdl.mla is not None or moe:
        return matmuls / 2
    kv, q = max(mdl.kv_heads, tp) / tp * mdl.head_dim, mdl.heads / tp * mdl.head_dim
    ffn = mdl.ffn / tp
    mlp = gemm_seconds(target, rank, tokens, h, ffn) if mdl.gated_mlp else gemm_seconds(target, rank, tokens, ffn, h)
    return gemm_seconds(target, rank, tokens, h, kv) + gemm_seconds(target, rank, tokens, q, h) + mlp


def _mla_seconds(workload: Workload, target: Target, rank: Rank, tokens: float, tp: int) -> float:
    """MLA's projections for ``tokens`` tokens on one TP rank (DeepSeek-V3 report, section 2.1.1,
    eqs. 1-10): the query down-projection [T, h] x [h, d_c'] and the joint KV down-projection with
    the shared RoPE key [T, h] x [h, d_c + d_R] whole on every rank (their latent outputs are not
    split by heads), the query and KV up-projections [T, d_c'] x [d_c', a/tp (d_nope + d_R)] and
    [T, d_c] x [d_c, a/tp (d_nope + d_v)], and the output [T, a/tp d_v] x [a/tp d_v, h]."""
    mdl, h = workload.model, workload.model.hidden
    m, heads = mdl.mla, mdl.heads / tp
    return (gemm_seconds(target, rank, tokens, h, m.q_lora_rank)
            + gemm_seconds(target, rank, tokens, h, m.kv_lora_rank + m.qk_rope_head_dim)
            + gemm_seconds(target, rank, tokens, m.q_lora_rank, heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))
            + gemm_seconds(target, rank, tokens, m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim))
            + gemm_seconds(target, rank, tokens, heads * m.v_head_dim, h))


def _moe_seconds(workload: Workload, target: Target, rank: Rank, tokens: float, tp: int, etp: int,
                 ep: int) -> tuple[float, float]:
    """(seconds, activation width per token) of one MoE layer's forward on one rank, for ``tokens``
    tokens of the TP group: the router [T/tp, h] x [h, E]; the routed experts as grouped GEMMs,
    E / ep experts a rank, each split etp ways and each receiving

        T_e = r x (T etp / tp) x top_k x ep / E tokens,

    T etp / tp the tokens one expert-TP group dispatches (a sequence-parallel rank dispatches its own
    T / tp; with expert TP = TP the group gathers the tp ranks' shares: Megatron-Core's all-to-all
    token dispatcher; with expert TP 1, EP folded over TP, each rank dispatches its own, Liu et al.
    2025, arXiv 2504.14960, section 3), r the routing imbalance (``Moe.routing_imbalance``: the
    busiest expert's load over the mean); and the shared experts, a dense FFN at TP on all T.
    The activation width is (r top_k + shared) f / tp per token (the routed tokens' f / etp over
    E / ep experts)."""
    mdl, h = workload.model, workload.model.hidden
    moe = mdl.moe
    per_expert = moe.routing_imbalance * tokens * etp / tp * moe.top_k * ep / moe.experts
    seconds = (gemm_seconds(target, rank, tokens / tp, h, moe.experts)
               + _ffn_seconds(target, rank, mdl.gated_mlp, per_expert, h, moe.expert_ffn / etp, moe.experts / ep)
               + _ffn_seconds(target, rank, mdl.gated_mlp, tokens, h, moe.expert_ffn / tp, moe.shared_experts))
    return seconds, (moe.routing_imbalance * moe.top_k + moe.shared_experts) * moe.expert_ffn / tp


def _ffn_seconds(target: Target, rank: Rank, gated: bool, tokens: float, h: int, ffn: float, count: float) -> float:
    """``count`` FFNs on ``tokens`` tokens: up (and gate) [T, h] x [h, f], down [T, f] x [f, h]."""
    if count <= 0 or tokens <= 0:
        return 0.0
    up = gemm_seconds(target, rank, tokens, h, (2 if gated else 1) * ffn)
    return count * (up + gemm_seconds(target, rank, tokens, ffn, h))


@lru_cache(maxsize=65536)
def head_seconds(workload: Workload, target: Target, lnc: int, tp: int, cp: int, b: int) -> float:
    """The LM head and cross-entropy on the last stage, forward and backward: the [T, h] x [h, V/tp]
    GEMM three times, and the FP32 logits read and written four times (softmax, loss, gradient)."""
    mdl = workload.model
    rank = Rank.of(target, lnc)
    tokens = workload.training.seq / cp * b
    logits = tokens * mdl.vocab / tp
    return (3 * gemm_seconds(target, rank, tokens, mdl.hidden, mdl.vocab / tp)
            + elementwise_seconds(target, rank, logits, 0.0, "scalar")
            + elementwise_seconds(target, rank, 3 * logits, 4 * FP32 * logits, "vector"))
