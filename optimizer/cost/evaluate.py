"""The cost model's one entry point: score a layout (memory, step time, throughput, reliability).

Every number trnopt prints about a layout comes from ``evaluate``: the CLI's report, the
brute-force enumerator and the check of the solver's answer all call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from trnopt.optimizer import defaults
from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.cost.memory import Memory, memory_per_chip, usable_hbm
from trnopt.optimizer.cost.reliability import Reliability, reliability
from trnopt.optimizer.cost.steptime import StepTime, model_flops, peak_flops_per_rank, step_time
from trnopt.optimizer.model.target import GIB, Target
from trnopt.optimizer.model.workload import Workload



@dataclass(frozen=True)
class Evaluation:
    layout: Layout
    memory: Memory
    usable_bytes: float
    step: StepTime
    tokens_per_s: float
    mfu: float
    reliability: Reliability

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.usable_bytes

    @property
    def goodput_tokens_per_s(self) -> float:
        return self.tokens_per_s * self.reliability.goodput

    def as_dict(self) -> dict:
        return {
            "memory_gib_per_chip": self.memory.total / GIB,
            "memory_breakdown_gib": self.memory.gib(),
            "usable_gib_per_chip": self.usable_bytes / GIB,
            "fits": self.fits,
            "step_time_s": self.step.total,
            "step_breakdown_s": self.step.as_dict(),
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "job_mtbf_h": self.reliability.job_mtbf_s / 3600,
            "checkpoint_s": self.reliability.checkpoint_s,
            "checkpoint_interval_min": self.reliability.interval_s / 60,
            "goodput": self.reliability.goodput,
            "goodput_tokens_per_s": self.goodput_tokens_per_s,
        }


def checkpoint_bytes(workload: Workload) -> float:
    """A checkpoint holds weights, master copy and optimizer state: (2 + 4 + 8) bytes per parameter."""
    tr = workload.training
    return workload.model.total_params() * (tr.weight_bytes + tr.master_bytes + tr.optimizer_bytes)


def evaluate(workload: Workload, layout: Layout, target: Target, headroom: float = defaults.HEADROOM,
             overlap: Mapping[str, float] | None = None) -> Evaluation:
    """Memory, step time, tokens/s, MFU and reliability of one layout (an uneven split's: its step
    and its fullest stage's memory, cost/stages.py)."""
    if layout.stage_layers:
        from trnopt.optimizer.cost.stages import split_memory, stage_costs
        costs = stage_costs(workload, replace(layout, stage_layers=()), target, headroom, overlap)
        step = replace(step_time(workload, layout, target, overlap),
                       stage_split=costs.step(layout.stage_layers) - costs.even_step)
        memory = split_memory(costs, layout.stage_layers)
    else:
        step, memory = step_time(workload, layout, target, overlap), memory_per_chip(workload, layout, target)
    tokens_per_s = workload.training.tokens / step.total
    mfu = model_flops(workload) / (step.total * layout.ranks * peak_flops_per_rank(target, layout.lnc))
    return Evaluation(layout, memory, usable_hbm(target, headroom), step,
                      tokens_per_s, mfu, reliability(target, layout.chips, checkpoint_bytes(workload),
                                                     checkpoint_writer_chips(layout)))


def checkpoint_writer_chips(layout: Layout) -> int:
    """Chips that write a checkpoint: all with ZeRO >= 1 (the state is sharded over DP), else one DP replica's."""
    return layout.chips if layout.zero >= 1 else max(1, layout.chips // layout.dp)


def inverse_goodput(workload: Workload, target: Target, chips: int) -> f.Factor:
    """1 / goodput by (ZeRO stage, dp): checkpoints are written by every chip when the state is
    sharded over DP, by one replica's chips otherwise (``checkpoint_writer_chips``)."""
    ckpt = checkpoint_bytes(workload)

    def inverse(zero: int, dp: int) -> float:
        writers = chips if zero >= 1 else max(1, chips // dp)
        return 1 / max(reliability(target, chips, ckpt, writers).goodput, 1e-9)
    return f.table(("zero", "dp"), inverse, "inverse_goodput")


def objective_value(evaluation: Evaluation, objective: str) -> float:
    """What the search minimises: step seconds, or seconds per step of useful work (step / goodput)."""
    if objective == "goodput":
        return evaluation.step.total / max(evaluation.reliability.goodput, 1e-9)
    return evaluation.step.total
