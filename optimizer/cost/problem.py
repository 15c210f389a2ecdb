"""Problem: what the user asks, and the one way from a layout to its Evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.evaluate import Evaluation, evaluate, objective_value
from trnopt.optimizer.cost.overlap import OverlapTable, measured
from trnopt.optimizer.model.layout import RECOMPUTE, Layout
from trnopt.optimizer.model.rules import Rules
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload


@dataclass(frozen=True)
class Problem:
    """A workload on ``domains`` domains of a target, and how layouts are judged."""

    workload: Workload
    """The model and the training run (sequence, global batch, precision)."""
    target: Target
    """One scale-up domain and how domains connect."""
    domains: int = 1
    """Scale-up domains joined by the scale-out network (EFA)."""
    headroom: float = defaults.HEADROOM
    """Share of HBM a plan leaves free."""
    overlap: OverlapTable | Mapping[str, float] = field(default_factory=measured)
    """Share of TP communication the overlap kernels hide: the simulated table by default,
    or a mapping link class -> fraction."""
    objective: str = defaults.OBJECTIVE
    """What the search minimises: "step-time", or "goodput" (step time / goodput)."""
    lnc: tuple[int, ...] | None = None
    """LNC values to search; None: every value the chip allows."""
    zero_stages: tuple[int, ...] = defaults.ZERO_STAGES
    """ZeRO stages to search, e.g. (0, 1) for frameworks with ZeRO-1 only."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Recomputation modes to search (those the framework runs)."""
    interleave: bool = True
    """Whether interleaved pipeline stages may be searched (the framework has the schedule)."""
    hsdp: bool = False
    """Whether HSDP may be searched: the sharded state replicated across the scale-out axis
    (``Layout.dp_replicate``; the framework runs FSDP on a 2-D mesh)."""
    rules: Rules = Rules()
    """The structural rules of the framework that will run the layout (its profile's); the
    search's degree sets and the layouts it enumerates honour them."""
    instance_blocks: bool = False
    """Only placements in which every instance holds one block of consecutive ranks, as
    torchrun numbers them (node_rank * nproc_per_node + local_rank) with a free node order
    and core binding."""

    @property
    def lnc_values(self) -> tuple[int, ...]:
        return self.lnc or self.target.chip.lnc_allowed

    def evaluate(self, layout: Layout) -> Evaluation:
        """Memory, step time, throughput and reliability of ``layout`` on this problem."""
        return evaluate(self.workload, layout, self.target, self.headroom, self.overlap)

    def score(self, evaluation: Evaluation) -> float:
        """The objective's value of an evaluation (seconds)."""
        return objective_value(evaluation, self.objective)
