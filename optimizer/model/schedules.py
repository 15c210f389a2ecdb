"""Pipeline schedules by name: the one list of the schedules a Layout may run, and which stage
counts each runs (the costs of each are in cost/pipeline.py)."""

from __future__ import annotations

SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""The pipeline schedules trnopt costs (cost/pipeline.py), by the names torch.distributed.pipelining
gives them (torch/distributed/pipelining/schedules.py ``get_schedule_class``; torchtitan's
``parallelism.pipeline_parallel_schedule``). 1F1B and GPipe run one stage a rank (interleave 1); the
V-shaped ZBVZeroBubble and DualPipeV exactly two (interleave 2); the interleaved ones two or more."""
SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")


def default_schedule(interleave: int) -> str:
    """The schedule a layout that names none runs: 1F1B, or with interleaved stages Interleaved1F1B
    (the defaults of torchtitan's and NxD's pipeline code)."""
    return "1F1B" if interleave == 1 else "Interleaved1F1B"


def schedule_problem(schedule: str, interleave: int) -> str | None:
    """What stops ``schedule`` from running ``interleave`` stages a rank; None when it can."""
    if schedule not in SCHEDULES:
        return f"must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
    if schedule in SINGLE_STAGE_SCHEDULES and interleave != 1:
        return f"{schedule} runs one stage a rank, not interleave {interleave}"
    if schedule in V_SCHEDULES and interleave != 2:
        return f"{schedule} runs exactly two stages a rank (V shape): interleave must be 2, got {interleave}"
    if schedule not in SINGLE_STAGE_SCHEDULES + V_SCHEDULES and interleave < 2:
        return f"{schedule} interleaves stages: interleave must be >= 2, got {interleave}"
    return None
