"""Layout: the parallel degrees, the memory plan and the placement of every dimension on the axes.

Ranks are logical NeuronCores (Neuron LNC docs: 64 per trn2 instance at LNC=2). Rank
order, innermost first, is tp, cp, ep, dp, pp (Megatron's order). Expert parallelism
is carved out of data parallelism, as in Megatron-Core and DeepSpeed-MoE: the ``ep``
ranks of a DP group hold different experts, and ``dp // ep`` replicas remain. With
expert-TP 1 (``etp=1``) the EP group also folds over the TP ranks: the MoE layers see the
tp x dp ranks as etp x ep x edp (Liu et al., "MoE Parallel Folding", 2025, arXiv
2504.14960, section 3; torchtitan/distributed/parallel_dims.py: ETP is TP or 1, and with
ETP 1 "EP would borrow all cp and tp and some dp_shard degree"). Then ``ep = tp x ep_dp``,
the ``ep`` placement row places the ep_dp ranks taken from DP and the ``dp`` row the
``dp // ep_dp`` expert replicas. The placement gives, for every dimension, the factor of every physical axis it occupies;
within one axis the dimensions nest in rank order. From that the rank-to-chip map
follows (``rank_coordinates``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.rules import Rules, seq_problem, tp_problems
from trnopt.optimizer.model.schedules import default_schedule, schedule_problem
from trnopt.optimizer.model.target import Axis
from trnopt.optimizer.model.workload import Workload

DIMS = ("tp", "cp", "ep", "dp", "pp")
EVERY_NTH = (2, 4)
"""n of the "every-n" recompute modes: every n-th layer of a stage recomputed in full, the
others not (torchtitan's activation_checkpoint mode "selective" with selective_ac_option "n":
torchtitan/distributed/activation_checkpoint.py wraps the i-th block when i % n == 0)."""
RECOMPUTE = ("none", "selective", "op", "mlp", "full") + tuple(f"every-{n}" for n in EVERY_NTH)
"""Per-layer recompute modes: "selective" is Korthikanti et al.'s (2022) attention-core recompute
(NxD, Megatron); "op" is torchtitan's per-op selective checkpointing (activation_checkpoint mode
"selective", selective_ac_option "op"), which saves every second matmul's output and the attention
kernel's (cost/memory.py ``op_sac_bytes``, cost/compute.py ``LayerTime.op_repeat``)."""
def every_nth(recompute: str) -> int:
    """n of an "every-n" recompute mode; 0 for the others."""
    return int(recompute[len("every-"):]) if recompute.startswith("every-") else 0


def recompute_mix(recompute: str) -> tuple[tuple[str, float], ...]:
    """(per-layer mode, share of the stage's layers) of a recompute mode: one mode for all
    layers, or for "every-n" full on 1/n of them and none on the rest."""
    n = every_nth(recompute)
    return (("full", 1 / n), ("none", 1 - 1 / n)) if n else ((recompute, 1.0),)


def full_layers(recompute: str, layers: int) -> int:
    """Of a stage's ``layers``, how many recompute their whole forward."""
    n = every_nth(recompute)
    return layers // n if n else (layers if recompute == "full" else 0)


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout on a concrete set of physical axes.

    ``placement[i][j]`` is the factor of axis ``axes[j]`` that dimension ``DIMS[i]``
    occupies; the ``dp`` row places the ``dp // ep`` expert replicas.
    """

    tp: int
    pp: int
    dp: int
    axes: tuple[Axis, ...]
    placement: tuple[tuple[int, ...], ...]
    ep: int = 1
    cp: int = 1
    zero: int = 1
    recompute: str = "selective"
    micro_batch: int = 1
    interleave: int = 1
    lnc: int = 2
    dp_replicate: int = 1
    """HSDP: replicas of the sharded state (torchtitan's data_parallel_replicate_degree). The
    ZeRO/FSDP shards span dp_shard = dp // dp_replicate ranks; 1 shards over all of dp. trnopt
    replicates across the scale-out network only: dp_replicate is 1 or dp's factor on the
    scale-out axis (the shards stay inside a domain, on its fast links; the replicas
    exchange one shard's gradients over EFA), without expert parallelism."""
    schedule: str = ""
    """The pipeline schedule (one of SCHEDULES) when it is not ``default_schedule(interleave)``; ""
    for that default (a layout given its default by name holds "", so that equal plans compare
    equal and ``replace(layout, interleave=...)`` keeps the default). ``pipeline_schedule`` names it."""
    etp: int | None = None
    """Expert TP: the ranks one routed expert's FFN is split over; None: tp (Megatron-Core's
    default expert_tensor_parallel_size). 1 with tp > 1 folds the EP group over the TP ranks
    (module docstring): ep must then be a multiple of tp."""
    stage_layers: tuple[int, ...] = ()
    """Layers of each pipeline stage, first to last, when the split is uneven (cost/stages.py); ()
    for the even split, ceil(layers / pp) on the busiest stage."""

    def __post_init__(self):
        def bad(key: str, rule: str):
            raise InputError("layout", key, rule)

        if self.schedule == default_schedule(self.interleave):
            object.__setattr__(self, "schedule", "")

        for name in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave"):
            if getattr(self, name) < 1:
                bad(name, f"must be >= 1, got {getattr(self, name)}")
        if self.etp is not None and self.etp not in (1, self.tp):
            bad("etp", f"expert TP must be 1 or tp={self.tp}, got {self.etp} (torchtitan/distributed/"
                "parallel_dims.py: \"Currently we only support ETP=TP or ETP=1\")")
        if self.ep_fold > 1 and self.cp > 1:
            bad("etp", "expert TP 1 folds EP over the TP ranks; with cp > 1 that fold is not modelled")
        if self.ep % self.ep_fold or self.dp % self.ep_dp:
            bad("ep", f"expert parallelism {self.ep} must be " + (
                f"a multiple of tp={self.tp} (expert TP 1 folds EP over the TP ranks) and ep / tp = "
                f"{self.ep / self.tp:g} must divide data parallelism {self.dp}" if self.ep_fold > 1 else
                f"a divisor of data parallelism {self.dp} (experts are spread over the DP ranks; with etp=1 "
                "EP folds over tp x dp)"))
        if self.dp_replicate < 1 or (self.dp // self.ep_dp) % self.dp_replicate:
            bad("dp_replicate", f"must be >= 1 and divide the expert replicas {self.dp // self.ep_dp}, "
                f"got {self.dp_replicate}")
        if self.dp_replicate > 1 and self.zero == 0:
            bad("dp_replicate", "HSDP replicates sharded state: it needs ZeRO >= 1")
        if self.dp_replicate > 1 and self.ep > 1:
            bad("dp_replicate", "HSDP with expert parallelism is not modelled: dp_replicate must be 1 when ep > 1")
        if self.zero not in (0, 1, 2, 3):
            bad("zero", f"must be 0, 1, 2 or 3, got {self.zero}")
        if self.recompute not in RECOMPUTE:
            bad("recompute", f"must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.interleave > 1 and self.pp == 1:
            bad("interleave", "interleaved stages need pp > 1")
        if why := schedule_problem(self.pipeline_schedule, self.interleave):
            bad("schedule", why)
        if self.stage_layers and (len(self.stage_layers) != self.pp or self.interleave != 1
                                  or min(self.stage_layers) < 1):
            bad("stage_layers", f"needs pp={self.pp} stages of at least one layer, one stage a rank (interleave 1), "
                f"got {','.join(map(str, self.stage_layers))}")
        ranks = math.prod(a.size for a in self.axes)
        product = self.tp * self.cp * self.dp * self.pp
        if product != ranks:
            shape = " x ".join(f"{a.name}{a.size}" for a in self.axes)
            bad("degrees", f"tp*cp*dp*pp = {self.tp}*{self.cp}*{self.dp}*{self.pp} = {product} "
                f"but the machine has {ranks} ranks ({shape}, logical cores at LNC={self.lnc})")
        if len(self.placement) != len(DIMS) or any(len(row) != len(self.axes) for row in self.placement):
            bad("placement", f"needs {len(DIMS)} rows of {len(self.axes)} factors")
        for j, axis in enumerate(self.axes):
            used = math.prod(row[j] for row in self.placement)
            if used != axis.size:
                bad("placement", f"the factors on axis {axis.name} multiply to {used}, not its size {axis.size}")
        for dim, row in zip(DIMS, self.placement):
            if math.prod(row) != self.placement_degree(dim):
                bad("placement", f"{dim} occupies {'*'.join(map(str, row))} = {math.prod(row)} ranks "
                    f"but its degree is {self.placement_degree(dim)}")
        if self.dp_replicate > 1 and self.dp_replicate != hsdp_replicas(self.span("dp")):
            bad("dp_replicate", f"HSDP replicates across the scale-out network: dp_replicate must be 1 or dp's factor "
                f"on the scale-out axis ({hsdp_replicas(self.span('dp'))}), got {self.dp_replicate}")

    @property
    def pipeline_schedule(self) -> str:
        """The pipeline schedule the layout runs (one of SCHEDULES)."""
        return self.schedule or default_schedule(self.interleave)

    @property
    def expert_tp(self) -> int:
        """Ranks one routed expert's FFN is split over (etp, or tp when not given)."""
        return self.tp if self.etp is None else self.etp

    @property
    def ep_fold(self) -> int:
        """TP ranks the EP group folds over: tp / expert TP (1 when experts follow TP)."""
        return self.tp // self.expert_tp

    @property
    def ep_dp(self) -> int:
        """EP ranks taken from data parallelism: ep / ep_fold (the ``ep`` placement row's degree)."""
        return max(1, self.ep // self.ep_fold)

    @property
    def edp(self) -> int:
        """Expert data parallelism: the replicas of each expert, dp / ep_dp."""
        return self.dp // self.ep_dp

    def ep_span(self) -> tuple[tuple[Axis, int], ...]:
        """The axes one EP group spans: its ``ep`` row, and with expert TP 1 the TP row too."""
        return self.span("tp", "ep") if self.ep_fold > 1 else self.span("ep")

    @property
    def dp_shard(self) -> int:
        """Ranks one ZeRO/FSDP shard group spans (torchtitan's data_parallel_shard_degree)."""
        return self.dp // self.dp_replicate

    def degree(self, dim: str) -> int:
        return getattr(self, dim)

    def placement_degree(self, dim: str) -> int:
        """Ranks a placement row spans: the degree, except ep's row, which holds the ep_dp ranks taken
        from DP, and dp's, which holds the dp // ep_dp expert replicas."""
        return {"ep": self.ep_dp, "dp": self.edp}.get(dim) or getattr(self, dim)

    def span(self, *dims: str) -> tuple[tuple[Axis, int], ...]:
        """The axes (with factors > 1) that one group of the given dimensions spans."""
        rows = [self.placement[DIMS.index(d)] for d in dims]
        out = []
        for j, axis in enumerate(self.axes):
            factor = math.prod(r[j] for r in rows)
            if factor > 1:
                out.append((axis, factor))
        return tuple(out)

    @property
    def ranks(self) -> int:
        return math.prod(a.size for a in self.axes)

    @property
    def ranks_per_chip(self) -> int:
        return self.axes[0].size

    @property
    def chips(self) -> int:
        return self.ranks // self.ranks_per_chip

    @property
    def domains(self) -> int:
        return self.axes[-1].size

    def micro_batches(self, workload: Workload) -> int:
        return workload.training.global_batch // (self.dp * self.micro_batch)

    def rank_coordinates(self, rank: int) -> tuple[dict[str, int], tuple[int, ...]]:
        """(coordinate per dimension, coordinate per axis) of one rank.

        The rank is split into dimension coordinates, tp fastest; each dimension's
        coordinate into per-axis digits, fastest axis first; on each axis the digits of
        the dimensions nest in rank order (tp innermost).
        """
        dims, rest = {}, rank
        for d in DIMS:
            n = self.placement_degree(d)
            dims[d], rest = rest % n, rest // n
        axis_coord = [0] * len(self.axes)
        axis_stride = [1] * len(self.axes)
        for i, d in enumerate(DIMS):
            value = dims[d]
            for j in range(len(self.axes)):
                f = self.placement[i][j]
                digit, value = value % f, value // f
                axis_coord[j] += digit * axis_stride[j]
                axis_stride[j] *= f
        return dims, tuple(axis_coord)

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        if self.ep > 1:
            parts.append(f"EP{self.ep}" + (f" (expert TP {self.expert_tp})" if self.etp is not None else ""))
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        # with one data-parallel rank ZeRO has nothing to shard over: naming a stage would claim sharding
        zero = ("no ZeRO sharding (DP1)" if self.dp == 1 else f"ZeRO-{self.zero}") + (
            f" (HSDP: {self.dp_replicate} replicas of {self.dp_shard}-way shards)" if self.dp_replicate > 1 else "")
        plan = f"{zero}, {self.recompute} recompute, micro-batch {self.micro_batch}"
        if self.interleave > 1:
            plan += f", {self.interleave} interleaved stages"
        if self.pp > 1 and self.schedule:
            plan += f", {self.schedule} schedule"
        if self.stage_layers:
            plan += f", layers per stage {','.join(map(str, self.stage_layers))}"
        # LNC is a Neuron runtime setting (NEURON_LOGICAL_NC_CONFIG); a GPU has no such knob
        if self.axes[0].collectives == "neuron":
            plan += f", LNC={self.lnc}"
        return f"{' x '.join(parts)} ({plan})"

    def placement_text(self) -> str:
        rows = []
        for dim, row in zip(DIMS, self.placement):
            spans = [f"{a.name}{f}" for a, f in zip(self.axes, row) if f > 1]
            if spans:
                rows.append(f"{dim}: {' '.join(spans)}")
        return "; ".join(rows)

    def workload_problems(self, workload: Workload, rules: Rules = Rules()) -> list[tuple[str, str]]:
        """(key, rule) of every rule that ties the layout to the model (and, by ``rules``, to what a
        framework's code accepts); empty when it can run it."""
        m, t, out = workload.model, workload.training, []
        out += [("tp", rule) for _, rule in tp_problems(m, self.tp, rules)]
        if not rules.stages_ok(m.layers, self.pp, self.interleave):
            out.append(("interleave" if self.interleave > 1 else "pp",
                        f"pp*interleave={self.pp * self.interleave} pipeline stages cannot be made of the {m.layers} "
                        "layers" + (f" (the embedding and the output count as {rules.stage_weights[0]} and "
                                    f"{rules.stage_weights[1]} layers)" if rules.stage_weights else "")))
        if m.moe is None and self.ep > 1:
            out.append(("ep", f"ep={self.ep} on a dense model"))
        if self.ep_fold > 1 and not rules.expert_tp_one:
            out.append(("etp", f"etp=1 with tp={self.tp}: the framework's experts follow TP (expert TP = TP)"))
        if m.moe is not None and m.moe.experts % self.ep:
            out.append(("ep", f"ep={self.ep} must divide the {m.moe.experts} routed experts"))
        if self.ep > 1 and self.cp > 1 and not rules.expert_with_context:
            out.append(("ep", f"ep={self.ep} with cp={self.cp}: the framework's expert groups would take context "
                        "ranks (torchtitan/distributed/parallel_dims.py, sparse mesh pp, dp_replicate, efsdp, ep, "
                        "etp)"))
        if split := seq_problem(t.seq, self.tp, self.cp, rules):
            out.append(("cp", split))
        if t.global_batch % (self.dp * self.micro_batch):
            out.append(("dp", f"dp*micro_batch={self.dp}*{self.micro_batch} must divide the global batch "
                        f"{t.global_batch}"))
        elif self.interleave > 1 and self.micro_batches(workload) % self.pp:
            out.append(("interleave", "interleaved 1F1B needs the micro-batch count to be a multiple of pp"))
        if self.stage_layers and sum(self.stage_layers) != m.layers:
            out.append(("stage_layers", f"the layers per stage add up to {sum(self.stage_layers)}, {m.name} has "
                        f"{m.layers}"))
        elif self.stage_layers and m.moe is not None and m.moe.dense_layers:
            out.append(("stage_layers", f"{m.name} mixes dense and MoE layers; uneven stages are modelled for "
                        "models whose layers are all alike"))
        n, stage = every_nth(self.recompute), math.ceil(m.layers / self.pp)
        if n and stage % n:
            out.append(("recompute", f"recompute {self.recompute} needs {n} to divide the {stage} layers of a "
                        "pipeline stage"))
        return out


def default_placement(axes: tuple[Axis, ...], degrees: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """Fill axes fastest first with tp, then cp, ep, dp, pp: TP lands on the fastest links.

    Each dimension takes the largest factor of the current axis that divides what it
    still needs; raises InputError when the degrees do not tile the axes.
    """
    free = [a.size for a in axes]
    rows = []
    for dim in DIMS:
        need, row = degrees.get(dim, 1), []
        for j in range(len(axes)):
            f = math.gcd(need, free[j])
            row.append(f)
            need //= f
            free[j] //= f
        if need != 1:
            raise InputError("layout", dim, f"degree {degrees.get(dim, 1)} does not tile the axes "
                             f"{', '.join(f'{a.name}{a.size}' for a in axes)} after the faster dimensions")
        rows.append(tuple(row))
    return tuple(rows)


def parse_placement(text: str, axes: tuple[Axis, ...], source: str = "--placement") -> tuple[tuple[int, ...], ...]:
    """Placement rows from text such as ``tp=core4,x4,y4;pp=ring4;dp=efa2``.

    Dimensions are separated by ";", each dimension's factors by ","; a factor is an axis
    name followed by how many of that axis's positions the dimension takes. The ``dp``
    entry places the dp // ep expert replicas (as ``Layout.placement`` does). Dimensions
    and axes not named take a factor of 1; a dimension has one entry, an axis appears once
    in it, and factors are ASCII digits. Raises InputError naming the part that breaks
    a rule; whether the rows tile the axes is checked by ``Layout`` itself.
    """
    names = {a.name: j for j, a in enumerate(axes)}
    rows = {d: [1] * len(axes) for d in DIMS}
    seen: dict[str, str] = {}  # dimension -> its entry, to refuse a second entry
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        dim, eq, factors = part.partition("=")
        dim = dim.strip()
        if not eq or dim not in DIMS:
            raise InputError(source, part, f"expected DIM=AXIS<factor>,... with DIM one of {', '.join(DIMS)}")
        if dim in seen:
            raise InputError(source, part, f"{dim} is given twice ({seen[dim]!r} and {part!r}); give all of its "
                             f"factors in one entry, e.g. {dim}=core4,x2")
        seen[dim] = part
        named: set[str] = set()
        for item in (f.strip() for f in factors.split(",")):
            # ASCII digits only: int() would also read '٤' or '４' as 4
            match = re.fullmatch(r"([A-Za-z_]+?)([0-9]+)", item, flags=re.ASCII)
            if match is None or match.group(1) not in names:
                raise InputError(source, f"{dim}={item}", "expected an axis name and a factor in ASCII digits, "
                                 "e.g. x4; axes are " + ", ".join(f"{a.name}{a.size}" for a in axes))
            axis = match.group(1)
            if axis in named:
                raise InputError(source, f"{dim}={item}", f"axis {axis} is named twice in {dim}; name each "
                                 "axis once with the dimension's whole factor on it")
            named.add(axis)
            j, factor = names[axis], int(match.group(2))
            if factor < 1 or axes[j].size % factor:
                raise InputError(source, f"{dim}={item}", f"the factor must divide the axis size {axes[j].size}")
            rows[dim][j] = factor
    return tuple(tuple(rows[d]) for d in DIMS)


def hsdp_spans(span: tuple[tuple[Axis, int], ...]) -> tuple[tuple[tuple[Axis, int], ...], tuple[tuple[Axis, int], ...]]:
    """(shard group, replica group) of an HSDP data-parallel span: the shard is the span inside
    a domain, the replicas its scale-out factor (torchtitan's mesh puts dp_replicate outside
    dp_shard, so the replicas are the slower digits)."""
    return (tuple((a, n) for a, n in span if a.kind != "scale_out"),
            tuple((a, n) for a, n in span if a.kind == "scale_out"))


def hsdp_replicas(span: tuple[tuple[Axis, int], ...]) -> int:
    """dp_replicate of an HSDP layout whose data-parallel group spans ``span``."""
    return math.prod(n for _, n in hsdp_spans(span)[1])
