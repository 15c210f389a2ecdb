"""Measuring collective/compute overlap in the simulator: the one place the ratios are computed.

For a fused kernel with T_mm the same matmul without decomposition, T_cc the collective
alone and T_f the fused kernel (DESIGN section 7):

    hidden fraction = 1 - (T_f - T_mm) / T_cc        speedup = (T_mm + T_cc) / T_f

Each kernel module builds its three variants and calls `measure_overlap`; the KernelPlan
and the benchmarks read the resulting `OverlapResult`. T_mm and T_f are kernel times
(`Timeline.total_s`); T_cc is the link time of the collective-alone kernel
(`collective_span`: busy time of its busiest collective engine).
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from trnopt.kernels.sim import TensorSpec, run_ranks


def hidden_fraction(t_mm: float, t_cc: float, t_f: float) -> float:
    """1 - (T_f - T_mm) / T_cc: the share of the collective's time the fused kernel hides."""
    assert t_cc > 0, f"T_cc must be > 0, got {t_cc}"
    return 1.0 - (t_f - t_mm) / t_cc


def speedup(t_mm: float, t_cc: float, t_f: float) -> float:
    """(T_mm + T_cc) / T_f: the fused kernel against running matmul and collective back to back."""
    assert t_f > 0, f"T_f must be > 0, got {t_f}"
    return (t_mm + t_cc) / t_f


@dataclass(frozen=True)
class Variant:
    """One kernel launch: the kernel, one argument tuple per rank, and keyword arguments."""

    kernel: Any
    args_per_rank: Sequence[Sequence[Any]]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OverlapResult:
    """Times in seconds from the simulator's timeline; ``numerics`` False when run without data."""

    t_mm: float
    t_cc: float
    t_f: float
    hidden_fraction: float
    speedup: float
    exposed_comm_f: float
    numerics: bool

    def as_dict(self) -> dict:
        return asdict(self)


def operand(shape: tuple[int, ...], dtype: Any, numerics: bool, seed: int = 0) -> Any:
    """A kernel argument: random data when ``numerics``, else a `TensorSpec` (shape and dtype only)."""
    if not numerics:
        return TensorSpec(tuple(shape), np.dtype(dtype))
    rng = np.random.default_rng(zlib.crc32(repr((shape, seed)).encode()))
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def run_time(v: Variant, *, link: Any, numerics: bool, timeout_s: float) -> Any:
    """Run one variant on all its ranks; returns the simulator's Timeline."""
    res = run_ranks(v.kernel, v.args_per_rank, link=link, numerics=numerics, timeout_s=timeout_s,
                    kwargs=dict(v.kwargs))
    return res.timeline


def collective_span(timeline: Any) -> float:
    """Link time of a collective-alone run: the busiest collective engine ("CC<channel>")
    of any core, in seconds of transfer (hop latencies included).

    Channels run concurrently, so the busiest one bounds the collective. Taking busy time
    rather than wall time keeps out the DMA copies the simulator requires around every
    collective (collectives never touch kernel inputs or outputs), which on this model's
    368 GB/s DMA would otherwise gate a two-channel ring.
    """
    best = 0.0
    for core in timeline.cores:
        for engine, busy in core.busy.items():
            if engine.startswith("CC"):
                best = max(best, busy)
    return best


def measure_overlap(*, mm: Variant, cc: Variant, fused: Variant, link: Any, numerics: bool = False,
                    timeout_s: float = 600.0) -> OverlapResult:
    """Run the three variants with the same link model and compute the overlap ratios."""
    t_mm = run_time(mm, link=link, numerics=numerics, timeout_s=timeout_s)
    t_cc = run_time(cc, link=link, numerics=numerics, timeout_s=timeout_s)
    t_f = run_time(fused, link=link, numerics=numerics, timeout_s=timeout_s)
    a, b, c = t_mm.total_s, collective_span(t_cc), t_f.total_s
    return OverlapResult(t_mm=a, t_cc=b, t_f=c, hidden_fraction=hidden_fraction(a, b, c),
                         speedup=speedup(a, b, c), exposed_comm_f=t_f.exposed_comm_s, numerics=numerics)
