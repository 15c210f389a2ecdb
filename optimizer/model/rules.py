"""The structural rules a training framework's code puts on a layout, and the checks of the
tensor- and context-parallel degrees against the model and the sequence under them."""

from __future__ import annotations

from dataclasses import dataclass

from trnopt.optimizer.model.workload import Model


@dataclass(frozen=True)
class Rules:
    """The structural rules a training framework's code puts on a layout, beyond the model's own.

    The defaults are the permissive ones (Megatron-style GQA replication, any CP degree that
    divides the sequence, ``pp * interleave <= layers``); a framework profile
    (frameworks/profile.py) states its own and names the file each comes from.
    """

    kv_replication: bool = True
    """TP past the KV head count replicates every KV head on tp / kv_heads ranks (NxD's
    ``kv_size_multiplier``); False: TP must divide the KV heads (wk/wv sharded column-wise by heads)."""
    seq_split: int = 1
    """The sequence is cut into seq_split x tp x cp equal pieces: 2 under torchtitan (sequence
    parallelism cuts it by tp, load-balanced context parallelism into 2 x cp chunks), 1: cp | seq."""
    even_expert_shards: bool = False
    """Expert TP (= TP) cuts the routed and the shared experts' FFN width into equal shards."""
    expert_tp_one: bool = True
    """Whether expert-TP 1 may fold the EP group over the TP ranks (MoE parallel folding:
    Megatron-Core's expert_tensor_parallel_size; torchtitan's expert_tensor_parallel_degree 1,
    torchtitan/distributed/parallel_dims.py ``_validate``: ETP is TP or 1)."""
    expert_with_context: bool = True
    """Whether EP > 1 may be combined with CP > 1. False under torchtitan, which takes its EP
    groups from consecutive ranks of the flattened (dp_shard, cp) mesh (ParallelDims' sparse
    mesh pp, dp_replicate, efsdp, ep, etp), so its EP groups would not be trnopt's (one cp
    coordinate each)."""
    stage_weights: tuple[int, int] | None = None
    """(first, last): the pipeline split counts the embedding and the output as this many layers and
    makes ``ceil((layers + first + last) / layers_per_stage)`` stages (torchtitan); None: pp x
    interleave stages of ceil(layers / stages) layers."""

    def stages_ok(self, layers: int, pp: int, interleave: int) -> bool:
        """Whether pp x interleave pipeline stages can be made of ``layers`` layers."""
        stages = pp * interleave
        if self.stage_weights is None or pp == 1:
            return stages <= layers
        effective = layers + sum(self.stage_weights)
        if stages > effective or effective // stages < max(self.stage_weights):
            return False
        # some layers_per_stage n gives exactly this many stages: ceil(effective / n) == stages
        return interleave == 1 or any(-(-effective // n) == stages for n in range(1, effective + 1))


def tp_problems(m: Model, tp: int, rules: Rules = Rules()) -> list[tuple[str, str]]:
    """(what, rule) of what stops ``tp`` from sharding the model's heads (and, under ``rules``, its
    experts) evenly; what is "heads", "kv_heads", "experts" or "shared_experts"."""
    out = []
    if m.heads % tp:
        out.append(("heads", f"tp={tp} must divide the {m.heads} attention heads"))
    elif m.mla is None and m.kv_heads % tp and (not rules.kv_replication or tp % m.kv_heads):
        out.append(("kv_heads", f"tp={tp} must divide the {m.kv_heads} KV heads" + (
            " or be a multiple of them (each KV head replicated)" if rules.kv_replication else
            " (wk and wv are sharded by whole heads; no KV-head replication)")))
    if rules.even_expert_shards and m.moe is not None:
        for kind, what, width in (("experts", "routed experts' FFN width", m.moe.expert_ffn),
                                  ("shared_experts", "shared experts' FFN width",
                                   m.moe.shared_experts * m.moe.expert_ffn)):
            if width % tp:
                out.append((kind, f"tp={tp} must divide the {what} {width} (expert TP = TP)"))
    return out


def seq_problem(seq: int, tp: int, cp: int, rules: Rules = Rules()) -> str | None:
    """What stops the sequence from being cut as the rules cut it: cp | seq, or under
    ``seq_split`` > 1, (seq_split x tp x cp) | seq."""
    if rules.seq_split == 1:
        return None if seq % cp == 0 else f"cp={cp} must divide the sequence {seq}"
    split = rules.seq_split * tp * cp
    return None if seq % split == 0 else (f"the sequence {seq} must be divisible by {rules.seq_split} x tp x cp = "
                                          f"{rules.seq_split} x {tp} x {cp} = {split}")
