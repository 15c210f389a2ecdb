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
  times (1 - hidden), the share the overlap kernels hide on that span, measured on the
  target at the layout's LNC and the model's width (overlap.py; another width: those rows
  capped at what their matmul covers, overlap.scaled_fraction; unmeasured: 0).
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
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.compute import FP32, head_seconds, layer_time
from trnopt.optimizer.cost.memory import kv_replica_params
from trnopt.optimizer.cost.overlap import shape_class, tp_hidden
from trnopt.optimizer.cost.pipeline import bubble_den, bubble_num, tree_schedule
from trnopt.optimizer.model.layout import Layout, full_layers, hsdp_spans, recompute_mix
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


def tp_collectives(recompute: str, layers: int) -> int:
    """All-reduce equivalents of a stage's ``layers`` per micro-batch: 4 a layer, 6 for a layer
    recomputed in full (its forward's 2 again), 5 under torchtitan's per-op SAC ("op"): its save list
    keeps reduce-scatter outputs but not all-gathers (torchtitan/models/llama3/infra/parallelize.py
    ``_op_sac_save_list``), so the backward gathers the two sequence-parallel inputs again."""
    return 4 * layers + 2 * full_layers(recompute, layers) + (layers if recompute == "op" else 0)


def moe_mlp_collectives(recompute: str, layers: int) -> int:
    """The MLP half of ``tp_collectives`` for a stage's MoE ``layers``: 2 a layer, 3 recomputed in full.
    A MoE layer's tokens go to its experts by the EP term's dispatch (and, under expert TP, its
    gather over the expert-TP group) instead of the sequence-parallel gather of a dense MLP."""
    return 2 * layers + full_layers(recompute, layers)


def ep_alltoalls(recompute: str, layers: int) -> int:
    """Dispatch + combine, forward + backward, of a stage's MoE ``layers``: 4 a layer, 6 for a
    layer recomputed in full."""
    return 4 * layers + 2 * full_layers(recompute, layers)


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


TERMS = tuple(fl.name for fl in fields(StepTime))


def _span_size(span) -> int:
    return math.prod(n for _, n in span)


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
    compute, m = base["compute"], base["m"]

    @functools.lru_cache(maxsize=None)
    def kept(span) -> float:
        return 1 - tp_hidden(overlap, span, target.name, lnc, shape_class(h))
    tp = f.add(base["tp_term"](kept, "tp_ar"), base["kv_grads"], name="tp")
    work = f.add(compute, tp, base["cp"], base["ep"], base["pp_send"], name="work")
    # bubble: num(pp) / (den(v) m) * W; the default schedules' den is v itself
    bubble = f.ratio(f.prod(base["bubble_num"], work), f.prod(base["bubble_den"], m), name="pp_bubble")
    grads, layers_per_stage = base["grads"], base["layers_per_stage"]
    window = f.ratio(f.prod(f.count("recompute", backward_144ths, "backward_144ths"), work),
                     f.prod(m, coef=144), name="dp_window")
    dp = f.maximum(f.ratio(grads, layers_per_stage), f.sub(grads, window), name="dp")
    return {"compute": compute, "tp": tp, "cp": base["cp"], "ep": base["ep"], "pp_send": base["pp_send"],
            "pp_bubble": bubble, "dp": dp, "zero3": base["zero3"], "optimizer": base["optimizer"],
            "tp_raw": base["tp_raw"]}


@lru_cache(maxsize=64)
def _overlap_free(workload: Workload, target: Target, axes: tuple[Axis, ...], lnc: int,
                  schedule: str | None) -> dict:
    """The trees no overlap table changes, the builder of the TP term (``tp_term``) and the
    pieces ``_step_terms`` assembles the others from."""
    # One function of ~170 lines on purpose: every term is a tree over the same local
    # quantities (R, c, B, s, h, a, m, the runtime), and read in order it is the module
    # docstring's list; split, each piece would take those eight names as arguments.
    mdl, tr = workload.model, workload.training
    R, c = math.prod(a.size for a in axes), axes[0].size
    B, s, h, a = tr.global_batch, tr.seq, mdl.hidden, tr.activation_bytes
    m = f.decision("micro_batches")

    # the runtime's per-collective fixed costs, at the share a compiled step pays (fitted)
    share = target.efficiency.collective_fixed_share
    runtime = replace(cc.NEURON, launch=cc.NEURON.launch * share, ring_setup=cc.NEURON.ring_setup * share)

    @functools.lru_cache(maxsize=None)  # one span feeds several tables (bandwidth, latency, raw and kept)
    def coeff(op: str, span) -> tuple[float, float]:
        return cc.coefficients(op, span, c, runtime) if span else (0.0, 0.0)

    def per_byte(op, span):
        return coeff(op, span)[0]

    def fixed(op, span):
        return coeff(op, span)[1]

    def layers(pp):
        return math.ceil(mdl.layers / pp)

    def moe_layers(pp):
        return math.ceil(mdl.moe_layers / pp)

    # compute: m micro-batches of the busiest stage's layers (dense and MoE) and the LM head
    # (counted on every stage: the last stage's, on the 1F1B critical path), plus a fixed cost
    # per micro-batch and stage the rank holds (v of them). Per-layer times by (recompute, tp, cp, micro-batch[, ep]) (compute.py),
    # with m = B tp cp pp / (R b) substituted so that no factor multiplies m by a function of b
    def per_step(seconds: float, tp: int, cp: int, b: int) -> float:
        return seconds * B * tp * cp / (R * b)

    def dense_layer(rc, tp, cp, b):
        return per_step(layer_time(workload, target, lnc, tp, cp, b, 1, moe=False).training(rc), tp, cp, b)

    def moe_layer(rc, tp, cp, b, ep, fold):
        return per_step(layer_time(workload, target, lnc, tp, cp, b, ep, moe=True, etp=tp // fold).training(rc), tp,
                        cp, b)

    parts = [f.prod(f.count("pp", lambda pp: pp * (layers(pp) - moe_layers(pp)), "dense_layers_pp"),
                    f.table(("recompute", "tp", "cp", "micro_batch"), dense_layer, "dense_layer_time"))]
    if mdl.moe_layers:
        parts.append(f.prod(f.count("pp", lambda pp: pp * moe_layers(pp), "moe_layers_pp"),
                            f.table(("recompute", "tp", "cp", "micro_batch", "ep", "ep_fold"), moe_layer,
                                    "moe_layer_time")))
    parts.append(f.prod(f.decision("pp"), f.table(("tp", "cp", "micro_batch"), lambda tp, cp, b: per_step(
        head_seconds(workload, target, lnc, tp, cp, b), tp, cp, b), "head")))
    parts.append(f.prod(m, f.decision("interleave"), coef=target.efficiency.microbatch_overhead_s))
    compute = f.add(*parts, name="compute")

    @functools.lru_cache(maxsize=None)  # the raw and kept TP tables, and every LNC's model, ask alike
    def once(op: str, size: float, span) -> float:
        """One collective of ``size`` bytes per rank, by the algorithm the runtime picks for it."""
        return cc.collective_time(op, size, span, c, runtime) if span else 0.0

    # TP: n L_s pp * (B tp cp / (R b)) t_AR(s/cp b h a), times (1 - hidden) after overlap; ``kept``
    # gives 1 - hidden of a span (None: the raw term)
    def tp_term(kept, name: str) -> f.Expr:
        @functools.lru_cache(maxsize=None)  # the search's bounds and tables ask each entry many times
        def per_stage_layer(span, cp, b):
            return ((kept(span) if kept else 1.0) * B * _span_size(span) * cp / (R * b)
                    * once("all_reduce", s / cp * b * h * a, span))
        return f.prod(f.count(("recompute", "pp"), lambda rc, pp: (tp_collectives(rc, layers(pp)) - moe_mlp_collectives(
            rc, moe_layers(pp))) * pp, "tp_npp"),
                      f.table(("span.tp", "cp", "micro_batch"), per_stage_layer, name + "_each"), name=name)

    # replicated KV heads (tp > kv heads, memory.kv_replica_params): NxD's GQA QKV backward all-reduces the
    # K and V output gradients (FP32) over the ranks sharing a KV head, once per layer and micro-batch
    # (neuronx_distributed/modules/qkv_linear.py), 2 s/cp b d 4 bytes a rank: L_s pp * (B tp cp / (R b))
    # t_AR(that). Timed on the TP group's span, which holds those groups (a bound: they are tp / kv of its
    # ranks), and not hidden by the overlap kernels
    @functools.lru_cache(maxsize=None)
    def kv_grads_each(span, cp, b):
        tp = _span_size(span)
        if not kv_replica_params(mdl, tp):
            return 0.0
        return B * tp * cp / (R * b) * once("all_reduce", 2 * s / cp * b * mdl.head_dim * FP32, span)
    kv_grads = f.prod(f.count("pp", lambda pp: layers(pp) * pp, "kv_grads_lpp"),
                      f.table(("span.tp", "cp", "micro_batch"), kv_grads_each, "kv_grads_each"), name="kv_grads")
    tp_raw = f.add(tp_term(None, "tp_raw_ar"), kv_grads, name="tp_raw")

    # CP: 2 L_s pp * (B tp cp / (R b)) t_AG(b s max(kv, tp) / tp * 2 d a): a rank holds max(kv, tp) / tp
    # K/V heads and gathers them for the whole sequence
    kv_bytes = 2 * mdl.head_dim * a

    @functools.lru_cache(maxsize=None)
    def cp_each(span, tp, b):
        gathered = b * s * max(mdl.kv_heads, tp) / tp * kv_bytes
        return B * tp * _span_size(span) / (R * b) * once("all_gather", gathered, span)
    cp = f.prod(f.count("pp", lambda pp: 2 * layers(pp) * pp, "cp_lpp"),
                f.table(("span.cp", "tp", "micro_batch"), cp_each, "cp_each"), name="cp")

    # EP: n M_s pp B s r top_k h a k / R + n M_s m lambda on the EP group's span (folded over the TP
    # ranks under expert TP 1), r the routing imbalance (the busiest receiver); plus, under expert
    # TP > 1, the expert-TP group's gather of the dispatched tokens and reduce-scatter of the expert
    # outputs, as many: n M_s pp (B tp cp / (R b)) t_AG(r top_k s/cp b h a)
    top_k = mdl.moe.top_k * mdl.moe.routing_imbalance if mdl.moe else 0
    # node-limited routing: a token crosses the scale-out network to at most route_nodes nodes, once
    # each, of its top_k copies (workload.Moe.route_nodes): that level carries min(M, top_k) / top_k
    routed = min(mdl.moe.route_nodes, mdl.moe.top_k) / mdl.moe.top_k if mdl.moe and mdl.moe.route_nodes else 1.0

    def ep_per_byte(sp):
        return per_byte("all_to_all", sp) - (1 - routed) * cc.all_to_all_scale_out(sp, c, runtime)

    @functools.lru_cache(maxsize=None)
    def etp_each(span, fold, cp, b):
        tp = _span_size(span)
        if tp // fold == 1 or not span:
            return 0.0
        return B * tp * cp / (R * b) * once("all_gather", top_k * s / cp * b * h * a, span)
    ep = f.add(
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, moe_layers(pp)) * pp, "etp_npp"),
               f.table(("span.tp", "ep_fold", "cp", "micro_batch"), etp_each, "etp_each")),
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, moe_layers(pp)) * pp, "ep_npp"),
               f.table("span.ep", lambda sp: B * s * top_k * h * a * ep_per_byte(sp) / R, "ep_bw")),
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, moe_layers(pp)), "ep_nl"), m,
               f.table("span.ep", lambda sp: fixed("all_to_all", sp), "ep_lat")), name="ep")

    # pipeline sends: v (2 B pp s h a k / R + 2 m lambda)
    pp_send = f.prod(f.decision("interleave"), f.add(
        f.table("span.pp", lambda sp: 2 * B * _span_size(sp) * s * h * a * per_byte("p2p", sp) / R, "pp_bw"),
        f.prod(m, f.table("span.pp", lambda sp: 2 * fixed("p2p", sp), "pp_lat"))), name="pp_send")

    # the bubble's num(pp) and den(v) (_step_terms); the default schedules' den is v itself
    den = f.decision("interleave") if schedule is None else f.count(
        "interleave", lambda v: bubble_den(schedule, v), "bubble_den")
    num = f.count("pp", lambda pp: bubble_num(schedule, pp), "bubble_num")

    # DP: gradients of dense weights over span.dp (ep x edp), of experts over span.edp
    experts = mdl.expert_params()
    dense = mdl.total_params() - experts
    kv_head_params = kv_replica_params(mdl, mdl.kv_heads + 1)  # E(tp) = this x (tp - kv heads), tp past them

    def kv_replicas(tp: int) -> int:
        return max(tp - mdl.kv_heads, 0)

    def sync(kind: str, params: float, z: int, hsdp: bool, sp) -> tuple[float, float]:
        """(seconds per unit of cp, fixed seconds) over the data-parallel span ``sp`` of one step's
        gradient all-reduce ("grads"; under ZeRO-3 none: only HSDP's replicas exchange at the
        step), one micro-batch's ZeRO-3 gradient reduce-scatter ("scatter") or one ZeRO-3
        gather ("gather") of ``params``; under HSDP the shard group's, plus for "grads" the
        replicas' all-reduce of the shard."""
        shard, replicas = hsdp_spans(sp) if hsdp else (sp, ())
        op, per_param = ("all_gather", tr.weight_bytes) if kind == "gather" else ("all_reduce", tr.grad_bytes)
        size = params * per_param * _span_size(sp) / R  # bytes of the stage's full gradients (weights) per cp
        if kind == "scatter":  # a reduce-scatter is half an all-reduce's bytes and hops
            return 0.5 * size * per_byte(op, shard), 0.5 * fixed(op, shard)
        # under ZeRO-3 the shard's reduce-scatter runs per micro-batch ("scatter"), not here
        seconds, fixed_s = (0.0, 0.0) if kind == "grads" and z == 3 else (size * per_byte(op, shard),
                                                                          fixed(op, shard))
        if kind == "grads" and replicas:
            share = _span_size(shard) if z >= 2 else 1  # the shard the replicas exchange
            seconds += size / share * per_byte("all_reduce", replicas)
            fixed_s += fixed("all_reduce", replicas)
        return seconds, fixed_s

    def group_time(kind: str, name: str) -> f.Expr:
        # the ZeRO stage matters to the gradients only (what the replicas exchange)
        keys = ("zero", "hsdp") if kind == "grads" else ("hsdp",)

        def part(params: float, i: int):
            if kind == "grads":
                return lambda z, h, sp: sync(kind, params, z, h, sp)[i]
            return lambda h, sp: sync(kind, params, 3, h, sp)[i]  # ZeRO-3's own collectives
        cpd = f.decision("cp")
        dense_bw = f.table((*keys, "span.dp"), part(dense, 0), name + "_dense_bw")
        parts = [f.prod(cpd, dense_bw), f.table((*keys, "span.dp"), part(dense, 1), name + "_dense_lat")]
        if kv_head_params:  # replicated K/V gradients ride in the same buckets: E(tp) / P_dense more bytes
            parts.append(f.prod(cpd, dense_bw, f.count("tp", kv_replicas, "kv_replicas"), coef=kv_head_params / dense))
        if experts:
            parts += [f.prod(cpd, f.table((*keys, "span.edp"), part(experts, 0), name + "_expert_bw")),
                      f.table((*keys, "span.edp"), part(experts, 1), name + "_expert_lat")]
        return f.add(*parts, name=name)

    layers_per_stage = f.count("pp", layers, "layers_per_stage")
    grads = group_time("grads", "dp_comm")  # the DP term, max(grads / L_s, grads - window): _step_terms

    # ZeRO-3, per micro-batch: two gathers and a gradient reduce-scatter, under the compute but the
    # first layer's gather and the last layer's reduce-scatter. The indicator first, so that no
    # product of a huge gather outgrows the solver's range
    z3 = f.indicator("zero", lambda z: z == 3, "zero3")
    gather = f.prod(z3, group_time("gather", "z3"))
    scatter = f.prod(z3, group_time("scatter", "z3_rs"))
    zero3 = f.maximum(f.ratio(f.add(gather, scatter), layers_per_stage),
                      f.sub(f.prod(m, f.add(f.prod(gather, coef=2), scatter)), compute), name="zero3")

    # optimizer: Adam reads and writes the state of the rank's (sharded) parameters once, the
    # gradient norm reads their gradients and clipping scales them in place (3 gradient passes),
    # at HBM bandwidth per rank
    seconds_per_param = (2 * tr.state_bytes_per_param + 3 * tr.grad_bytes) * c / target.chip.hbm_bandwidth
    z0 = f.indicator("zero", lambda z: z == 0, "zero0")
    sharded = f.indicator("zero", lambda z: z >= 1, "zero_ge1")
    kv_extra = f.table("tp", lambda tp: seconds_per_param * kv_replica_params(mdl, tp) / R, "kv_replicas_step")
    optimizer = f.prod(f.decision("cp"), f.add(
        f.prod(z0, f.decision("dp"), coef=seconds_per_param * dense / R),
        f.prod(z0, f.decision("edp"), coef=seconds_per_param * experts / R),
        f.prod(sharded, coef=seconds_per_param * (dense + experts) / R),
        f.prod(z0, f.decision("dp"), kv_extra), f.prod(sharded, kv_extra)), name="optimizer")

    return {"compute": compute, "m": m, "tp_term": tp_term, "kv_grads": kv_grads, "tp_raw": tp_raw, "cp": cp,
            "ep": ep, "pp_send": pp_send, "bubble_num": num, "bubble_den": den, "grads": grads,
            "layers_per_stage": layers_per_stage, "zero3": zero3, "optimizer": optimizer}


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
