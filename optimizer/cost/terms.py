"""The step-time trees no overlap table changes, one builder per term group (the formulas and
their sources are steptime.py's module docstring, term by term): compute, TP (the builder of
its tree under any hidden shares) with the replicated-KV gradients, CP, EP, pipeline sends and
the bubble's counts, DP with ZeRO-3 and the optimizer.

Every builder reads one ``Scope``: the layout-independent quantities of a (workload, target,
axes, LNC) (R ranks, c cores a chip, B, s, h, a) and the collective timings they share, cached
so that one span's table entries are computed once for every tree that asks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from functools import lru_cache

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.compute import FP32, head_seconds, layer_time
from trnopt.optimizer.cost.memory import kv_replica_params
from trnopt.optimizer.cost.pipeline import bubble_den, bubble_num
from trnopt.optimizer.model.layout import full_layers, hsdp_spans
from trnopt.optimizer.model.target import Axis, Target
from trnopt.optimizer.model.workload import Workload


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


def span_size(span) -> int:
    return math.prod(n for _, n in span)


class Scope:
    """What every term's tree is written over: R ranks, c cores a chip, global batch B, sequence s,
    hidden h, activation bytes a, the micro-batch count m (a decision) and the runtime's collective
    timings at the fixed-cost share a compiled step pays (``Efficiency.collective_fixed_share``,
    fitted), each cached by (op, size, span)."""

    def __init__(self, workload: Workload, target: Target, axes: tuple[Axis, ...], lnc: int) -> None:
        self.workload, self.target, self.lnc = workload, target, lnc
        self.mdl, self.tr = workload.model, workload.training
        self.R, self.c = math.prod(a.size for a in axes), axes[0].size
        self.B, self.s, self.h, self.a = self.tr.global_batch, self.tr.seq, self.mdl.hidden, self.tr.activation_bytes
        self.m = f.decision("micro_batches")
        share = target.efficiency.collective_fixed_share
        self.runtime = replace(cc.NEURON, launch=cc.NEURON.launch * share, ring_setup=cc.NEURON.ring_setup * share)
        # one span feeds several tables (bandwidth, latency, raw and kept), and every LNC's model asks alike
        self.coeff = functools.lru_cache(maxsize=None)(self._coeff)
        self.once = functools.lru_cache(maxsize=None)(self._once)

    def _coeff(self, op: str, span) -> tuple[float, float]:
        return cc.coefficients(op, span, self.c, self.runtime) if span else (0.0, 0.0)

    def _once(self, op: str, size: float, span) -> float:
        """One collective of ``size`` bytes per rank, by the algorithm the runtime picks for it."""
        return cc.collective_time(op, size, span, self.c, self.runtime) if span else 0.0

    def per_byte(self, op: str, span) -> float:
        return self.coeff(op, span)[0]

    def fixed(self, op: str, span) -> float:
        return self.coeff(op, span)[1]

    def layers(self, pp: int) -> int:
        return math.ceil(self.mdl.layers / pp)

    def moe_layers(self, pp: int) -> int:
        return math.ceil(self.mdl.moe_layers / pp)

    def per_step(self, seconds: float, tp: int, cp: int, b: int) -> float:
        """A micro-batch's ``seconds`` times m, with m = B tp cp pp / (R b) and the pp left to the count."""
        return seconds * self.B * tp * cp / (self.R * b)


def compute_term(q: Scope) -> f.Expr:
    """m micro-batches of the busiest stage's layers (dense and MoE) and the LM head (counted on
    every stage: the last stage's, on the 1F1B critical path), plus a fixed cost per micro-batch
    and stage the rank holds (v of them); per-layer times by (recompute, tp, cp, micro-batch[, ep])."""
    workload, target, lnc, mdl = q.workload, q.target, q.lnc, q.mdl

    def dense_layer(rc, tp, cp, b):
        return q.per_step(layer_time(workload, target, lnc, tp, cp, b, 1, moe=False).training(rc), tp, cp, b)

    def moe_layer(rc, tp, cp, b, ep, fold):
        return q.per_step(layer_time(workload, target, lnc, tp, cp, b, ep, moe=True, etp=tp // fold).training(rc),
                          tp, cp, b)

    parts = [f.prod(f.count("pp", lambda pp: pp * (q.layers(pp) - q.moe_layers(pp)), "dense_layers_pp"),
                    f.table(("recompute", "tp", "cp", "micro_batch"), dense_layer, "dense_layer_time"))]
    if mdl.moe_layers:
        parts.append(f.prod(f.count("pp", lambda pp: pp * q.moe_layers(pp), "moe_layers_pp"),
                            f.table(("recompute", "tp", "cp", "micro_batch", "ep", "ep_fold"), moe_layer,
                                    "moe_layer_time")))
    parts.append(f.prod(f.decision("pp"), f.table(("tp", "cp", "micro_batch"), lambda tp, cp, b: q.per_step(
        head_seconds(workload, target, lnc, tp, cp, b), tp, cp, b), "head")))
    parts.append(f.prod(q.m, f.decision("interleave"), coef=target.efficiency.microbatch_overhead_s))
    return f.add(*parts, name="compute")


def tp_builder(q: Scope):
    """The TP tree's builder: n L_s pp * (B tp cp / (R b)) t_AR(s/cp b h a), times (1 - hidden);
    ``kept(span)`` gives 1 - hidden of a span (None: the raw term)."""
    def tp_term(kept, name: str) -> f.Expr:
        @functools.lru_cache(maxsize=None)  # the search's bounds and tables ask each entry many times
        def per_stage_layer(span, cp, b):
            return ((kept(span) if kept else 1.0) * q.B * span_size(span) * cp / (q.R * b)
                    * q.once("all_reduce", q.s / cp * b * q.h * q.a, span))
        return f.prod(f.count(("recompute", "pp"), lambda rc, pp: (tp_collectives(rc, q.layers(pp))
                                                                   - moe_mlp_collectives(rc, q.moe_layers(pp))) * pp,
                              "tp_npp"),
                      f.table(("span.tp", "cp", "micro_batch"), per_stage_layer, name + "_each"), name=name)
    return tp_term


def kv_grads_term(q: Scope) -> f.Expr:
    """Replicated KV heads (tp > kv heads, memory.kv_replica_params): NxD's GQA QKV backward all-reduces the
    K and V output gradients (FP32) over the ranks sharing a KV head, once per layer and micro-batch
    (neuronx_distributed/modules/qkv_linear.py), 2 s/cp b d 4 bytes a rank: L_s pp * (B tp cp / (R b))
    t_AR(that). Timed on the TP group's span, which holds those groups (a bound: they are tp / kv of its
    ranks), and not hidden by the overlap kernels."""
    mdl = q.mdl

    @functools.lru_cache(maxsize=None)
    def kv_grads_each(span, cp, b):
        tp = span_size(span)
        if not kv_replica_params(mdl, tp):
            return 0.0
        return q.B * tp * cp / (q.R * b) * q.once("all_reduce", 2 * q.s / cp * b * mdl.head_dim * FP32, span)
    return f.prod(f.count("pp", lambda pp: q.layers(pp) * pp, "kv_grads_lpp"),
                  f.table(("span.tp", "cp", "micro_batch"), kv_grads_each, "kv_grads_each"), name="kv_grads")


def cp_term(q: Scope) -> f.Expr:
    """CP: 2 L_s pp * (B tp cp / (R b)) t_AG(b s max(kv, tp) / tp * 2 d a): a rank holds max(kv, tp) / tp
    K/V heads and gathers them for the whole sequence."""
    mdl, kv_bytes = q.mdl, 2 * q.mdl.head_dim * q.a

    @functools.lru_cache(maxsize=None)
    def cp_each(span, tp, b):
        gathered = b * q.s * max(mdl.kv_heads, tp) / tp * kv_bytes
        return q.B * tp * span_size(span) / (q.R * b) * q.once("all_gather", gathered, span)
    return f.prod(f.count("pp", lambda pp: 2 * q.layers(pp) * pp, "cp_lpp"),
                  f.table(("span.cp", "tp", "micro_batch"), cp_each, "cp_each"), name="cp")


def ep_term(q: Scope) -> f.Expr:
    """EP: n M_s pp B s r top_k h a k / R + n M_s m lambda on the EP group's span (folded over the TP
    ranks under expert TP 1), r the routing imbalance (the busiest receiver); plus, under expert
    TP > 1, the expert-TP group's gather of the dispatched tokens and reduce-scatter of the expert
    outputs, as many: n M_s pp (B tp cp / (R b)) t_AG(r top_k s/cp b h a)."""
    mdl = q.mdl
    top_k = mdl.moe.top_k * mdl.moe.routing_imbalance if mdl.moe else 0
    # node-limited routing: a token crosses the scale-out network to at most route_nodes nodes, once
    # each, of its top_k copies (workload.Moe.route_nodes): that level carries min(M, top_k) / top_k
    routed = min(mdl.moe.route_nodes, mdl.moe.top_k) / mdl.moe.top_k if mdl.moe and mdl.moe.route_nodes else 1.0

    def ep_per_byte(sp):
        return q.per_byte("all_to_all", sp) - (1 - routed) * cc.all_to_all_scale_out(sp, q.c, q.runtime)

    @functools.lru_cache(maxsize=None)
    def etp_each(span, fold, cp, b):
        tp = span_size(span)
        if tp // fold == 1 or not span:
            return 0.0
        return q.B * tp * cp / (q.R * b) * q.once("all_gather", top_k * q.s / cp * b * q.h * q.a, span)
    return f.add(
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, q.moe_layers(pp)) * pp, "etp_npp"),
               f.table(("span.tp", "ep_fold", "cp", "micro_batch"), etp_each, "etp_each")),
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, q.moe_layers(pp)) * pp, "ep_npp"),
               f.table("span.ep", lambda sp: q.B * q.s * top_k * q.h * q.a * ep_per_byte(sp) / q.R, "ep_bw")),
        f.prod(f.count(("recompute", "pp"), lambda rc, pp: ep_alltoalls(rc, q.moe_layers(pp)), "ep_nl"), q.m,
               f.table("span.ep", lambda sp: q.fixed("all_to_all", sp), "ep_lat")), name="ep")


def pp_send_term(q: Scope) -> f.Expr:
    """Pipeline sends: v (2 B pp s h a k / R + 2 m lambda)."""
    return f.prod(f.decision("interleave"), f.add(
        f.table("span.pp", lambda sp: 2 * q.B * span_size(sp) * q.s * q.h * q.a * q.per_byte("p2p", sp) / q.R,
                "pp_bw"),
        f.prod(q.m, f.table("span.pp", lambda sp: 2 * q.fixed("p2p", sp), "pp_lat"))), name="pp_send")


def bubble_counts(schedule: str | None) -> tuple[f.Expr, f.Expr]:
    """The bubble's num(pp) and den(v) (steptime._step_terms); the default schedules' den is v itself."""
    den = f.decision("interleave") if schedule is None else f.count(
        "interleave", lambda v: bubble_den(schedule, v), "bubble_den")
    num = f.count("pp", lambda pp: bubble_num(schedule, pp), "bubble_num")
    return num, den


def _sync(q: Scope, kind: str, params: float, z: int, hsdp: bool, sp) -> tuple[float, float]:
    """(seconds per unit of cp, fixed seconds) over the data-parallel span ``sp`` of one step's
    gradient all-reduce ("grads"; under ZeRO-3 none: only HSDP's replicas exchange at the
    step), one micro-batch's ZeRO-3 gradient reduce-scatter ("scatter") or one ZeRO-3
    gather ("gather") of ``params``; under HSDP the shard group's, plus for "grads" the
    replicas' all-reduce of the shard."""
    shard, replicas = hsdp_spans(sp) if hsdp else (sp, ())
    op, per_param = ("all_gather", q.tr.weight_bytes) if kind == "gather" else ("all_reduce", q.tr.grad_bytes)
    size = params * per_param * span_size(sp) / q.R  # bytes of the stage's full gradients (weights) per cp
    if kind == "scatter":  # a reduce-scatter is half an all-reduce's bytes and hops
        return 0.5 * size * q.per_byte(op, shard), 0.5 * q.fixed(op, shard)
    # under ZeRO-3 the shard's reduce-scatter runs per micro-batch ("scatter"), not here
    seconds, fixed_s = (0.0, 0.0) if kind == "grads" and z == 3 else (size * q.per_byte(op, shard),
                                                                      q.fixed(op, shard))
    if kind == "grads" and replicas:
        share = span_size(shard) if z >= 2 else 1  # the shard the replicas exchange
        seconds += size / share * q.per_byte("all_reduce", replicas)
        fixed_s += q.fixed("all_reduce", replicas)
    return seconds, fixed_s


def group_time(q: Scope, kind: str, name: str) -> f.Expr:
    """DP's gradients of dense weights over span.dp (ep x edp), of experts over span.edp, for one
    ``_sync`` kind; replicated K/V gradients ride in the dense buckets (E(tp) / P_dense more bytes)."""
    mdl = q.mdl
    experts = mdl.expert_params()
    dense = mdl.total_params() - experts
    kv_head_params = kv_replica_params(mdl, mdl.kv_heads + 1)  # E(tp) = this x (tp - kv heads), tp past them
    # the ZeRO stage matters to the gradients only (what the replicas exchange)
    keys = ("zero", "hsdp") if kind == "grads" else ("hsdp",)

    def part(params: float, i: int):
        if kind == "grads":
            return lambda z, h, sp: _sync(q, kind, params, z, h, sp)[i]
        return lambda h, sp: _sync(q, kind, params, 3, h, sp)[i]  # ZeRO-3's own collectives
    cpd = f.decision("cp")
    dense_bw = f.table((*keys, "span.dp"), part(dense, 0), name + "_dense_bw")
    parts = [f.prod(cpd, dense_bw), f.table((*keys, "span.dp"), part(dense, 1), name + "_dense_lat")]
    if kv_head_params:
        parts.append(f.prod(cpd, dense_bw, f.count("tp", lambda tp: max(tp - mdl.kv_heads, 0), "kv_replicas"),
                            coef=kv_head_params / dense))
    if experts:
        parts += [f.prod(cpd, f.table((*keys, "span.edp"), part(experts, 0), name + "_expert_bw")),
                  f.table((*keys, "span.edp"), part(experts, 1), name + "_expert_lat")]
    return f.add(*parts, name=name)


def zero3_term(q: Scope, compute: f.Expr, layers_per_stage: f.Expr) -> f.Expr:
    """ZeRO-3, per micro-batch: two gathers and a gradient reduce-scatter, under the compute but the
    first layer's gather and the last layer's reduce-scatter. The indicator first, so that no
    product of a huge gather outgrows the solver's range."""
    z3 = f.indicator("zero", lambda z: z == 3, "zero3")
    gather = f.prod(z3, group_time(q, "gather", "z3"))
    scatter = f.prod(z3, group_time(q, "scatter", "z3_rs"))
    return f.maximum(f.ratio(f.add(gather, scatter), layers_per_stage),
                     f.sub(f.prod(q.m, f.add(f.prod(gather, coef=2), scatter)), compute), name="zero3")


def optimizer_term(q: Scope) -> f.Expr:
    """Adam reads and writes the state of the rank's (sharded) parameters once, the gradient norm
    reads their gradients and clipping scales them in place (3 gradient passes), at HBM bandwidth
    per rank."""
    mdl, tr, R = q.mdl, q.tr, q.R
    experts = mdl.expert_params()
    dense = mdl.total_params() - experts
    seconds_per_param = (2 * tr.state_bytes_per_param + 3 * tr.grad_bytes) * q.c / q.target.chip.hbm_bandwidth
    z0 = f.indicator("zero", lambda z: z == 0, "zero0")
    sharded = f.indicator("zero", lambda z: z >= 1, "zero_ge1")
    kv_extra = f.table("tp", lambda tp: seconds_per_param * kv_replica_params(mdl, tp) / R, "kv_replicas_step")
    return f.prod(f.decision("cp"), f.add(
        f.prod(z0, f.decision("dp"), coef=seconds_per_param * dense / R),
        f.prod(z0, f.decision("edp"), coef=seconds_per_param * experts / R),
        f.prod(sharded, coef=seconds_per_param * (dense + experts) / R),
        f.prod(z0, f.decision("dp"), kv_extra), f.prod(sharded, kv_extra)), name="optimizer")


@lru_cache(maxsize=64)
def overlap_free(workload: Workload, target: Target, axes: tuple[Axis, ...], lnc: int,
                 schedule: str | None) -> dict:
    """The trees no overlap table changes, the builder of the TP term (``tp_term``) and the
    pieces ``steptime._step_terms`` assembles the others from."""
    # built in the order the terms are listed in steptime's docstring, as they always were
    q = Scope(workload, target, axes, lnc)
    compute = compute_term(q)
    tp_term = tp_builder(q)
    kv_grads = kv_grads_term(q)
    tp_raw = f.add(tp_term(None, "tp_raw_ar"), kv_grads, name="tp_raw")
    cp, ep, pp_send = cp_term(q), ep_term(q), pp_send_term(q)
    num, den = bubble_counts(schedule)
    layers_per_stage = f.count("pp", q.layers, "layers_per_stage")
    grads = group_time(q, "grads", "dp_comm")  # the DP term, max(grads / L_s, grads - window): _step_terms
    return {"compute": compute, "m": q.m, "tp_term": tp_term, "kv_grads": kv_grads, "tp_raw": tp_raw, "cp": cp,
            "ep": ep, "pp_send": pp_send, "bubble_num": num, "bubble_den": den, "grads": grads,
            "layers_per_stage": layers_per_stage, "zero3": zero3_term(q, compute, layers_per_stage),
            "optimizer": optimizer_term(q)}
