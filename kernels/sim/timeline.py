"""The engine timeline: each instruction on its engine, ordered by data dependencies.

Every core (a rank, or one program of a rank under LNC 2) has in-order engines: Tensor,
Vector, Scalar, GpSimd, a pool of DMA queues sharing the core's DMA bandwidth, and
one collective engine per channel ("CC0", "CC1", ...).

DMA model (``CoreTimeline.dma``): DMA instructions go round-robin to ``rates.DMA_QUEUES``
queues (ASSUMPTION: the queue is the compiler's choice; round-robin spreads them). Each
queue is in order: a DMA's descriptor generation (0.6 us) starts when its data is ready
and the queue's previous descriptor is done, and its data phase starts no earlier than
1.3 us later and no earlier than the end of the queue's previous data phase. Queues are
independent of each other: a DMA waiting for its data holds back only the DMAs behind it
on its own queue. The core's DMA bandwidth (16 engines: 272 / 368 / 528 GB/s on
trn1 / trn2 / trn3, ``rates.generation``) is one shared resource: every data
phase needs ``rates.dma_transfer_seconds`` of it (bytes at the engines' rate plus a fixed
cost per contiguous chunk), taken at the full rate in the free intervals at or
after its earliest start, the earliest first, until it has had that much; a DMA whose
data is ready can thus fill a gap left before a DMA issued earlier that still waits, and
a long transfer runs in the gaps between short ones rather than waiting for a gap as
long as itself (a DMA is a sequence of descriptors, and the DMA engines interleave the
descriptors of their queues: "NKI Performance Guide", DMA section). (Data phases are
time-multiplexed at full rate rather than sharing the bandwidth concurrently: the same
bytes per second in total, and every end time is final when the instruction is issued.) An instruction starts when its
engine is free and every earlier instruction it depends on (read-after-write,
write-after-read, write-after-write on overlapping boxes of the same allocation) has
finished; engines run concurrently. Durations come from ``rates``.

Collective traffic shares that bandwidth: the bytes a collective sends from this core
(its DMA rings read the src from HBM) take the same DMA bandwidth from the collective's
start, paced over its link time (``dma_traffic``), so a collective delays the compute
loads and stores of its core and is delayed by them ("Trainium2 Architecture Guide for
NKI": collectives run on the same DMA engines as kernel data movement).

Exposed communication of a core is the time during which a collective transfer is in
flight and no compute engine (Tensor, Vector, Scalar, GpSimd) is busy.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from . import rates
from .tensor import NkiTensor, box_contains, boxes_overlap

COMPUTE_ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd")
# Free bandwidth intervals shorter than this are not used (float noise between touching ones).
_MIN_GAP_S = 1e-12
# A collective's DMA traffic is booked in this many pieces paced over its link time
# (ASSUMPTION: the DMA rings keep a few transfers in flight ahead of the link; 8 pieces
# bound the simulator's bookings per transfer while spreading the reads over the link time).
TRAFFIC_PIECES = 8


@dataclass(frozen=True)
class Instruction:
    """One scheduled instruction of one core."""

    op: str
    name: str | None
    engine: str
    start_s: float
    end_s: float


def _latest_overlapping_end(box, entries, t: float) -> float:
    """The latest of ``t`` and the ends of the ``(box, end)`` entries whose box overlaps
    ``box`` (the box test is inlined: this is the simulator's innermost loop)."""
    for ebox, end in entries:
        if end > t:
            for (alo, ahi), (blo, bhi) in zip(box, ebox):
                if alo >= bhi or blo >= ahi:
                    break
            else:
                t = end
    return t


class _Accesses:
    """Access history of one allocation: pending writes (box, end) and reads {box: end}."""

    __slots__ = ("writes", "reads")

    def __init__(self) -> None:
        self.writes: list[tuple[tuple[tuple[int, int], ...], float]] = []
        self.reads: dict[tuple[tuple[int, int], ...], float] = {}


class CoreTimeline:
    """Clock of one core: engine availability, dependency tracking, busy time, intervals."""

    def __init__(self, rank: int, program: int = 0, keep_instructions: bool = True) -> None:
        self.rank = rank
        self.program = program
        self.engine_free: dict[str, float] = {}
        self.busy: dict[str, float] = {}
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.instructions: list[Instruction] | None = [] if keep_instructions else None
        self.counts: dict[str, int] = {}
        self._access: dict[int, _Accesses] = {}
        self._dma_queue_free = [0.0] * rates.DMA_QUEUES  # descriptor generation, per queue
        self._dma_queue_data = [0.0] * rates.DMA_QUEUES  # end of the last data phase, per queue
        self._dma_next = 0
        self._last_writes: dict[str, list[tuple[int, tuple]]] = {}  # per engine: its last instruction's writes
        self._bw_starts: list[float] = []  # busy intervals of the DMA bandwidth, sorted, disjoint
        self._bw_ends: list[float] = []
        self.end_s = 0.0
        self.issued = 0  # instructions placed so far (progress, read by the rendezvous timeout)

    # --- dependencies -----------------------------------------------------------------------
    def ready(self, reads: list[NkiTensor], writes: list[NkiTensor]) -> float:
        """Earliest start allowed by data dependencies on earlier instructions: a read waits
        for the writes it overlaps, a write for the writes and the reads it overlaps."""
        t = 0.0
        access = self._access
        for v in reads:
            acc = access.get(v.alloc.id)
            if acc is not None and acc.writes:
                t = _latest_overlapping_end(v.box(), acc.writes, t)
        for v in writes:
            acc = access.get(v.alloc.id)
            if acc is not None:
                box = v.box()
                t = _latest_overlapping_end(box, acc.writes, t)
                t = _latest_overlapping_end(box, acc.reads.items(), t)
        return t

    def record(self, reads: list[NkiTensor], writes: list[NkiTensor], read_end: float, write_end: float) -> None:
        access = self._access
        for v in writes:
            box = v.box()
            acc = access.get(v.alloc.id)
            if acc is None:
                acc = access[v.alloc.id] = _Accesses()
            if acc.writes:
                acc.writes = [e for e in acc.writes if not box_contains(box, e[0])]
            if acc.reads:
                acc.reads = {b: e for b, e in acc.reads.items() if not box_contains(box, b)}
            acc.writes.append((box, write_end))
        for v in reads:
            box = v.box()
            acc = access.get(v.alloc.id)
            if acc is None:
                acc = access[v.alloc.id] = _Accesses()
            prev = acc.reads.get(box)
            if prev is None or prev < read_end:
                acc.reads[box] = read_end

    def reserve(self, alloc_id: int, box: tuple[tuple[int, int], ...], until: float) -> None:
        """Nothing may access ``box`` of a new allocation before ``until`` (its memory was
        used by a freed allocation until then; see context.OnChipSpace)."""
        acc = self._access.setdefault(alloc_id, _Accesses())
        acc.writes.append((box, until))

    def last_use(self, alloc_id: int) -> float:
        """Latest end of the recorded accesses of an allocation (0 if none)."""
        acc = self._access.get(alloc_id)
        if acc is None:
            return 0.0
        return max([e for _, e in acc.writes] + list(acc.reads.values()), default=0.0)

    def forget(self, alloc_id: int) -> None:
        self._access.pop(alloc_id, None)

    # --- engines ----------------------------------------------------------------------------
    def occupy(self, engine: str, start: float, end: float, op: str, name: str | None,
               busy_s: float | None = None) -> None:
        """Place an instruction on ``engine`` over [start, end); ``busy_s`` (default end - start)
        is the engine time it takes (a DMA's data phase may run in pieces: its bandwidth
        intervals are recorded when booked)."""
        self.issued += 1
        self.engine_free[engine] = max(self.engine_free.get(engine, 0.0), end)
        self.busy[engine] = self.busy.get(engine, 0.0) + (end - start if busy_s is None else busy_s)
        if busy_s is None:
            self.intervals.setdefault(engine, []).append((start, end))
        self.counts[engine] = self.counts.get(engine, 0) + 1
        self.end_s = max(self.end_s, end)
        if self.instructions is not None:
            self.instructions.append(Instruction(op, name, engine, start, end))

    def reads_previous(self, engine: str, reads: list[NkiTensor], writes: list[NkiTensor]) -> bool:
        """Whether ``reads`` overlap what the previous instruction on ``engine`` wrote; records
        ``writes`` as that engine's last."""
        last = self._last_writes.get(engine, ())
        hit = any(v.alloc.id == aid and boxes_overlap(v.box(), box) for v in reads for aid, box in last)
        self._last_writes[engine] = [(v.alloc.id, v.box()) for v in writes]
        return hit

    def run(self, engine: str, duration: float, ready: float, op: str, name: str | None) -> tuple[float, float]:
        """An in-order engine instruction: starts at max(ready, engine free)."""
        start = max(ready, self.engine_free.get(engine, 0.0))
        end = start + duration
        self.occupy(engine, start, end, op, name)
        return start, end

    def dma(self, nbytes: int, ready: float, op: str, name: str | None, chunks: int = 0,
            partitions: int = 128) -> tuple[float, float]:
        """A DMA: 0.6 us descriptor generation on its queue, 1.3 us semaphore-to-start, then its
        data phase (``rates.dma_transfer_seconds`` of its bytes and contiguous ``chunks``) on
        the core's shared DMA bandwidth (Trainium2 architecture guide, NKI DMA overview); see
        the module docstring for the queues. The bandwidth is booked for the time the 16
        engines would take; a DMA over fewer partitions (fewer engines) ends no earlier than
        its data start plus its own, longer, time. Returns (issue time, end of the data phase)."""
        q = self._dma_next
        self._dma_next = (q + 1) % len(self._dma_queue_free)
        t0 = max(ready, self._dma_queue_free[q])
        self._dma_queue_free[q] = t0 + rates.DMA_DESCRIPTOR_S
        earliest = max(t0 + rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S, self._dma_queue_data[q])
        duration = rates.dma_transfer_seconds(nbytes, chunks)
        data_start, end = self._take_bandwidth(earliest, duration)
        if partitions < rates.PMAX:
            end = max(end, data_start + rates.dma_transfer_seconds(nbytes, chunks, partitions))
        self._dma_queue_data[q] = end
        self.occupy("DMA", data_start, end, op, name, busy_s=duration)
        return t0, end

    def spill(self, nbytes: int, chunks: int) -> None:
        """Spill traffic the compiler inserts (context.check_capacity): ``nbytes`` saved to HBM
        and reloaded, in ``chunks`` contiguous pieces, on the core's DMA bandwidth. Timed as
        bandwidth only: the kernel cannot end before its DMA bandwidth has carried its own
        transfers and the spills, from its first DMA (the spills run in the bandwidth's idle
        time; ASSUMPTION: they do not delay the instructions that use the spilled tensors)."""
        t = 2 * rates.dma_transfer_seconds(nbytes, chunks)
        first = min((a for a, _ in self.intervals.get("DMA", [])), default=0.0)
        self.busy["DMA"] = self.busy.get("DMA", 0.0) + t
        self.counts["DMA spill"] = self.counts.get("DMA spill", 0) + 2 * chunks
        self.end_s = max(self.end_s, first + self.busy["DMA"])

    def dma_traffic(self, earliest: float, nbytes: int, op: str, name: str | None, span: float = 0.0) -> float:
        """Collective traffic of ``nbytes`` sent by this core's DMA engines from ``earliest``:
        it takes the same shared DMA bandwidth (and HBM port) as the compute DMAs, in the
        free intervals from ``earliest``, paced over ``span`` seconds (the collective's link
        time: in ``TRAFFIC_PIECES`` equal pieces, piece i no earlier than i/pieces of the
        span, so a transfer slower on its link than on the DMA leaves the bandwidth between
        its pieces to compute DMAs); returns when it is done."""
        duration = rates.dma_transfer_seconds(nbytes)
        pieces = TRAFFIC_PIECES if span > duration else 1
        end = earliest
        for i in range(pieces):
            _, end = self._take_bandwidth(max(end, earliest + i * span / pieces), duration / pieces)
        self.busy["DMA"] = self.busy.get("DMA", 0.0) + duration
        return end

    def _take_bandwidth(self, earliest: float, duration: float) -> tuple[float, float]:
        """Book ``duration`` seconds of the DMA bandwidth in its free intervals at or after
        ``earliest``, the earliest first; return (start of the first piece, end of the last).
        Each piece is recorded as a "DMA" interval."""
        starts, ends = self._bw_starts, self._bw_ends
        i = bisect.bisect_right(ends, earliest)
        t, left, pieces = earliest, duration, []
        while left > 0:
            gap_end = starts[i] if i < len(starts) else float("inf")
            if gap_end - t > _MIN_GAP_S or gap_end == float("inf"):
                take = min(left, gap_end - t)
                pieces.append((t, t + take))
                left -= take
                t += take
            if left > 0:
                t = max(t, ends[i])
                i += 1
        for a, b in pieces:
            self._insert_busy(a, b)
        self.intervals.setdefault("DMA", []).extend(pieces)
        if len(starts) > 64:
            # no later DMA can start before its queue's descriptor is done plus 1.3 us
            floor = min(self._dma_queue_free) + rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S
            k = bisect.bisect_right(ends, floor)
            if k:
                del starts[:k], ends[:k]
        return pieces[0][0], pieces[-1][1]

    def _insert_busy(self, a: float, b: float) -> None:
        """Add [a, b) (free before) to the sorted, disjoint busy intervals, merging touching ones."""
        starts, ends = self._bw_starts, self._bw_ends
        j = bisect.bisect_left(starts, a)
        lo, hi, new_a, new_b = j, j, a, b
        if j > 0 and ends[j - 1] >= a - _MIN_GAP_S:
            lo, new_a = j - 1, starts[j - 1]
        if j < len(starts) and starts[j] <= b + _MIN_GAP_S:
            hi, new_b = j + 1, ends[j]
        starts[lo:hi] = [new_a]
        ends[lo:hi] = [new_b]

    # --- reporting --------------------------------------------------------------------------
    def exposed_comm_s(self) -> float:
        comm = _union([iv for e, ivs in self.intervals.items() if e.startswith("CC") for iv in ivs])
        compute = _union([iv for e in COMPUTE_ENGINES for iv in self.intervals.get(e, [])])
        return _measure(comm) - _measure(_intersect(comm, compute))


def _union(ivs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(ivs):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _measure(ivs: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in ivs)


@dataclass
class Timeline:
    """Result of a run: kernel time, busy time per engine and exposed communication.

    ``total_s`` is the latest instruction end over all cores (the kernel starts at 0);
    ``busy_s`` and ``exposed_comm_s`` are the maximum over cores (the critical core of a
    symmetric kernel); ``cores`` keeps every core's own clock. ``symmetric``: True when
    only rank 0 was simulated and ``cores`` holds relabelled views of its clock
    (``run_ranks(symmetric=...)``).
    """

    total_s: float
    busy_s: dict[str, float]
    exposed_comm_s: float
    cores: list[CoreTimeline] = field(default_factory=list, repr=False)
    symmetric: bool = False

    @classmethod
    def from_cores(cls, cores: list[CoreTimeline]) -> "Timeline":
        busy: dict[str, float] = {}
        for c in cores:
            for e, b in c.busy.items():
                busy[e] = max(busy.get(e, 0.0), b)
        total = max((c.end_s for c in cores), default=0.0)
        exposed = max((c.exposed_comm_s() for c in cores), default=0.0)
        return cls(total, dict(sorted(busy.items())), exposed, cores)

    def summary(self) -> str:
        lines = [f"kernel time        {self.total_s * 1e6:12.3f} us  ({len(self.cores)} cores)",
                 f"exposed comm       {self.exposed_comm_s * 1e6:12.3f} us"]
        for e, b in self.busy_s.items():
            n = max(c.counts.get(e, 0) for c in self.cores) if self.cores else 0
            share = b / self.total_s if self.total_s else 0.0
            lines.append(f"busy {e:<13} {b * 1e6:12.3f} us  {share:6.1%}  ({n} instr)")
        return "\n".join(lines)
