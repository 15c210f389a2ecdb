"""Memory per chip: model state by ZeRO stage, activations, runtime reserve, headroom.

Model state (Rajbhandari et al., "ZeRO", 2020, section 5): per parameter, BF16 weights
(2 B), BF16 gradients (2 B), an FP32 master copy (4 B) and Adam's two FP32 moments (8 B).
ZeRO-1 shards master + optimizer over data parallelism, ZeRO-2 the gradients too, ZeRO-3
the weights too. Tensor and pipeline parallelism split every parameter; expert weights
are split further over expert parallelism and their data-parallel group is dp // ep.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, section 4): bytes per layer for s (sequence), b (micro-batch), h, a
(heads), t (TP with sequence parallelism):
    no recompute          s*b*h/t * (34 + 5*a*s/h)    (t = 1: no TP)
    selective recompute   s*b*h/t * 34
    full recompute        s*b*h/t * 2
Without sequence parallelism (TP alone, ibid. eq. 2) the 10 of the 34 that it shards (the
norms' inputs, the attention's and MLP's inputs, the two dropout masks) and a full
recompute's stored input are not divided by t: s*b*h * (10 + 24/t + 5*a*s/(h*t)).
The 34 is 11 (attention; narrower K and V under grouped-query attention,
``attention_activation_bytes``) + 19 (a 4h MLP: 2 input + 16 for the two 4h tensors + 1 mask) +
4 (norms); for other MLPs the 16 becomes (6 if gated else 4) * ffn / h, which gives 34
back for the paper's models. Context parallelism divides s. The first pipeline stage holds
the most micro-batches in flight, each holding L/p layers: min(m, p) under 1F1B, times
(1 + (p-1)/(p*v)) interleaved by v (ibid., section 4.2.3); every schedule's count is in
the docstring of cost/pipeline.py, with its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.pipeline import interleave_factor, resolve, tree_schedule
from trnopt.optimizer.model.layout import Layout, every_nth, hsdp_replicas, recompute_mix
from trnopt.optimizer.model.target import GIB, Axis, Target
from trnopt.optimizer.model.workload import Model, Workload


def training_state_bytes(params: float, bytes_per_param: int = 16) -> float:
    """Unsharded training state: params * bytes per param (16 with BF16 + FP32 master + Adam)."""
    return params * bytes_per_param


def sharded_state_per_chip(params: float, chips: int, bytes_per_param: int = 16) -> float:
    """Training state fully sharded over ``chips`` (ZeRO-3 over everything): params * 16 / chips."""
    return params * bytes_per_param / chips


def zero_state_per_chip(params: float, model_parallel_chips: int, dp: int, zero: int,
                        weight: int = 2, grad: int = 2, master: int = 4, optimizer: int = 8) -> float:
    """State per chip for a layout whose model-parallel group spans ``model_parallel_chips``.

    weights/grads/master+optimizer each divide by the model-parallel size, and by dp
    from ZeRO stage 3/2/1 on. Seed: 405e9 params, TP16 x PP4 (64 chips), DP2, ZeRO-1
    -> (2+2) * P / 64 + 12 * P / 128 = 58.9 GiB.
    """
    mp = model_parallel_chips
    return (weight * params / (mp * (dp if zero >= 3 else 1))
            + grad * params / (mp * (dp if zero >= 2 else 1))
            + (master + optimizer) * params / (mp * (dp if zero >= 1 else 1)))


def activation_bytes_per_layer(workload: Workload, tp: int, cp: int, micro_batch: int, recompute: str) -> float:
    """One layer, one micro-batch, one rank: Korthikanti et al. (2022), TP with or without SP (module doc).

    Flash attention (the default) never stores the a*s^2 scores, so the 5as/h term appears
    only without it. MLP-only recompute keeps the attention's 11, the norms' 4 and the MLP's
    input (2), and recomputes the MLP's interior. Every n-th layer in full: the mean layer."""
    if every_nth(recompute):
        return sum(share * activation_bytes_per_layer(workload, tp, cp, micro_batch, mode)
                   for mode, share in recompute_mix(recompute))
    if recompute == "op":
        return op_sac_bytes(workload, tp, cp, micro_batch)
    m, tr = workload.model, workload.training
    s, b, h, t = tr.seq / cp, micro_batch, m.hidden, tp
    mlp = 2 + (6 if m.gated_mlp else 4) * m.ffn_width_per_token / h + 1
    attention = attention_activation_bytes(m)
    scores = 0.0 if tr.flash_attention else 5 * m.heads * s / h
    # (kept, of which sequence parallelism shards): the norms' inputs, the two dropout masks and
    # the attention's and MLP's inputs are 10 of the 34; a full recompute's stored input is its 2
    kept, sharded_by_sp = {"full": (2, 2), "selective": (attention + mlp + 4, 10),
                           "mlp": (attention + 4 + 2 + scores, 9)}.get(recompute, (attention + mlp + 4 + scores, 10))
    sbh = s * b * h
    return sbh * ((kept - sharded_by_sp) / t + sharded_by_sp / (t if tr.sequence_parallel else 1))


def op_sac_bytes(workload: Workload, tp: int, cp: int, micro_batch: int) -> float:
    """One layer, one micro-batch, one rank under torchtitan's per-op selective checkpointing
    (torchtitan 0.2.2, torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``, policy
    ``_custom_policy``; save list ``_op_sac_save_list`` in torchtitan/models/llama3/infra/parallelize.py:
    aten.mm, the SDPA flash/efficient kernels, reduce_scatter_tensor, aten.max). Per block the policy
    counts aten.mm calls and saves the odd ones: of Llama's seven (models/llama3/model/model.py: wq, wk,
    wv in Attention.forward, wo; w1, w3, w2 in FeedForward.forward, ``w2(silu(w1(x)) * w3(x))``) it keeps
    wq, wv, w1 and w2 and recomputes wk, wo and w3. Everything else (norms, RoPE, SiLU, the gate product,
    the sequence-parallel all-gathers) is recomputed. Kept, bytes per s*b*h (BF16; q, kv as in
    ``attention_activation_bytes``, f = ``ffn_width_per_token`` / h, a heads):
        block input (the checkpoint's argument)           2                  (/ t with sequence parallelism)
        wq, wv outputs                                   (2 q + 2 kv) / t
        attention output + FP32 logsumexp                (2 q + 4 a / h) / t
        w1 output                                         2 f / t
        w2 output (row-parallel: unreduced, full width)   2
        reduce_scatter outputs of wo and w2 (TP > 1, SP)  4 / t
    = 15.5 for Llama 3 8B at t = 1 (Korthikanti's selective, as costed here, keeps 36). A non-gated MLP's w2 is the
    sixth mm and is recomputed instead (w1 kept). MLA and MoE blocks are counted with this dense saved
    set at their widths (their mm order differs; an approximation). The scores are never stored."""
    m, tr = workload.model, workload.training
    s, b, h, t = tr.seq / cp, micro_batch, m.hidden, tp
    q, kv = m.heads * m.head_dim / h, m.kv_heads * m.head_dim / h
    f = m.ffn_width_per_token / h
    sp = tr.sequence_parallel and t > 1
    sharded = 2 * q + 2 * kv + 2 * q + 4 * m.heads / h + 2 * f
    down = 2 if m.gated_mlp else 0                # w2's unreduced output, kept whole on each rank
    scattered = 4 if sp else 0                    # wo's and w2's reduce_scatter outputs
    return s * b * h * (2 / (t if sp else 1) + (sharded + scattered) / t + down)


def attention_activation_bytes(model: Model) -> float:
    """Bytes per s*b*h the attention block stores besides its scores (Korthikanti et al. 2022,
    section 4.1: 11 = QKV input 2 + Q and K 4 + V 2 + output-projection input 2 + dropout mask 1),
    with each tensor at its own width: Q and the attention output are heads * head_dim wide, K and
    V kv_heads * head_dim (grouped-query attention, Ainslie et al. 2023, shares each K/V head among
    heads / kv_heads query heads, so K and V are that much narrower):
        2 + 2 q/h + 4 kv/h + 2 q/h + 1,  q = heads * head_dim, kv = kv_heads * head_dim
    which is the paper's 11 for multi-head attention (q = kv = h). MLA's latent KV keeps the 11."""
    if model.mla is not None:
        return 11.0
    q, kv = model.heads * model.head_dim / model.hidden, model.kv_heads * model.head_dim / model.hidden
    return 2 + 2 * q + 4 * kv + 2 * q + 1


def recompute_working_set(workload: Workload, tp: int, cp: int, micro_batch: int, recompute: str) -> float:
    """Bytes a recomputed layer holds while its backward runs: the layer's activations as if
    nothing were recomputed (one layer, one micro-batch), beyond what it keeps (every n-th
    layer in full: that of a fully recomputed layer)."""
    if recompute == "none":
        return 0.0
    if every_nth(recompute):
        recompute = "full"
    return (activation_bytes_per_layer(workload, tp, cp, micro_batch, "none")
            - activation_bytes_per_layer(workload, tp, cp, micro_batch, recompute))


def logits_bytes(workload: Workload, tp: int, cp: int, micro_batch: int) -> float:
    """FP32 logits and their gradient on the last stage: s/cp * b * V/tp * 8 bytes."""
    tr = workload.training
    return tr.seq / cp * micro_batch * workload.model.vocab / tp * 8


def kv_replica_params(model: Model, tp: int) -> int:
    """K/V projection parameters a TP group holds beyond the model's own, all layers:
        layers * 2 * hidden * head_dim * (max(kv_heads, tp) - kv_heads)
    When TP exceeds the KV head count, each rank still needs one whole KV head, so every KV head is
    replicated on tp / kv_heads ranks: NxD Training's GQAQKVColumnParallelLinear replicates the K and
    V weights ``kv_size_multiplier`` (= tp / kv_heads) times (neuronx_distributed/modules/qkv_linear.py;
    the NxD API guide: "it would result in extra memory getting consumed"). Each replica has its own
    weights, gradients and optimizer state. 0 for MLA (no KV heads to shard) and for tp <= kv_heads."""
    if model.mla is not None or tp <= model.kv_heads:
        return 0
    return model.layers * 2 * model.hidden * model.head_dim * (tp - model.kv_heads)


def gathered_layer_bytes(workload: Workload, tp: int, ep: int) -> float:
    """ZeRO-3 / FSDP buffers per rank: the layer in use and the one prefetched, unsharded over DP
    (BF16 weights), and one layer's unsharded gradient reduced in FP32 (torchtitan's default
    mixed_precision_reduce), for the largest layer (PyTorch FSDP2 prefetches one layer ahead)."""
    mdl, tr = workload.model, workload.training
    dense = (mdl.attention_params() + kv_replica_params(mdl, tp) / mdl.layers + 2 * mdl.hidden
             + (mdl.mlp_params(mdl.ffn) if mdl.dense_layers else 0))
    largest = dense / tp
    if mdl.moe is not None:
        moe = mdl.moe
        routed = moe.experts * mdl.mlp_params(moe.expert_ffn)
        shared = moe.shared_experts * mdl.mlp_params(moe.expert_ffn) + mdl.hidden * moe.experts
        largest = max(largest, (mdl.attention_params() + 2 * mdl.hidden + shared) / tp + routed / (tp * ep))
    return largest * (2 * tr.weight_bytes + 4)


def layers_per_stage(workload: Workload, layout: Layout) -> int:
    """ceil(L / p): the busiest stage when p does not divide L (uneven stages, as Megatron allows)."""
    return math.ceil(workload.model.layers / layout.pp)


@dataclass(frozen=True)
class Memory:
    """Bytes per chip by kind; ``total`` includes the runtime reserve and the fragmentation allowance."""

    weights: float
    gradients: float
    optimizer: float        # FP32 master + Adam moments
    activations: float      # the busier of the first stage (micro-batches in flight) and the last (logits)
    gathered: float         # ZeRO-3 / FSDP layer buffers
    fragmentation: float    # allocator allowance on what the job allocates
    reserve: float          # the runtime's own

    @property
    def state(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.state + self.activations + self.gathered + self.fragmentation + self.reserve

    def gib(self) -> dict[str, float]:
        return {k: v / GIB for k, v in (("weights", self.weights), ("gradients", self.gradients),
                                         ("master_and_optimizer", self.optimizer),
                                         ("activations", self.activations), ("zero3_buffers", self.gathered),
                                         ("fragmentation", self.fragmentation), ("runtime_reserve", self.reserve))}


# ASSUMPTION: a caching allocator leaves ~5% of what it holds in blocks it cannot reuse
# (PyTorch's caching allocator notes; the Neuron runtime publishes no figure). An allowance
# on top of the user's headroom.
FRAGMENTATION_DIVISOR = 20  # 1/20 = 5%: a division keeps the solver's products in range


KINDS = tuple(fl.name for fl in fields(Memory))


def memory_terms(workload: Workload, target: Target, axes: tuple[Axis, ...],
                 schedule: str | None = None) -> dict[str, f.Expr]:
    """Every Memory kind as a tree of factors (factors.py), for layouts on ``axes`` running the
    pipeline ``schedule`` (None: ``default_schedule`` of each interleave, as the search's layouts).

    A rank holds P_dense / (tp pp) = P_dense dp cp / R dense and P_expert edp cp / R expert
    parameters (R ranks), and E(tp) dp cp / R replicated K/V ones past the KV head count
    (kv_replica_params); a kind of state sharded from ZeRO stage z on holds
    bytes * cp * (P_dense + P_expert) / R from then (times dp_replicate under HSDP, whose shards
    span dp / dp_replicate ranks), bytes * cp * (P_dense dp + P_expert edp) / R before. Activations: the first stage's A(recompute, tp, cp) * b * L_s * min(m, pp) *
    interleave factor, or the last stage's one micro-batch plus its FP32 logits, whichever is
    larger, plus the working set of a recomputed layer; ZeRO-3 adds its gathered layers. Other
    schedules hold other counts in flight (cost/pipeline.py): GPipe m, DualPipeV min(2m, 2p+1) / 2.
    Every kind is per rank times the ranks per chip c; fragmentation is a share of the sum.
    """
    mdl, tr = workload.model, workload.training
    R, c = math.prod(a.size for a in axes), axes[0].size
    experts = mdl.expert_params()
    dense = mdl.total_params() - experts

    # HSDP shards over dp / dp_replicate ranks: a sharded kind is dp_replicate times larger
    replicas = f.count(("hsdp", "span.dp"), lambda h, sp: hsdp_replicas(sp) if h else 1, "hsdp_replicas")

    # replicated K/V heads (kv_replica_params) add to the dense parameters of a TP group: E(tp) dp / R
    # a rank before sharding, E(tp) / R from its stage on (per unit of cp, as the rest)
    kv_extra = f.table("tp", lambda tp: kv_replica_params(mdl, tp) / R, "kv_replicas_per_rank")

    def state(bytes_per_param: int, stage: int, name: str) -> f.Expr:
        before = f.count("zero", lambda z: bytes_per_param if z < stage else 0, name + "_unsharded")
        after = f.count("zero", lambda z: bytes_per_param if z >= stage else 0, name + "_sharded")
        return f.prod(f.decision("cp"), f.add(
            f.prod(before, f.table("dp", lambda dp: dense * dp / R, "dense_per_rank")),
            f.prod(before, f.table("edp", lambda edp: experts * edp / R, "experts_per_rank")),
            f.prod(after, replicas, coef=(dense + experts) / R),
            f.prod(before, f.decision("dp"), kv_extra), f.prod(after, replicas, kv_extra)), coef=c, name=name)

    pp = f.decision("pp")
    b = f.decision("micro_batch")
    layers = f.count("pp", lambda p: math.ceil(mdl.layers / p), "layers")
    per_layer = f.table(("recompute", "tp", "cp"),
                        lambda rc, tp, cp: activation_bytes_per_layer(workload, tp, cp, 1, rc), "activations_per_layer")
    m = f.decision("micro_batches")
    halves = 2 if schedule == "DualPipeV" else 1  # DualPipeV counts half a rank's layers a stage
    if schedule == "GPipe":  # every forward before any backward
        in_flight = m
    elif schedule == "DualPipeV":  # min(2m, 2p + 1) stages' micro-batches, halved below
        in_flight = f.minimum(f.count("micro_batches", lambda n: 2 * n, "twice_micro_batches"),
                              f.count("pp", lambda p: 2 * p + 1, "dualpipev_cap"), name="in_flight")
    else:
        in_flight = f.minimum(m, pp, name="in_flight")
    interleave = ("pp", "interleave")
    first = f.ratio(
        f.prod(per_layer, b, layers, in_flight, f.count(interleave, lambda p, v: interleave_factor(
            resolve(schedule, v), p, v)[0], "interleave_num"), coef=c),
        f.count(interleave, lambda p, v: halves * interleave_factor(resolve(schedule, v), p, v)[1], "interleave_den"),
        name="first_stage")
    last = f.add(f.prod(per_layer, b, layers, coef=c),
                 f.prod(f.table(("tp", "cp"), lambda tp, cp: logits_bytes(workload, tp, cp, 1), "logits"), b, coef=c),
                 name="last_stage")
    working = f.prod(f.table(("recompute", "tp", "cp"), lambda rc, tp, cp: recompute_working_set(
        workload, tp, cp, 1, rc), "recompute_working_set"), b, coef=c)
    activations = f.add(f.maximum(first, last), working, name="activations")
    gathered = f.prod(f.indicator("zero", lambda z: z == 3, "zero3"),
                      f.table(("tp", "ep"), lambda tp, ep: gathered_layer_bytes(workload, tp, ep), "gathered"),
                      coef=c, name="gathered")
    kinds = {"weights": state(tr.weight_bytes, 3, "weights"), "gradients": state(tr.grad_bytes, 2, "gradients"),
             "optimizer": state(tr.master_bytes + tr.optimizer_bytes, 1, "optimizer"), "activations": activations,
             "gathered": gathered}
    kinds["fragmentation"] = f.ratio(f.add(*kinds.values()), FRAGMENTATION_DIVISOR, name="fragmentation")
    kinds["reserve"] = f.Const(target.runtime_reserve_bytes)
    return kinds


def memory_per_chip(workload: Workload, layout: Layout, target: Target) -> Memory:
    """Per-chip memory: ranks_per_chip times one rank's share, plus the runtime reserve."""
    terms = memory_terms(workload, target, layout.axes, tree_schedule(layout))
    point = f.decisions(layout, workload)
    return Memory(**{kind: terms[kind].value(point) for kind in KINDS})


def usable_hbm(target: Target, headroom: float) -> float:
    """HBM a plan may fill: capacity * (1 - headroom); the default headroom is 10%."""
    return target.chip.hbm_bytes * (1 - headroom)
