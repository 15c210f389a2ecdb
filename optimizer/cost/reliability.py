"""Failures and checkpoints: job MTBF, checkpoint time, Young's interval, expected goodput.

A scale-up domain is a failure unit (an UltraServer is scheduled and replaced as one): when any instance fails, the
job stops and restarts from the last checkpoint. With independent failures the job's
MTBF is the instance MTBF over the number of instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnopt.optimizer.model.target import Target


def job_mtbf(instance_mtbf: float, instances: int) -> float:
    """M_job = M_instance / instances (independent, exponentially distributed failures)."""
    return instance_mtbf / instances


def checkpoint_time(checkpoint_bytes: float, bandwidth_per_instance: float, instances: int) -> float:
    """delta = bytes / (per-instance storage bandwidth * instances): every instance writes its shard."""
    return checkpoint_bytes / (bandwidth_per_instance * instances)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974), "A first order approximation to the optimum checkpoint interval": tau = sqrt(2 delta M)."""
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def goodput_fraction(checkpoint_s: float, interval_s: float, mtbf_s: float, restart_s: float) -> float:
    """Useful share of wall time, first order (Daly 2006, "A higher order estimate of the optimum
    checkpoint interval for restart dumps"): 1 - delta/tau - (R + tau/2) / M, floored at 0.

    delta/tau is spent writing checkpoints; each failure (one per M) costs the restart R
    plus, on average, half an interval of lost work.
    """
    return max(0.0, 1 - checkpoint_s / interval_s - (restart_s + interval_s / 2) / mtbf_s)


@dataclass(frozen=True)
class Reliability:
    instances: int
    job_mtbf_s: float
    checkpoint_s: float
    interval_s: float
    goodput: float


def reliability(target: Target, chips: int, checkpoint_bytes: float, writer_chips: int | None = None) -> Reliability:
    """Reliability of a job on ``chips`` chips that checkpoints ``checkpoint_bytes``.

    Every instance counts towards failures; only the instances of ``writer_chips`` write
    the checkpoint (all of them when the state is sharded over data parallelism, one
    replica's otherwise).
    """
    instances = max(1, chips // target.chips_per_instance)
    writers = max(1, math.ceil((writer_chips or chips) / target.chips_per_instance))
    rel = target.reliability
    mtbf = job_mtbf(rel.instance_mtbf_s, instances)
    delta = checkpoint_time(checkpoint_bytes, rel.checkpoint_bandwidth_per_instance, writers)
    tau = young_interval(delta, mtbf)
    return Reliability(instances, mtbf, delta, tau, goodput_fraction(delta, tau, mtbf, rel.restart_s))
