"""Step time of one training step, term by term, each written once as a tree of factors.

step = W + bubble + exposed DP + exposed ZeRO-3 gathers and reduce-scatters + optimizer, where
W = compute + exposed TP + CP + EP + pipeline sends is the work of one pipeline stage
over the m micro-batches of a step (m = B / (dp * b) for global batch B, micro-batch b).

Every term is put in product form by substituting m * b = B / dp and
dp = R / (tp * cp * pp) (R ranks), so that each factor depends on one decision
(factors.py). With s the sequence, h the hidden size, a the activation bytes, L_s the
layers of the busiest stage (ceil(L / pp)) and, per collective and span, k its seconds
per byte and lambda its fixed seconds (collectives.coefficients):

- compute = m * (L_s dense or MoE layers * layer time[recompute, tp, cp, b(, ep)] + the LM
  head[tp, cp, b]) + v m fixed costs (one per micro-batch and stage the rank holds: v with
  interleaved or V-shaped schedules, each stage its own forward and backward), each operation of a layer on the
  chip's engines (compute.py), written as pp L_s * B tp cp t[..] / (R b). Full recompute repeats the forward; selective the attention
  core (Korthikanti et al. 2022, section 5). MFU counts model FLOPs = 6 * active params *
  tokens + 3 * attention forward FLOPs (Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters", 2021, eq. 3, written per parameter).
- TP (Megatron with sequence parallelism, Korthikanti et al. 2022 section 4.2.2): per
  layer and micro-batch n(recompute) all-reduces' worth (2 all-gathers + 2
  reduce-scatters forward and as many backward = 4; full recompute adds the forward's
  2; a MoE layer only its attention's half, its MLP's tokens moving in the EP term) of
  the S = s/cp * b * h * a block, each timed at its size by the algorithm the
  runtime picks for it (t_AR(S), collectives.collective_time: Mesh, RDH or a ring on
  Neuron axes):
      n L_s * m * t_AR(S)  =  n L_s pp * (B tp cp / (R b)) t_AR(S),
  times (1 - hidden), the share the overlap kernels hide on that span, simulated for the
  target at the layout's LNC and the model's width (overlap.py; another width: those rows
  capped at what their matmul covers, overlap.scaled_fraction; no simulated row: 0).
- CP (ring attention): per layer and micro-batch the K and V of the whole sequence are
  gathered forward and their gradients reduce-scattered backward, b s max(kv heads, tp) /
  tp * 2 d_head a bytes per rank:
      2 L_s * m * t_AG(that)  =  2 L_s pp * (B tp cp / (R b)) t_AG(that).
  The other collectives (EP, pipeline sends, DP, ZeRO-3) move large messages and take the
  linear, large-message form S k + lambda (collectives.coefficients).
- EP: per MoE layer and micro-batch, dispatch and combine all-to-all forward and
  backward (4; 6 with full recompute) of the rank's sequence-parallel tokens x top-k x h, on
  the EP group's span (with expert TP 1 folded over the TP ranks: Liu et al., "MoE Parallel
  Folding", 2025), r the routing imbalance (the busiest receiver, workload.Moe); under
  node-limited routing (at most M nodes a token, DeepSeek-V3 report section 2.1.2) the
  scale-out level's bytes are min(M, top_k) / top_k of the whole's:
      n M_s pp * B s r top_k h a k / R  +  n M_s * m * lambda   (M_s MoE layers per stage);
  with expert TP > 1 the expert-TP group also gathers the dispatched tokens and
  reduce-scatters the expert outputs (Megatron-Core's all-to-all dispatcher), as many:
      n M_s pp * (B tp cp / (R b)) t_AG(r top_k s/cp b h a).
- DualPipeV (DeepSeek-V3 report sec. 3.2.1-3.2.2): the EP all-to-all and the pipeline sends run under
  the paired chunk's compute, which runs at the share of its rate the communication kernels leave
  (``Efficiency.overlap_compute``: 112 of 132 SMs on H100/H800), and only what exceeds it is exposed
  (``dualpipe_overlap``).
- Pipeline sends: one activation forward and one gradient backward per micro-batch and
  stage a rank holds, timed by the p2p coefficients of the pipeline group's span (its
  hop class: the link the pipeline dimension crosses): v * (2 B pp s h a k / R  +  2 m lambda).
- Bubble: num / (den m) * W by the layout's schedule (pipeline.bubble_num, bubble_den: 1F1B and
  GPipe (pp - 1) / m, Interleaved1F1B (pp - 1) / (v m), Narayanan et al. 2021; the zero-bubble
  schedules and DualPipeV after Qi et al. 2023 and DeepSeek-AI 2024; sources in pipeline.py).
- DP: one gradient all-reduce per step (ZeRO-1/2: reduce-scatter + all-gather, the same
  bytes; ZeRO-3: none, its reduce-scatters run per micro-batch), the dense gradients over ep x edp and the
  experts' over edp: cp * P g n k / R + lambda per group (n the group's size), overlapped
  with the backward of the last micro-batch except the last bucket (one layer's):
      exposed = max(G / L_s, G - backward share * W / m).
  HSDP (PyTorch FSDP2 ``fully_shard`` on a 2-D mesh, Zhao et al. 2023 "PyTorch FSDP"
  sec. 3.2.1): that reduction runs over the shard group (the span inside a domain), and
  the replicas then all-reduce one shard, cp * P g k / R * (n / n_shard) bytes per rank
  over the scale-out axis (ZeRO-1: the whole gradient, nothing being sharded before the
  step).
- ZeRO-3 (PyTorch FSDP, Zhao et al. 2023 sec. 3.3: gathers before each layer's forward and
  backward, a reduce-scatter after each layer's backward, on every micro-batch): weights
  all-gathered forward and backward and gradients reduce-scattered (half an all-reduce, r)
  per micro-batch, prefetched under compute except the first layer's gather and the last
  layer's reduce-scatter: max((g + r) / L_s, m (2 g + r) - compute), g one gather (over
  the shard group under HSDP).
- Optimizer: Adam reads and writes the rank's state once; the global gradient norm reads
  the gradients and clipping scales them (Pascanu et al. 2013; torchtitan's
  ``clip_grad_norm_``, Megatron-LM's ``clip_grad_norm_fp32``): (2 * state + 3 * gradient
  bytes) per parameter at HBM bandwidth.
- Replicated KV heads (TP past the KV head count: E(tp) = L 2 h d_head (tp - kv) more
  parameters in a TP group, memory.kv_replica_params): the optimizer steps them, their
  gradients add E(tp) / P_dense to the dense DP and ZeRO-3 bytes, and NxD's GQA QKV backward
  all-reduces the K/V output gradients (FP32) over the ranks sharing a head, per layer and
  micro-batch: L_s pp * (B tp cp / (R b)) t_AR(2 s/cp b d_head 4), counted in TP, not hidden.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.overlap import shape_class, tp_hidden
from trnopt.optimizer.cost.pipeline import dualpipe_overlap, tree_schedule
from trnopt.optimizer.cost.terms import overlap_free as _overlap_free
from trnopt.optimizer.model.layout import Layout, recompute_mix
from trnopt.optimizer.model.target import Axis, Target
from trnopt.optimizer.model.workload import Workload

BACKWARD_SHARE = {"none": 2 / 3, "selective": 2 / 3, "op": 17 / 24, "mlp": 3 / 4, "full": 3 / 4}  # of a micro-batch's
# compute (a recomputed part runs in the backward window; "op" repeats 3 of a block's 7 GEMMs: (2 + 3/7) / (3 + 3/7))


def backward_144ths(recompute: str) -> int:
    """The backward share of a micro-batch's compute in 144ths, exact for every mode (every-n:
    the mean of its layers'; 144 = 12 * 12 holds the twelfths and their halves and quarters)."""
    share = sum(s * BACKWARD_SHARE[mode] for mode, s in recompute_mix(recompute))
    out = round(144 * share)
    assert abs(out - 144 * share) < 1e-9, f"{recompute}: backward share {share} is not a whole number of 144ths"
    return out


def model_flops(workload: Workload) -> float:
    """FLOPs one step needs, counted once: 6 * active params * tokens + 3 * attention forward * layers * tokens."""
    m, t = workload.model, workload.training
    return 6.0 * m.active_params() * t.tokens + 3.0 * m.attention_flops_per_token(t.seq) * m.layers * t.tokens


def peak_flops_per_rank(target: Target, lnc: int) -> float:
    """Chip BF16 peak / logical cores per chip."""
    return target.chip.bf16_flops / target.chip.logical_cores(lnc)


def ideal_compute_time(workload: Workload, target: Target, ranks: int, lnc: int) -> float:
    """Model FLOPs / (ranks * peak per rank): the step's compute at peak, a floor (and the solver's unit)."""
    return model_flops(workload) / (ranks * peak_flops_per_rank(target, lnc))


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
    stage_split: float = 0.0
    """What an uneven pipeline split adds to the step (negative: saves), cost/stages.py; 0 for the even split."""

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "tp_raw")

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stage_split" or self.stage_split}


TERMS = tuple(fl.name for fl in fields(StepTime) if fl.name != "stage_split")  # the terms the factor trees give


def step_terms(workload: Workload, target: Target, axes: tuple[Axis, ...], lnc: int,
               overlap: Mapping[str, float] | None, schedule: str | None = None) -> dict[str, f.Expr]:
    """Every StepTime term as a tree of factors, for layouts on ``axes`` at ``lnc`` running the
    pipeline ``schedule`` (None: ``default_schedule`` of each interleave, as the search's layouts)."""
    return _step_terms(workload, target, axes, lnc, _Hashable(overlap), schedule)


class _Hashable:
    """Wraps the overlap table for the cache by identity (the tables are read once and never change)."""

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return id(self.value)

    def __eq__(self, other):
        return isinstance(other, _Hashable) and other.value is self.value


@lru_cache(maxsize=64)
def _step_terms(workload: Workload, target: Target, axes: tuple[Axis, ...], lnc: int,
                overlap_key: _Hashable, schedule: str | None) -> dict[str, f.Expr]:
    """The terms under one overlap table: the TP term with its hidden shares, and the terms that
    contain it (work, bubble, DP window); every other tree is ``_overlap_free``'s, one object for
    every table (the report's search with no overlap then reuses its factors' entries and bounds)."""
    overlap, h = overlap_key.value, workload.model.hidden
    base = _overlap_free(workload, target, axes, lnc, schedule)
    compute, m, ep, pp_send = base["compute"], base["m"], base["ep"], base["pp_send"]
    if schedule == "DualPipeV":
        compute, ep, pp_send = dualpipe_overlap(compute, ep, pp_send, target.efficiency.overlap_compute)

    @functools.lru_cache(maxsize=None)
    def kept(span) -> float:
        return 1 - tp_hidden(overlap, span, target.name, lnc, shape_class(h))
    tp = f.add(base["tp_term"](kept, "tp_ar"), base["kv_grads"], name="tp")
    work = f.add(compute, tp, base["cp"], ep, pp_send, name="work")
    # bubble: num(pp) / (den(v) m) * W; the default schedules' den is v itself
    bubble = f.ratio(f.prod(base["bubble_num"], work), f.prod(base["bubble_den"], m), name="pp_bubble")
    grads, layers_per_stage = base["grads"], base["layers_per_stage"]
    window = f.ratio(f.prod(f.count("recompute", backward_144ths, "backward_144ths"), work),
                     f.prod(m, coef=144), name="dp_window")
    dp = f.maximum(f.ratio(grads, layers_per_stage), f.sub(grads, window), name="dp")
    return {"compute": compute, "tp": tp, "cp": base["cp"], "ep": ep, "pp_send": pp_send,
            "pp_bubble": bubble, "dp": dp, "zero3": base["zero3"], "optimizer": base["optimizer"],
            "tp_raw": base["tp_raw"]}


def step_time(workload: Workload, layout: Layout, target: Target,
              overlap: Mapping[str, float] | None = None) -> StepTime:
    """The step-time breakdown of ``layout`` (see the module docstring for every term).

    ``overlap`` gives the fraction of TP communication the overlap kernels hide: the
    measured table (overlap.OverlapTable, by TP degree and link class) or a plain
    mapping link class -> fraction; what it does not cover hides nothing.
    """
    terms = step_terms(workload, target, layout.axes, layout.lnc, overlap, tree_schedule(layout))
    point = f.decisions(layout, workload)
    return StepTime(**{name: terms[name].value(point) for name in TERMS})
