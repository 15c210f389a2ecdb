"""What a training framework can run: the profile the search honours and the launch files assume.

A profile states the decisions a framework offers (ZeRO stages, recomputation, pipeline
schedules, HSDP) and which placements its rank order can produce. The rank order is the
part that silently breaks plans: a framework builds its process groups from global ranks
in a fixed order, torchrun numbers ranks ``RANK = node_rank * nproc_per_node +
local_rank``, and a launcher can still choose only

- the node order: which instance gets which ``--node-rank`` (torchrun's static
  rendezvous sets ``GROUP_RANK`` to it; the c10d rendezvous does not let a launch choose
  it), and
- the core binding: which logical NeuronCore each local rank runs on
  (``NEURON_RT_VISIBLE_CORES`` per worker, Neuron runtime configuration page).

So every instance runs exactly one block of ``nproc_per_node`` consecutive global ranks.
``producible`` says whether a layout's placement has that property under the framework's
rank order; ``torchrun_binding`` gives the node order and core binding that realise it.

Rank numbering. trnopt numbers ranks tp fastest, then cp, ep, dp // ep, pp
(``Layout.rank_coordinates``). torchtitan 0.2.x builds its meshes by unflattening the
world in the order (pp, dp_replicate, dp_shard, cp, tp), tp innermost
(torchtitan/distributed/parallel_dims.py, ``ParallelDims.build_mesh``). The two agree when

- HSDP replicas are the outer digits of trnopt's dp coordinate: dp coordinate
  ``d = shard + (dp_shard // ep) * replica``, i.e. a ZeRO/FSDP shard group is ``ep`` x
  ``dp_shard // ep`` consecutive dp positions, and the ``dp_replicate`` replicas of a
  shard sit at stride ``dp_shard // ep`` (the search must use this convention for
  ``Layout.dp_replicate``);
- expert parallelism is the innermost part of dp_shard with the expert TP degree equal to
  TP (torchtitan ``expert_tensor_parallel_degree = tensor_parallel_degree``: its sparse
  mesh is (pp, dp_replicate, efsdp, ep, etp)), which is trnopt's "EP carved out of DP";
- and EP is not combined with CP: torchtitan's EP group takes consecutive positions of the
  flattened (dp_shard, cp) block, while trnopt's EP group has one cp coordinate.

NxD Training (``parallel_state.initialize_model_parallel``) numbers TP innermost, then DP,
then PP, the same order as trnopt's ranks.

Structural rules (``FrameworkProfile.rules``, held by ``Layout.workload_problems`` and, inside
the search, by the degree sets of ``search.space.Space`` via ``Problem.rules``; each refusal
names the file in ``sources``). torchtitan 0.2.2:

- attention heads and KV heads divisible by TP: wq/wk/wv column-wise, each rank's columns
  viewed as whole heads, no KV-head replication (models/llama3); MLA: heads only;
- the sequence divisible by 2 x tp x cp (``ParallelDims.seq_len_divisor``: sequence
  parallelism, load-balanced context parallelism);
- routed experts divisible by EP; expert TP (= TP) cuts the routed experts' FFN width (w1/w3
  dim 1, w2 dim 2) and the shared experts' (one FeedForward, column/row-wise) into equal shards;
- pipeline stages as ``pipeline_llm`` makes them: the embedding and the output count as one
  layer each, pp x interleave stages need a ``pipeline_parallel_layers_per_stage`` that makes
  exactly that many (1F1B: one a rank);
- the FSDP/HSDP mesh: dp_replicate x dp_shard x cp x tp x pp = world (``ParallelDims._validate``,
  true of every Layout); HSDP needs a shard group (dp_shard x cp > 1), else torchtitan runs
  DDP, which it refuses beside TP/PP/CP (``supports``); the sparse mesh's efsdp =
  dp_shard x cp / ep is whole because EP divides dp and HSDP is never combined with EP.

NxD replicates KV heads (TP a multiple of the KV heads), which the cost model charges
(``cost.memory.kv_replica_params``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layoutfile import FRAMEWORKS
from trnopt.optimizer.model.layout import DIMS, EVERY_NTH, RECOMPUTE, Layout
from trnopt.optimizer.model.rules import Rules, tp_problems
from trnopt.optimizer.model.workload import Workload
from trnopt.optimizer.model.placement import chip_coordinates, instance_prefix, instance_ranks, rank_of
from trnopt.optimizer.model.target import Target


@dataclass(frozen=True)
class TorchrunBinding:
    """How a torchrun launch lands every rank where the plan put it.

    ``node_rank[(domain, instance)]`` is the ``--node-rank`` of the instance at that slot
    of the plan (instance = its position in the UltraServer); ``local_core[local_rank]`` is
    the logical NeuronCore (``chip * logical cores per chip + core``) that local rank must run
    on, the same on every node (a producible placement numbers the ranks inside an instance
    before the instances: see ``FrameworkProfile.producible``). ``bound`` is False when every
    local rank i runs on logical core i, torchrun's and torch-neuronx's default, so no binding
    needs to be set.
    """

    nproc_per_node: int
    """Workers per instance: logical cores per chip x chips per instance."""
    node_rank: dict[tuple[int, int], int]
    """(domain, instance in the domain) -> torchrun --node-rank."""
    local_core: tuple[int, ...]
    """local rank -> logical NeuronCore of its instance, on every node."""

    @property
    def nodes(self) -> int:
        return len(self.node_rank)

    @property
    def bound(self) -> bool:
        return any(v != i for i, v in enumerate(self.local_core))

    @functools.cached_property
    def slot(self) -> dict[int, tuple[int, int]]:
        """node rank -> (domain, instance)."""
        return {n: s for s, n in self.node_rank.items()}


@dataclass(frozen=True)
class FrameworkProfile:
    """What one training framework can run, as the search and the launch files need it."""

    name: str
    """The --framework name."""
    version: str
    """The framework release the profile describes (and the exports are written for)."""
    zero_stages: tuple[int, ...]
    """ZeRO stages it implements (``Layout.zero``); the search passes them to ``Problem.zero_stages``."""
    recompute: tuple[str, ...]
    """``Layout.recompute`` values it runs (of layout.RECOMPUTE: "none", "selective", "op", "full", ...)."""
    schedules: tuple[str, ...]
    """The pipeline schedules its code accepts that trnopt costs (``Layout.schedule`` names, the
    torch.distributed.pipelining spelling; layout.SCHEDULES), named in ``schedule_source``."""
    schedule_source: str
    """The framework's file (or document) that accepts those schedules."""
    hsdp: bool
    """Whether ``Layout.dp_replicate > 1`` (HSDP: shards replicated across groups) is allowed."""
    rank_order: tuple[str, ...]
    """The framework's process mesh, outermost first (documentation and error messages)."""
    formats: tuple[str, ...]
    """``trnopt solve --format`` values that write this framework's files."""
    rules: Rules = Rules()
    """The structural rules its code puts on a layout (``Layout.workload_problems``); the search
    receives them as ``Problem.rules``."""
    sources: tuple[tuple[str, str], ...] = ()
    """(workload_problems key, the framework's file that enforces the rule): where each rule comes from."""
    spelling: tuple[tuple[str, str], ...] = ()
    """(``Layout.schedule``, the framework's own name for it) where the two differ."""
    schedules_refused: tuple[tuple[str, str], ...] = ()
    """(schedule, why the framework's launch as trnopt writes it cannot run it) for schedules its
    code names but refuses in that setting."""

    @property
    def interleaved(self) -> bool:
        """Whether it runs interleaved (virtual) pipeline stages (``Layout.interleave > 1``)."""
        return "Interleaved1F1B" in self.schedules

    def schedule(self, layout: Layout) -> str:
        """The framework's name of the layout's pipeline schedule (the one it was costed with)."""
        return dict(self.spelling).get(layout.pipeline_schedule, layout.pipeline_schedule)

    def supports(self, layout: Layout, workload: Workload) -> str | None:
        """None when the framework runs the layout on this workload (placement aside), else the first
        rule it breaks: a sentence naming the rule and the framework's file it comes from."""
        if layout.zero not in self.zero_stages:
            return f"{self.name} runs ZeRO stage(s) {', '.join(map(str, self.zero_stages))}, not ZeRO-{layout.zero}"
        if layout.recompute not in self.recompute:
            return f"{self.name} has no {layout.recompute!r} recomputation"
        if layout.pp > 1 and (why := dict(self.schedules_refused).get(layout.pipeline_schedule)):
            return f"{self.name} cannot run {layout.pipeline_schedule}: {why}"
        if layout.pp > 1 and layout.pipeline_schedule not in self.schedules:
            return (f"{self.name} has no {layout.pipeline_schedule} pipeline schedule; it runs {', '.join(self.schedules)} "
                    f"({self.schedule_source})")
        if layout.interleave > 1 and not self.interleaved:
            return f"{self.name} has no interleaved pipeline schedule (interleave {layout.interleave})"
        if layout.dp_replicate > 1 and not self.hsdp:
            return f"{self.name} has no HSDP (dp_replicate {layout.dp_replicate})"
        if self.name == "torchtitan" and layout.zero == 3 and layout.dp > 1 and layout.dp_shard == 1 \
                and layout.cp == 1:
            return ("torchtitan runs dp_replicate = dp with nothing to shard as DDP, which it supports only "
                    "without TP/PP/CP (torchtitan/models/llama3/infra/parallelize.py), not as ZeRO-3")
        return self.rules_broken(layout, workload)

    def rules_broken(self, layout: Layout, workload: Workload) -> str | None:
        """The first structural rule (heads, KV heads, sequence split, experts, pipeline stages) of this
        framework's code the layout breaks on this workload, naming the file; None when all hold."""
        problems = layout.workload_problems(workload, self.rules)
        if problems:
            key, rule = problems[0]
            if key == "tp":  # which of TP's rules: the heads', the KV heads' or the experts'
                key = tp_problems(workload.model, layout.tp, self.rules)[0][0]
            where = dict(self.sources).get(key)
            return f"{self.name} cannot run {workload.model.name} so: {rule}" + (f" ({where})" if where else "")
        return None

    def producible(self, layout: Layout, target: Target) -> str | None:
        """None when this framework's rank order plus a launcher's permutations produce the placement.

        The framework fixes which global ranks form each group (its rank order, see the
        module docstring); torchrun gives node ``n`` the ranks ``n * P .. n * P + P - 1``
        with ``P = logical cores per chip * chips per instance``. A launcher may permute
        the nodes (which instance is node ``n``) and bind each local rank to any logical
        core of its instance. The placement is therefore producible exactly when the
        ranks that ``rank_map(layout, target)`` puts on every instance are one aligned
        block of ``P`` consecutive ranks (and, for torchtitan, not EP combined with CP).

        The same rule on the placement rows, for a search that must state it as
        constraints: write each rank as its mixed-radix digits in rank order (tp, cp, ep,
        dp, pp; within one dimension its factors on the axes fastest first: core, the
        domain axes, the scale-out axis; consecutive digits on one axis are one digit of
        their product, as they walk that axis's positions in order). Split every digit into the part that stays
        inside an instance (the core axis; the domain-axis positions one instance holds,
        e.g. x and y of a Trn2 torus, or the first 4 positions of the Trn3 Gen2 switch
        axis) and the part that changes instance. Producible iff every in-instance digit
        comes before every instance-changing digit: once a dimension has a factor that
        leaves the instance, no later dimension (and no later axis of the same
        dimension) may have a factor > 1 inside it. A digit that cannot be split at the
        instance boundary (a factor of 3 straddling a 4-chip server) is not producible.
        ``placement_conflict`` evaluates this rule in a time that does not grow with the
        rank count, and is what this method reads; the tests check that it agrees with the
        exact check over every rank (``torchrun_binding``).

        Returns the reason (one sentence naming the dimensions and axes involved and an
        instance that would hold a non-consecutive set of ranks), or None.
        """
        if not self.rules.expert_with_context and layout.ep > 1 and layout.cp > 1:
            return (f"{self.name} builds its expert-parallel groups from consecutive ranks of the flattened "
                    f"(dp_shard, cp) mesh (torchtitan ParallelDims: sparse mesh pp, dp_replicate, efsdp, ep, etp), "
                    f"so EP {layout.ep} with CP {layout.cp} groups other ranks than trnopt's EP groups "
                    "(one cp coordinate each)")
        conflict = placement_conflict(layout, target)
        if conflict is None:
            return None
        per = nproc_per_node(layout, target)
        held = sorted(instance_ranks(layout, target, 0, 0))
        example = ""
        if held != list(range(held[0], held[0] + per)):
            example = (f"the plan puts ranks {', '.join(str(r) for r in held[:6])}, ... on domain 0 instance 0, "
                       f"not one block of {per} consecutive ranks; ")
        return (f"{self.name} (mesh {', '.join(self.rank_order)}, {self.rank_order[-1]} innermost) under torchrun "
                f"gives every instance one block of consecutive ranks, but {example}{conflict}: no node order or "
                "core binding places it")


# Where torchtitan 0.2.2 enforces each rule of TORCHTITAN.rules (paths in pytorch/torchtitan; module docstring)
TORCHTITAN_SOURCES = (
    ("heads", "torchtitan/models/llama3/model/model.py Attention.forward; deepseek_v3/infra/parallelize.py"),
    ("kv_heads", "torchtitan/models/llama3/infra/parallelize.py apply_tp, model/model.py Attention.forward"),
    ("experts", "torchtitan/distributed/expert_parallel.py ExpertTensorParallel"),
    ("shared_experts", "torchtitan/models/llama4/infra/parallelize.py apply_moe_ep_tp, models/moe/moe.py"),
    ("cp", "torchtitan/distributed/parallel_dims.py seq_len_divisor, asserted in "
           "models/llama3/infra/parallelize.py"),
    ("ep", "torchtitan/distributed/expert_parallel.py ExpertParallel._token_dispatch"),
    ("etp", "torchtitan/distributed/parallel_dims.py ParallelDims._validate: ETP is TP or 1; ETP 1 borrows all "
            "of tp (and cp) into EP"),
    ("pp", "torchtitan/distributed/pipeline_parallel.py pipeline_llm, generate_llm_fqn_per_model_part"),
    ("interleave", "torchtitan/distributed/pipeline_parallel.py pipeline_llm, generate_llm_fqn_per_model_part"),
)

TORCHTITAN = FrameworkProfile(
    name="torchtitan",
    version="0.2.2 (TorchTitan Neuron 0.2.2+neuron.1)",
    # FSDP2 fully_shard shards parameters, gradients and optimizer state (ZeRO-3 semantics);
    # HSDP replicates those shards (data_parallel_replicate_degree). DDP (nothing sharded) runs only
    # without TP/PP/CP (torchtitan/models/llama3/infra/parallelize.py), so ZeRO-0/1/2 are not offered.
    zero_stages=(3,),
    # activation_checkpoint.mode none | selective | full; selective is selective_ac_option "op" (trnopt's
    # "op": per-op SAC, torchtitan/distributed/activation_checkpoint.py _apply_op_sac) or "n" for every
    # n-th layer (every-n). Korthikanti et al.'s "selective" is not offered: per-op SAC's policy saves by
    # op type and mm count, never the attention core's inputs alone, and no torchtitan 0.2.2 option
    # recomputes only the attention core.
    recompute=("none", "op", "full", *(f"every-{n}" for n in EVERY_NTH)),
    # parallelism.pipeline_parallel_schedule (default "1F1B"), any name torch.distributed.pipelining's
    # get_schedule_class knows; single-stage schedules run one stage a rank, ZBVZeroBubble and DualPipeV
    # exactly two ("v schedules assume 2 stages per rank"). LoopedBFS, also accepted, is not costed.
    # The zero-bubble ones and DualPipeV split the backward and refuse stages built with torch.compile,
    # which every torchtitan export of trnopt enables (backend "neuron").
    schedules=("1F1B", "Interleaved1F1B", "GPipe"),
    schedule_source="torchtitan/config/job_config.py pipeline_parallel_schedule; "
                    "torchtitan/distributed/pipeline_parallel.py get_schedule_class, _get_stage_indices",
    schedules_refused=tuple((name, "PyTorch's schedule refuses stage modules compiled with torch.compile "
                             "(torch/distributed/pipelining/schedules.py _check_torch_compile_compatibility, "
                             "torch 2.13), and trnopt's torchtitan export compiles with backend \"neuron\"")
                            for name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")),
    hsdp=True,
    rank_order=("pp", "dp_replicate", "dp_shard", "cp", "tp"),
    formats=("torchtitan", "env"),
    rules=Rules(kv_replication=False, seq_split=2, even_expert_shards=True, expert_with_context=False,
                stage_weights=(1, 1)),
    sources=TORCHTITAN_SOURCES,
)

NXD = FrameworkProfile(
    name="nxd",
    version="NeuronX Distributed Training (Neuron SDK 2.29, legacy)",
    zero_stages=(0, 1),                          # distributed_strategy.zero1 (optimizer state sharded over DP)
    recompute=("none", "selective", "full"),     # model.activations_checkpoint_granularity null | selective | full
    schedules=("1F1B", "Interleaved1F1B"),       # virtual_pipeline_model_parallel_size > 1 interleaves
    schedule_source="NxD Training features (\"1F1B pipeline schedule\", \"Interleave pipeline schedule\"); "
                    "distributed_strategy.virtual_pipeline_model_parallel_size",
    spelling=(("Interleaved1F1B", "interleaved 1F1B"),),
    hsdp=False,
    rank_order=("pp", "dp", "tp"),
    formats=("nxd", "env"),
    # GQAQKVColumnParallelLinear replicates K/V kv_size_multiplier times (= tp / kv_heads), charged by the
    # cost model (memory.kv_replica_params); heads still divide by TP
    # experts TP-split like the attention, EP carved out of DP (the export writes expert_model_parallel_size
    # beside tensor_model_parallel_size and no expert-TP degree): no fold over TP
    rules=Rules(kv_replication=True, expert_tp_one=False),
    sources=(("kv_heads", "neuronx_distributed/modules/qkv_linear.py GQAQKVColumnParallelLinear, kv_size_multiplier"),),
)

PROFILES = {p.name: p for p in (TORCHTITAN, NXD)}
DEFAULT = TORCHTITAN.name


def profile(name: str) -> FrameworkProfile:
    """The profile of a --framework name; InputError for an unknown one."""
    if name not in PROFILES:
        raise InputError("--framework", "framework", f"unknown framework {name!r}; one of {', '.join(PROFILES)}")
    return PROFILES[name]


def check_runs(layout: Layout, workload: Workload, name: str | None, source: str) -> None:
    """InputError(source, "framework", the rule) when framework ``name`` cannot run the layout; with no
    name (a layout written without one), the default framework's structural rules only, since such a
    layout's ZeRO stage and recomputation were not chosen for a framework."""
    framework = profile(name or DEFAULT)
    why = framework.supports(layout, workload) if name else framework.rules_broken(layout, workload)
    if why:
        raise InputError(source, "framework", why if name else f"{why}; {DEFAULT} is the default --framework")


# -- the rank order under torchrun --------------------------------------------------------------
def nproc_per_node(layout: Layout, target: Target) -> int:
    return layout.ranks_per_chip * target.chips_per_instance


def torchrun_binding(layout: Layout, target: Target) -> TorchrunBinding | str:
    """The node order and core binding that land every planned rank, or why none exists
    (``placement_conflict``).

    With the rule met, a rank is ``inside + P * outside``: ``inside`` from the digits an
    instance holds, the same on every instance, and ``outside`` from the instance. So instance
    (domain d, position i) holds the ranks ``n * P .. n * P + P - 1``, n the rank of its first
    chip's core 0 divided by P, which becomes its node rank; and local rank ``r - n * P`` is
    bound to the logical core (``chip * cores per chip + core``) that instance 0 gives rank
    ``r - n * P``. Instances and one instance's cores are read, never every rank (the tests
    check every rank of small layouts).
    """
    conflict = placement_conflict(layout, target)
    if conflict is not None:
        return conflict
    per = nproc_per_node(layout, target)
    local = [0] * per
    for core, r in enumerate(instance_ranks(layout, target, 0, 0)):  # by logical core of the instance
        local[r] = core
    node_rank = {}
    for domain in range(layout.domains):
        for instance in range(target.instances_per_domain):
            first_chip = chip_coordinates(layout, instance * target.chips_per_instance)
            node_rank[(domain, instance)] = rank_of(layout, (0, *first_chip, domain)) // per
    return TorchrunBinding(per, node_rank, tuple(local))


def _digits(layout: Layout, target: Target) -> list[tuple[str, str, int, str]]:
    """(dimension, axis name, factor, 'in' | 'out' | 'straddles') of every rank digit in rank order.

    Consecutive digits on one axis (``tp`` on switch3 then ``dp`` on switch24) are one digit of
    their product: together they walk the axis positions in rank order.
    """
    cpi = target.chips_per_instance
    out = []
    stride = [1] * len(layout.axes)
    bounds = instance_prefix(layout.axes, cpi)  # per axis: positions of it that one instance holds
    raw: list[list] = []  # [dimension names, axis index, factor, stride], consecutive digits of one axis merged
    for dim, row in zip(DIMS, layout.placement):
        for j, f in enumerate(row):
            if f == 1:
                continue
            if raw and raw[-1][1] == j:  # the next digit on the same axis: one digit of the product
                raw[-1][0] += f"+{dim}"
                raw[-1][2] *= f
            else:
                raw.append([dim, j, f, stride[j]])
            stride[j] *= f
    for dim, j, f, s in raw:
        b, name = bounds[j], layout.axes[j].name
        if s * f <= b and b % (s * f) == 0:
            out.append((dim, name, f, "in"))
        elif s % b == 0:
            out.append((dim, name, f, "out"))
        elif b % s == 0 and f % (b // s) == 0:
            out.append((dim, name, b // s, "in"))
            out.append((dim, name, f // (b // s), "out"))
        else:
            out.append((dim, name, f, "straddles"))
    return out


def placement_conflict(layout: Layout, target: Target) -> str | None:
    """The structural rule of ``FrameworkProfile.producible`` on the placement rows: None when
    every in-instance digit precedes every instance-changing one, else the first offending pair."""
    first_out = None
    for dim, axis, f, where in _digits(layout, target):
        if where == "straddles":
            return (f"{dim}'s factor {f} on {axis} straddles the {target.chips_per_instance}-chip instance "
                    "boundary")
        if where == "out" and first_out is None:
            first_out = (dim, axis, f)
        elif where == "in" and first_out is not None:
            return (f"{first_out[0]} takes {first_out[2]} on {first_out[1]} (across instances) before {dim} takes "
                    f"{f} on {axis} (inside an instance) in the rank order")
    return None


def check_recompute_modes() -> None:
    """Every profile names only recompute modes the Layout knows (import-time sanity)."""
    for p in PROFILES.values():
        assert set(p.recompute) <= set(RECOMPUTE), p.name
    assert set(PROFILES) == set(FRAMEWORKS), "layout files name the frameworks trnopt has profiles of"


check_recompute_modes()
