"""Step time of one training step, term by term, and the FLOP counts behind it.

step = W + bubble + exposed DP + exposed ZeRO-3 gathers + optimizer, where
W = compute + exposed TP + CP + EP + pipeline sends is the work of one pipeline stage
over the m micro-batches of a step (m = global batch / (dp * micro-batch)).

- compute: hardware FLOPs / (ranks * peak per rank * efficiency(hidden / tp)).
  Model FLOPs = 6 * active params * tokens + 3 * attention forward FLOPs (Narayanan et
  al., "Efficient Large-Scale Language Model Training on GPU Clusters", 2021, eq. 3,
  written per parameter). Full recompute repeats the forward (x 8/6); selective
  recompute repeats the attention core only (Korthikanti et al. 2022, section 5).
- TP (Megatron with sequence parallelism, Korthikanti et al. 2022 section 4.2.2): per
  layer and micro-batch 2 all-gathers + 2 reduce-scatters of the s*b*h activation block
  forward and as many backward, i.e. 4 all-reduces' worth; full recompute adds the
  forward's 2 again. The overlap kernels hide a measured fraction per link class.
- CP (ring attention): per layer and micro-batch the K and V of the whole sequence are
  gathered forward and their gradients reduce-scattered backward.
- EP: per MoE layer and micro-batch, dispatch and combine all-to-all forward and
  backward (4; 6 with full recompute) of the rank's tokens x top-k x h.
- Pipeline: 1F1B sends one activation forward and one gradient backward per
  micro-batch and virtual stage; bubble = (p-1)/(v*m) of W (Narayanan et al. 2021).
- DP: one gradient all-reduce per step (ZeRO-1/2: reduce-scatter + all-gather, the same
  bytes; ZeRO-3: reduce-scatter only), overlapped with the backward of the last
  micro-batch except the last bucket (one layer's gradients).
- ZeRO-3: weights all-gathered forward and backward for every micro-batch, prefetched
  under compute except the first layer's.
- Optimizer: Adam reads and writes the rank's state once, at HBM bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost import overlap as overlapdata
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.cost.memory import layers_per_stage, params_per_rank
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload

BACKWARD_SHARE = {"none": 2 / 3, "selective": 2 / 3, "full": 3 / 4}  # of a micro-batch's compute


def model_flops(workload: Workload) -> float:
    """FLOPs one step needs, counted once: 6 * active params * tokens + 3 * attention forward * layers * tokens."""
    m, t = workload.model, workload.training
    return 6.0 * m.active_params() * t.tokens + 3.0 * m.attention_flops_per_token(t.seq) * m.layers * t.tokens


def hardware_flops(workload: Workload, recompute: str) -> float:
    """Model FLOPs plus what recomputation repeats: + one forward (full), + attention forward (selective)."""
    m, t = workload.model, workload.training
    attention_fwd = m.attention_flops_per_token(t.seq) * m.layers * t.tokens
    extra = {"none": 0.0, "selective": attention_fwd,
             "full": 2.0 * m.active_params() * t.tokens + attention_fwd}[recompute]
    return model_flops(workload) + extra


def peak_flops_per_rank(target: Target, lnc: int) -> float:
    """Chip BF16 peak / logical cores per chip."""
    return target.chip.bf16_flops / target.chip.logical_cores(lnc)


def compute_time(workload: Workload, target: Target, tp: int, recompute: str, ranks: int, lnc: int) -> float:
    """hardware FLOPs / (ranks * peak per rank * efficiency(hidden / tp))."""
    rate = peak_flops_per_rank(target, lnc) * target.efficiency.matmul(workload.model.hidden / tp)
    return hardware_flops(workload, recompute) / (ranks * rate)


def tp_collectives_per_layer(recompute: str) -> int:
    """All-reduce equivalents per layer and micro-batch: 4, or 6 with full recompute."""
    return 6 if recompute == "full" else 4


def ep_alltoalls_per_layer(recompute: str) -> int:
    """Dispatch + combine, forward + backward: 4, or 6 with full recompute."""
    return 6 if recompute == "full" else 4


@dataclass(frozen=True)
class StepTime:
    """Seconds per step by term; ``total`` is their sum, ``tp_raw`` is TP before overlap."""

    compute: float
    tp: float
    cp: float
    ep: float
    pp_send: float
    pp_bubble: float
    dp: float
    zero3: float
    optimizer: float
    tp_raw: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "tp_raw")

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def step_time(workload: Workload, layout: Layout, target: Target,
              overlap: Mapping[str, float] | None = None) -> StepTime:
    """The step-time breakdown of ``layout`` (see the module docstring for every term).

    ``overlap`` gives the fraction of TP communication the overlap kernels hide: the
    measured table (overlapdata.OverlapTable, by TP degree and link class) or a plain
    mapping link class -> fraction; what it does not cover hides nothing.
    """
    mdl, tr = workload.model, workload.training
    c, L = layout.ranks_per_chip, layers_per_stage(workload, layout)
    m = layout.micro_batches(workload)
    s_local, b, h = tr.seq / layout.cp, layout.micro_batch, mdl.hidden
    act = tr.activation_bytes

    def time(op: str, size: float, *dims: str) -> float:
        return cc.collective_time(op, size, layout.span(*dims), c)

    compute = compute_time(workload, target, layout.tp, layout.recompute, layout.ranks, layout.lnc)

    block = s_local * b * h * act
    tp_raw = m * L * tp_collectives_per_layer(layout.recompute) * time("all_reduce", block, "tp")
    tp = tp_raw * (1 - overlapdata.tp_hidden(overlap, layout.span("tp")))

    kv = tr.seq * b * 2 * max(mdl.kv_heads, layout.tp) // layout.tp * mdl.head_dim * act
    cp = m * L * 2 * time("all_gather", kv, "cp")

    moe_per_stage = math.ceil(mdl.moe_layers / layout.pp)
    tokens = s_local * b / layout.tp * (mdl.moe.top_k if mdl.moe else 0) * h * act
    ep = m * moe_per_stage * ep_alltoalls_per_layer(layout.recompute) * time("all_to_all", tokens, "ep")

    pp_send = m * 2 * layout.interleave * time("p2p", block / layout.tp, "pp") if layout.pp > 1 else 0.0

    work = compute + tp + cp + ep + pp_send
    bubble = (layout.pp - 1) / (layout.interleave * m) * work

    dense, expert = params_per_rank(workload, layout)
    share = 0.5 if layout.zero == 3 else 1.0
    dp_total = share * (time("all_reduce", dense * tr.grad_bytes, "ep", "dp")
                        + time("all_reduce", expert * tr.grad_bytes, "dp"))
    window = BACKWARD_SHARE[layout.recompute] * work / m
    dp = max(dp_total / L, dp_total - window) if dp_total else 0.0

    zero3 = 0.0
    if layout.zero == 3:
        gathers = 2 * m * (time("all_gather", dense * tr.weight_bytes, "ep", "dp")
                           + time("all_gather", expert * tr.weight_bytes, "dp"))
        zero3 = max(gathers / (2 * m * L), gathers - compute)

    opt_params = dense / (layout.dp if layout.zero >= 1 else 1) + expert / (
        layout.dp // layout.ep if layout.zero >= 1 else 1)
    optimizer = 2 * opt_params * tr.state_bytes_per_param / (target.chip.hbm_bandwidth / c)

    return StepTime(compute=compute, tp=tp, cp=cp, ep=ep, pp_send=pp_send, pp_bubble=bubble, dp=dp,
                    zero3=zero3, optimizer=optimizer, tp_raw=tp_raw)
