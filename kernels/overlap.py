"""The overlap harness: a registry of overlap kernels and one timer that measures any of them.

Every entry names its fused kernel, the collective alone, the undecomposed matmul and the
NumPy reference, and builds their per-rank operands for a shape. `measure` runs the
three in the simulator with the same link model and returns, with T_mm the baseline
matmul's kernel time, T_cc the collective's link time and T_f the fused kernel's time
(the overlap-efficiency ratios of ByteDance Flux, arXiv:2406.06858, section 5):

    hidden fraction = 1 - (T_f - T_mm) / T_cc        speedup = (T_mm + T_cc) / T_f

With ``numerics=True`` the fused kernel runs with data and each rank's output is compared
with the reference (`agreement`: the per-dtype tolerance of `TOLERANCE`).

    from trnopt.kernels.overlap import REGISTRY, measure
    r = measure("allgather_matmul", {"m": 8192, "k": 16384, "n": 512}, tp=32,
                link=LinkModel(256e9, 1.5e-6), channels=2)
    r.hidden_fraction, r.speedup

The benchmarks (kernel_overlap, overlap_table, kernel_device), the kernel plan and the
`trnopt kernels` command measure through this module; nothing else wires kernels to the
simulator.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np

from trnopt.kernels import references as ref
from trnopt.kernels.sim import DEFAULT_LINK, TensorSpec, run_ranks
from trnopt.kernels.tiling import SBUF_TRN2

BF16 = np.dtype(ml_dtypes.bfloat16)
#: Relative tolerance per dtype, against the scale of the expected tensor (tests/kernels/conftest.py).
TOLERANCE = {BF16: 2e-2, np.dtype(np.float32): 1e-5}


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
class Launches:
    """The three launches of one measurement and the expected fused output per rank (numerics)."""

    mm: Variant
    cc: Variant
    fused: Variant
    expected: Callable[[], list[Any]]


@dataclass(frozen=True)
class OverlapKernel:
    """A registry entry. ``build(shape, ring, dtype, numerics, seed, kwargs)`` makes the launches:
    ``ring`` the simulator rank ids in ring order, ``kwargs`` the keyword arguments every
    kernel of the entry gets (groups, channels, sbuf_bytes, ...)."""

    name: str
    fused: Any
    collective: Any
    baseline: Any
    reference: Callable[..., Any]
    shape_keys: tuple[str, ...]
    build: Callable[..., Launches]
    collective_kwargs: tuple[str, ...] = ("groups", "channels")


@dataclass(frozen=True)
class OverlapResult:
    """Times in seconds from the simulator's timeline; ``max_err`` (relative to the
    reference's scale) and ``ok`` when run with data, else None."""

    kernel: str
    tp: int
    channels: int
    shape: Mapping[str, int]
    t_mm: float
    t_cc: float
    t_f: float
    hidden_fraction: float
    speedup: float
    exposed_comm_f: float
    cc_window: tuple[float, float]  #: the fused run's `collective_window`
    numerics: bool
    ok: bool | None = None
    max_err: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def overrun(self) -> tuple[float, float, float]:
        """T_f - T_cc in three parts, cut at the fused run's collectives ((s, e) = ``cc_window``):

            before = s              the first transfer waits for what it sends (loads,
                                    or a first partial sum)
            beyond = e - s - T_cc   the transfers' span past the collective alone (hop
                                    latencies of split transfers, waits for the matmul,
                                    the DMA bandwidth shared with its loads)
            after  = T_f - e        the matmul of the last rows to arrive, and its stores

        so hidden fraction = (T_mm - before - beyond - after) / T_cc, from
        1 - (T_f - T_mm) / T_cc."""
        s, e = self.cc_window
        return s, e - s - self.t_cc, self.t_f - e


def operand(shape: tuple[int, ...], dtype: Any, numerics: bool, seed: int = 0) -> Any:
    """A kernel argument: random data when ``numerics``, else a `TensorSpec` (shape and dtype only)."""
    if not numerics:
        return TensorSpec(tuple(shape), np.dtype(dtype))
    rng = np.random.default_rng(zlib.crc32(repr((shape, seed)).encode()))
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def collective_span(timeline: Any) -> float:
    """Link time of a collective-alone run: the busiest collective engine ("CC<channel>")
    of any core, in seconds of transfer (hop latencies and the DMA share included).

    Channels run concurrently, so the busiest one bounds the collective. Busy time rather
    than wall time keeps out the DMA copies around every collective (collectives never
    touch kernel inputs or outputs)."""
    best = 0.0
    for core in timeline.cores:
        for engine, busy in core.busy.items():
            if engine.startswith("CC"):
                best = max(best, busy)
    return best


def collective_window(timeline: Any) -> tuple[float, float]:
    """(start of the first, end of the last) collective transfer of a run: the busy
    intervals of every collective engine ("CC<channel>") on every core, in seconds;
    (0, 0) when the run has none."""
    spans = [iv for core in timeline.cores for engine, ivs in core.intervals.items() if engine.startswith("CC")
             for iv in ivs]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0.0, 0.0)


@dataclass(frozen=True)
class Agreement:
    """How one output compares with its reference (`agreement`)."""

    ok: bool  #: every element within the tolerance
    rel: float  #: max |actual - expected| / max |expected| (inf where a value is not finite)
    off: int  #: elements outside the tolerance (or not finite)
    mismatch: str = ""  #: "(got) != expected (want)" where the shapes differ (nothing else compared)

    def __str__(self) -> str:
        if self.mismatch:
            return f"shape {self.mismatch}"
        if self.ok:
            return f"max |err|/scale {self.rel:.1e}"
        return f"{self.off} elements off (max |err|/scale {self.rel:.2e})"


def agreement(actual: Any, expected: Any, dtype: Any) -> Agreement:
    """An element passes when |a - e| <= rtol (|e| + max|e|), rtol = ``TOLERANCE[dtype]``:
    relative to the element, with a floor of rtol times the tensor's scale for elements
    near zero (where a rounded sum's error is set by its largest terms)."""
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return Agreement(False, float("inf"), max(a.size, e.size), f"{a.shape} != expected {e.shape}")
    finite = np.isfinite(a)
    if not np.all(finite):
        return Agreement(False, float("inf"), int(np.count_nonzero(~finite)))
    rtol = TOLERANCE[np.dtype(dtype)]
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    err = np.abs(a - e)
    off = int(np.count_nonzero(err > rtol * (np.abs(e) + scale)))
    return Agreement(off == 0, float(err.max() / scale) if scale else float(err.max(initial=0.0)), off)


def _flat(x: Any) -> list[Any]:
    return [v for y in x for v in _flat(y)] if isinstance(x, (tuple, list)) else [x]


# --- registry entries ---------------------------------------------------------------------------
def _tp_operands(ring, k, rows, n, dtype, numerics, seed):
    tp = len(ring)
    x = [operand((k, rows), dtype, numerics, seed=seed + p) for p in range(tp)]
    w = [operand((k, n), dtype, numerics, seed=seed + 1000 + p) for p in range(tp)]
    pos = {r: i for i, r in enumerate(ring)}
    return x, w, [pos[i] for i in range(tp)]


def _build_allgather(shape, ring, dtype, numerics, seed, kw) -> Launches:
    from trnopt.kernels.allgather_matmul import allgather_matmul, allgather_ring
    from trnopt.kernels.tiling import matmul
    m, k, n = shape["m"], shape["k"], shape["n"]
    tp = len(ring)
    assert m % tp == 0, f"allgather_matmul: m={m} must be divisible by tp={tp}"
    x, w, at = _tp_operands(ring, k, m // tp, n, dtype, numerics, seed)
    # the collective alone runs the ring schedule the fused kernel plans for this weight
    cc_kw = {**{key: kw[key] for key in ("groups", "channels", "sbuf_bytes")}, "n": n,
             "both_ways": kw.get("both_ways")}
    return Launches(
        mm=Variant(matmul, [(operand((k, m), dtype, numerics, seed=seed), w[0])], {"sbuf_bytes": kw["sbuf_bytes"]}),
        cc=Variant(allgather_ring, [(x[p],) for p in at], cc_kw),
        fused=Variant(allgather_matmul, [(x[p], w[p]) for p in at], kw),
        expected=lambda: [ref.allgather_matmul_reference(x, w[p]) for p in at])


def _build_reduce_scatter(shape, ring, dtype, numerics, seed, kw) -> Launches:
    from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter, reduce_scatter_ring
    from trnopt.kernels.tiling import matmul
    m, k, n = shape["m"], shape["k"], shape["n"]
    tp = len(ring)
    assert m % tp == 0, f"matmul_reduce_scatter: m={m} must be divisible by tp={tp}"
    x, w, at = _tp_operands(ring, k, m, n, dtype, numerics, seed)
    # the collective alone runs the ring schedule the fused kernel plans for this weight
    cc_kw = {**{key: kw[key] for key in ("groups", "channels", "sbuf_bytes")}, "k": k,
             "both_ways": kw.get("both_ways")}
    partial = [operand((m, n), dtype, numerics, seed=seed + 50 + p) for p in range(tp)]

    def expected():
        out = ref.matmul_reduce_scatter_reference(x, w)
        return [out[p] for p in at]
    return Launches(
        mm=Variant(matmul, [(x[0], w[0])], {"sbuf_bytes": kw["sbuf_bytes"], "split": "cols"}),
        cc=Variant(reduce_scatter_ring, [(partial[p],) for p in at], cc_kw),
        fused=Variant(matmul_reduce_scatter, [(x[p], w[p]) for p in at], kw),
        expected=expected)


def _build_expert(shape, ring, dtype, numerics, seed, kw) -> Launches:
    from trnopt.kernels.alltoall_expert_matmul import (alltoall_expert_matmul, expert_alltoall,
                                                       grouped_expert_matmul)
    from trnopt.kernels.routing import capacity_slots
    ep = len(ring)
    tokens, h, f = shape["tokens"], shape["h"], shape["f"]
    el, n_sub = shape.get("e_local", 1), shape.get("n_sub", 4)
    cap = capacity_slots(tokens, ep * el, n_sub, shape.get("capacity_pct", 100) / 100)
    c = cap // n_sub
    xs = (n_sub, ep, el, h, c)
    pos = {r: i for i, r in enumerate(ring)}
    at = [pos[i] for i in range(ep)]
    x = [operand(xs, dtype, numerics, seed=seed + p) for p in range(ep)]
    w = [operand((el, h, f), dtype, numerics, seed=seed + 1000 + p) for p in range(ep)]
    cc_args = [(operand((1, ep, el, h, cap), dtype, numerics, seed=seed + p),
                operand((1, ep, el, cap, f), dtype, numerics, seed=seed + 50 + p)) for p in at]
    cc_kw = {key: kw[key] for key in ("groups", "channels")}

    def expected():
        out = ref.alltoall_expert_matmul_reference(x, w)
        return [out[p] for p in at]
    return Launches(
        mm=Variant(grouped_expert_matmul, [(x[0], w[0])], {"sbuf_bytes": kw["sbuf_bytes"]}),
        cc=Variant(expert_alltoall, cc_args, cc_kw),
        fused=Variant(alltoall_expert_matmul, [(x[p], w[p]) for p in at], kw),
        expected=expected)


def _registry() -> dict[str, OverlapKernel]:
    from trnopt.kernels import allgather_matmul as ag
    from trnopt.kernels import alltoall_expert_matmul as a2a
    from trnopt.kernels import matmul_reduce_scatter as rs
    from trnopt.kernels.tiling import matmul
    return {e.name: e for e in (
        OverlapKernel("allgather_matmul", ag.allgather_matmul, ag.allgather_ring, matmul,
                      ref.allgather_matmul_reference, ("m", "k", "n"), _build_allgather),
        OverlapKernel("matmul_reduce_scatter", rs.matmul_reduce_scatter, rs.reduce_scatter_ring, matmul,
                      ref.matmul_reduce_scatter_reference, ("m", "k", "n"), _build_reduce_scatter),
        OverlapKernel("alltoall_expert_matmul", a2a.alltoall_expert_matmul, a2a.expert_alltoall,
                      a2a.grouped_expert_matmul, ref.alltoall_expert_matmul_reference,
                      ("tokens", "h", "f", "e_local", "n_sub"), _build_expert),
    )}


class _Registry(Mapping):
    """Kernel name -> `OverlapKernel`, built on first use (the kernel modules import this one)."""

    _entries: dict[str, OverlapKernel] | None = None

    def _get(self) -> dict[str, OverlapKernel]:
        if self._entries is None:
            type(self)._entries = _registry()
        return self._entries  # type: ignore[return-value]

    def __getitem__(self, key: str) -> OverlapKernel:
        try:
            return self._get()[key]
        except KeyError:
            raise KeyError(f"no overlap kernel {key!r}; known: {sorted(self._get())}") from None

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


REGISTRY: Mapping[str, OverlapKernel] = _Registry()


def baseline(kernel: str, shape: Mapping[str, int], *, lnc: int = 1, sbuf_bytes: int = SBUF_TRN2,
             dtype: Any = BF16, symmetric: bool | None = None, timeout_s: float = 600.0) -> float:
    """T_mm of ``kernel`` at ``shape``: the undecomposed matmul's kernel time alone, in seconds
    (what `measure` runs first; it depends on neither the ring nor the link)."""
    lx = launches(kernel, shape, tp=1, dtype=dtype, sbuf_bytes=sbuf_bytes)
    return run(lx.mm, link=DEFAULT_LINK, lnc=lnc, sbuf_bytes=sbuf_bytes, symmetric=symmetric,
               timeout_s=timeout_s).timeline.total_s


# --- the timer ----------------------------------------------------------------------------------
def launches(kernel: str, shape: Mapping[str, int], *, tp: int | None = None, ring: Sequence[int] | None = None,
             channels: int = 1, dtype: Any = BF16, numerics: bool = False, seed: int = 0,
             sbuf_bytes: int = SBUF_TRN2, options: Mapping[str, Any] | None = None) -> Launches:
    """The three launches of ``kernel`` at ``shape`` on one ring (``ring``: simulator rank ids
    in ring order, default ``range(tp)``); ``options`` are extra fused-kernel arguments
    (e.g. ``pieces``)."""
    entry = REGISTRY[kernel]
    ring = tuple(ring) if ring is not None else tuple(range(tp or 1))
    assert tp is None or tp == len(ring), f"tp={tp} but the ring has {len(ring)} ranks"
    kw = {"groups": (ring,), "channels": channels, "sbuf_bytes": sbuf_bytes, **dict(options or {})}
    return entry.build(dict(shape), ring, np.dtype(dtype), numerics, seed, kw)


def run(v: Variant, *, link: Any, numerics: bool = False, lnc: int = 1, sbuf_bytes: int = SBUF_TRN2,
        symmetric: bool | None = None, timeout_s: float = 600.0) -> Any:
    """Run one launch on all its ranks: the simulator's SimResult."""
    return run_ranks(v.kernel, v.args_per_rank, link=link, numerics=numerics, lnc=lnc, timeout_s=timeout_s,
                     sbuf_bytes_per_partition=sbuf_bytes, kwargs=dict(v.kwargs), symmetric=symmetric)


def measure(kernel: str, shape: Mapping[str, int], *, link: Any, tp: int | None = None,
            ring: Sequence[int] | None = None, channels: int = 1, dtype: Any = BF16, numerics: bool = False,
            lnc: int = 1, sbuf_bytes: int = SBUF_TRN2, options: Mapping[str, Any] | None = None,
            symmetric: bool | None = None, seed: int = 0, timeout_s: float = 600.0,
            t_mm: float | None = None) -> OverlapResult:
    """T_mm, T_cc, T_f and the overlap ratios of ``kernel`` (a `REGISTRY` name) at ``shape``.

    Args:
        shape: the entry's ``shape_keys`` (TP kernels: m rows of X in all, k, n per rank).
        link: LinkModel of every channel, or channel -> LinkModel (one ring direction).
        tp / ring: ring size, or the simulator rank ids in ring order.
        channels: 1 or 2; dtype: operand dtype; lnc: programs per rank;
        sbuf_bytes: SBUF bytes per partition of the target chip (simulator capacity and
            the kernels' tiling budget); options: extra fused-kernel arguments.
        numerics: run the fused kernel with data and check every rank against the reference.
        symmetric: the simulator's symmetric mode for the schedule-only runs (None: auto).
        t_mm: T_mm of this shape already simulated (`baseline`), so it is not run again: the
            baseline matmul moves nothing over a link, so one run serves every ring and link.

    Returns:
        `OverlapResult`; with numerics, ``ok`` and ``max_err`` of the worst rank.
    """
    lx = launches(kernel, shape, tp=tp, ring=ring, channels=channels, dtype=dtype, numerics=numerics, seed=seed,
                  sbuf_bytes=sbuf_bytes, options=options)
    opts = {"link": link, "lnc": lnc, "sbuf_bytes": sbuf_bytes, "timeout_s": timeout_s}
    a = t_mm if t_mm is not None else run(lx.mm, numerics=False, symmetric=symmetric, **opts).timeline.total_s
    t_cc = run(lx.cc, numerics=False, symmetric=symmetric, **opts).timeline
    fused = run(lx.fused, numerics=numerics, symmetric=None if numerics else symmetric, **opts)
    ok = err = None
    if numerics:
        verdicts = [agreement(got, want, dtype) for out, exp in zip(fused.outputs, lx.expected())
                    for got, want in zip(_flat(out), _flat(exp))]
        ok, err = all(v.ok for v in verdicts), max(v.rel for v in verdicts)
    b, c = collective_span(t_cc), fused.timeline.total_s
    return OverlapResult(kernel, len(lx.fused.args_per_rank), channels, dict(shape), a, b, c,
                         hidden_fraction(a, b, c), speedup(a, b, c), fused.timeline.exposed_comm_s,
                         collective_window(fused.timeline), numerics, ok, err)
