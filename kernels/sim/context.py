"""The state of one simulated core: its allocations, capacity accounting and clock."""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any

import numpy as np

from . import checks, rates
from .errors import ConstraintError, UninitializedReadError, _Aborted, where
from .rates import LinkModel
from .lnc import SharedHbm
from .onchip import OnChipSpace, allocation_site
from .rendezvous import Rendezvous
from .tensor import Allocation, MemoryRegion, NkiTensor
from .timeline import CoreTimeline


class CoreContext:
    """One core running the kernel: rank, program, memory, numerics flag and timeline."""

    _ids = itertools.count(1)

    def __init__(self, *, rank: int, program: int, lnc: int, world: int, numerics: bool,
                 sbuf_limit: int, links: dict[int, LinkModel], default_link: LinkModel,
                 rendezvous: Rendezvous, shared_hbm: SharedHbm, grid: tuple[int, ...] = (1,)) -> None:
        self.rank, self.program, self.lnc, self.world = rank, program, lnc, world
        self.grid = grid
        self.numerics = numerics
        self.sbuf_limit = sbuf_limit
        self.links, self.default_link = links, default_link
        self.rendezvous = rendezvous
        self.shared_hbm = shared_hbm
        self._shared_seq = 0
        self.timeline = CoreTimeline(rank, program)
        self._span: dict[int, list] = {}  # on-chip alloc id -> [first, last access, buffer, bytes, label]
        self._labels: list[str] = []  # op of each instruction, in issue order
        self._names: dict[int, str] = {}  # name= of the instructions that have one
        self._touched: list[int] = []  # SBUF bytes per partition each instruction touches
        self.live: dict[int, tuple[MemoryRegion, int, str]] = {}
        self.inputs: set[int] = set()
        self.space = {MemoryRegion.sbuf: OnChipSpace(sbuf_limit),
                      MemoryRegion.psum: OnChipSpace(rates.PSUM_NUM_BANKS * rates.PSUM_BANK_BYTES)}

    @property
    def who(self) -> tuple[int, int]:
        return (self.rank, self.program)

    def last_instruction(self) -> str:
        """The rank's latest instruction, as messages name it (read from another thread: a report only)."""
        seq = len(self._labels) - 1
        return self.where(self._labels[seq], self._names.get(seq)) if seq >= 0 else f"{self.where('start')}: none yet"

    def where(self, op: str, name: str | None = None) -> str:
        return where(self.rank, op, name, self.program)

    def link(self, channel: int) -> LinkModel:
        """The LinkModel this program's collectives on ``channel`` see.

        A link is the rank's (``run_ranks``'s ``link``); under LNC 2 both physical cores of
        the rank send over it, so each program gets bandwidth / lnc at the same hop latency:
        the share of two streams that run side by side (ASSUMPTION: the programs of a rank
        communicate alike, as kernels that split their rows between them do; one program
        talking while the other is silent would see only half the link)."""
        link = self.links.get(channel, self.default_link)
        if self.lnc == 1:
            return link
        return dataclasses.replace(link, bandwidth_Bps=link.bandwidth_Bps / self.lnc)

    # --- allocation ---------------------------------------------------------------------------
    def allocate(self, shape: Any, dtype: Any, buffer: MemoryRegion, name: str = "",
                 kind: str = "internal", op: str = "nl.ndarray") -> NkiTensor:
        shape = checks.shape_tuple(shape, self.where(op, name or None))
        dtype = checks.dtype_of(dtype, self.where(op, name or None))
        if not isinstance(buffer, MemoryRegion):
            raise ConstraintError(f"{self.where(op, name or None)}: buffer must be nl.sbuf, nl.psum, "
                                  f"nl.private_hbm or nl.shared_hbm, got {buffer!r}")
        if buffer.on_chip:
            checks.partition_dim(shape[0], self.where(op, name or None), f"tensor shape {shape}")
        if buffer is MemoryRegion.shared_hbm and self.lnc > 1 and kind == "internal":
            k = self._shared_seq
            self._shared_seq += 1
            alloc = self.shared_hbm.get_or_create(
                k, lambda: Allocation(next(self._ids), shape, dtype, buffer, name, self.numerics, kind))
            if alloc.shape != shape or alloc.dtype != dtype:
                raise ConstraintError(
                    f"{self.where(op, name or None)}: shared_hbm allocation #{k} is {shape} {dtype.name} on "
                    f"this program but {alloc.shape} {alloc.dtype.name} on another program of the rank")
            self.shared_hbm.track(alloc)
            return NkiTensor(alloc)
        alloc = Allocation(next(self._ids), shape, dtype, buffer, name, self.numerics, kind)
        if buffer.on_chip:
            nbytes = alloc.bytes_per_partition
            self.live[alloc.id] = (buffer, nbytes, alloc.label())
            free_at = self.space[buffer].place(alloc.id, nbytes, allocation_site())
            if free_at > 0:
                self.timeline.reserve(alloc.id, tuple((0, n) for n in shape), free_at)
            weakref.finalize(alloc, self._free, alloc.id)
        else:
            weakref.finalize(alloc, self.timeline.forget, alloc.id)
        return NkiTensor(alloc)

    def _free(self, aid: int) -> None:
        entry = self.live.pop(aid, None)
        if entry is not None:
            buffer = entry[0]
            self.space[buffer].release(aid, self.timeline.last_use(aid))
        self.timeline.forget(aid)

    def input_tensor(self, value: Any, index: int | str) -> NkiTensor:
        """A kernel argument (numpy array, or anything with .shape/.dtype; positional ``index``
        or keyword name) as an HBM tensor."""
        t = self.allocate(tuple(value.shape), value.dtype, MemoryRegion.shared_hbm,
                          name=f"arg{index}" if isinstance(index, int) else index, kind="input",
                          op="kernel input")
        if self.numerics:
            t.alloc.data[...] = np.asarray(value, dtype=t.dtype).reshape(-1)
        if t.alloc.written is not None:
            t.alloc.written[...] = True
        self.inputs.add(t.alloc.id)
        self.shared_hbm.track(t.alloc)
        return t

    # --- instructions --------------------------------------------------------------------------
    def check_capacity(self) -> None:
        """SBUF and PSUM bytes per partition at the busiest instruction of the program, counting
        each on-chip tensor from its first to its last access (as the compiler allocates: a
        tensor no later instruction touches takes no space, whatever Python still refers to).
        Limits: SBUF ``sbuf_limit``; PSUM 8 banks of 2 KiB (tiles smaller than a bank share
        one; a matmul result must fit in one bank, checks.matmul). Run when the program ends.

        Over capacity is spilled, as the compiler does: "If the total size of the live data
        ... overflows the capacity of any on-chip memory, the Neuron compiler will insert the
        necessary spills or refills between that memory and the next-tier memory in the
        hierarchy" ("NKI memory hierarchy overview"): PSUM into SBUF, SBUF into HBM. Where
        live tensors exceed the limit, the tensor live there but not touched whose last use
        is latest is spilled (saved once and reloaded once), until the rest fit; a PSUM tensor
        spilled takes SBUF space over its life and may be spilled on to HBM. The traffic is
        timed by ``CoreTimeline.spill`` (ASSUMPTION: PSUM spills move on the DMA queues too,
        as the profiles' qSyncSpillReload / qVectorSpillReload queues carry the compiler's
        spills: "NKI performance guide", "fused Mamba" tutorial). Refused only where the
        tensors an instruction itself touches exceed the limit: nothing can be spilled there."""
        psum_limit = rates.PSUM_NUM_BANKS * rates.PSUM_BANK_BYTES
        spans = [sp for sp in self._span.values() if sp[2] is MemoryRegion.psum]
        spilled = self._spill(spans, MemoryRegion.psum, psum_limit,
                              f"{rates.PSUM_NUM_BANKS} banks of {rates.PSUM_BANK_BYTES} bytes")
        spans = [sp for sp in self._span.values() if sp[2] is MemoryRegion.sbuf]
        spans += [[sp[0], sp[1], MemoryRegion.sbuf, *sp[3:]] for sp in spilled]
        if sum(sp[3] for sp in spans) > self.sbuf_limit:
            worst = max(range(len(self._touched)), key=self._touched.__getitem__, default=-1)
            if worst >= 0 and self._touched[worst] > self.sbuf_limit:
                self._over_capacity(MemoryRegion.sbuf, self._touched[worst], worst,
                                    [sp for sp in spans if sp[0] <= worst <= sp[1]], self.sbuf_limit,
                                    f"{self.sbuf_limit // 1024} KiB; the tensors this instruction touches alone "
                                    f"exceed it, so nothing can be spilled")
            spilled += self._spill(spans, MemoryRegion.sbuf, self.sbuf_limit, f"{self.sbuf_limit // 1024} KiB")
        if spilled:
            self.timeline.spill(sum(sp[3] for sp in spilled) * rates.PMAX, len(spilled) * rates.PMAX)

    def _spill(self, spans: list[list], buffer: MemoryRegion, limit: int, what: str) -> list[list]:
        """The tensors of ``spans`` (in ``buffer``) spilled to bring every instruction under
        ``limit``: sweep the instructions in order; where live bytes exceed the limit, spill
        the live tensor not touched there whose last use is latest. Refuses when none is
        left to spill."""
        starts = sorted(range(len(spans)), key=lambda i: spans[i][0])
        live: dict[int, list] = {}
        used, j, spilled = 0, 0, []
        for seq in sorted({sp[0] for sp in spans}):
            for i in list(live):
                if live[i][1] < seq:
                    used -= live.pop(i)[3]
            while j < len(starts) and spans[starts[j]][0] == seq:
                live[starts[j]] = spans[starts[j]]
                used += spans[starts[j]][3]
                j += 1
            while used > limit:
                idle = [i for i, sp in live.items() if sp[0] < seq < sp[1]]
                if not idle:
                    self._over_capacity(buffer, used, seq, list(live.values()), limit,
                                        f"{what}; the tensors this instruction touches alone exceed it, "
                                        f"so nothing can be spilled")
                victim = max(idle, key=lambda i: live[i][1])
                used -= live[victim][3]
                spilled.append(live.pop(victim))
        return spilled

    def _over_capacity(self, buffer: MemoryRegion, peak: int, at: int, live: list, limit: int, what: str) -> None:
        live = sorted(live, key=lambda sp: -sp[3])
        largest = ", ".join(f"{sp[4]} {sp[3]} B" for sp in live[:4])
        raise ConstraintError(
            f"{self.where(self._labels[at], self._names.get(at))}: {buffer.name.upper()} over capacity: live tensors "
            f"need {peak} bytes per partition > {limit} ({what}); {len(live)} tensors live from first to last use, "
            f"largest: {largest}")

    def read(self, v: NkiTensor, op: str, name: str | None, role: str) -> np.ndarray:
        """The data of ``v`` (numerics mode), refusing elements nothing has written (for a
        tensor the rank's programs share, judged at the next barrier: see ``lnc``)."""
        _refuse_oob(v)
        # A snapshot: the other program of an LNC=2 rank runs in its own thread and may
        # write the shared tensor between the test and the report.
        mask = np.array(v.written_mask())
        if not mask.all():
            unwritten = ~mask
            bad = np.argwhere(unwritten)
            msg = (f"{self.where(op, name)}: {role} reads {int(unwritten.sum())} of {v.size} elements of "
                   f"tensor {v.alloc.label()} ({v.buffer.name}, shape {v.alloc.shape}) that nothing has "
                   f"written (NaN); first at view index {tuple(int(i) for i in bad[0])}")
            if self.lnc > 1 and self.shared_hbm.is_tracked(v.alloc):
                self.shared_hbm.read_unwritten(self.program, msg, v, unwritten)
            else:
                raise UninitializedReadError(msg)
        return v.array()

    def read_moved(self, v: NkiTensor, op: str, name: str | None, role: str) -> tuple[np.ndarray, np.ndarray]:
        """Data and written mask of ``v`` for an instruction that only moves data (a
        transpose): unwritten elements move along as unwritten, to be refused where they
        are used; a source with no written element at all is refused here."""
        _refuse_oob(v)
        mask = np.array(v.written_mask())  # a snapshot, as in ``read``
        if mask.all():
            return v.array(), None
        if not mask.any() or (self.lnc > 1 and self.shared_hbm.is_tracked(v.alloc)):
            # Shared elements unwritten so far may be about to be written by the other program:
            # recorded and judged by the accesses (``lnc``), and the copy counts as written, so
            # that no later read of it decides the outcome by which thread ran first.
            return np.array(self.read(v, op, name, role)), None
        return np.array(v.array()), np.array(mask)

    def write_moved(self, v: NkiTensor, value: np.ndarray, mask: np.ndarray | None) -> None:
        """Write ``value``; ``mask`` (None: all) says which of its elements hold written data."""
        _refuse_oob(v)
        self._assign(v, value)
        v.set_written(True if mask is None else np.asarray(mask).reshape(v.shape))

    def write(self, v: NkiTensor, value: np.ndarray) -> None:
        _refuse_oob(v)
        self._assign(v, value)
        v.set_written(True)

    def _assign(self, v: NkiTensor, value: np.ndarray) -> None:
        """Store ``value``; in a tensor the rank's programs share, noting (atomically) which
        elements the write changes, for the race check of the instruction (``lnc``)."""
        if self.lnc > 1 and self.shared_hbm.is_tracked(v.alloc):
            self.shared_hbm.write(self.program, v, value)
        else:
            v.assign(value)

    def accesses(self, op: str, name: str | None, reads: list[NkiTensor], writes: list[NkiTensor]) -> None:
        """Liveness of on-chip operands (``check_capacity``) and cross-program checks of an
        instruction's operands."""
        if self.rendezvous.error is not None:  # the run failed or passed its time limit: stop here
            raise _Aborted()
        for views in (reads, writes):
            for v in views:
                _refuse_oob(v)
        seq = len(self._labels)
        self._labels.append(op)  # str only: no new GC-tracked object per instruction
        if name is not None:
            self._names[seq] = name
        span = self._span
        touched: dict[int, int] = {}
        for views in (reads, writes):
            for v in views:
                a = v.alloc
                if a.on_chip:
                    for key, nbytes in _blocks(v):
                        sp = span.get(key)
                        if sp is None:
                            span[key] = [seq, seq, a.buffer, nbytes, a.label()]
                        else:
                            sp[1] = seq
                    if a.buffer is MemoryRegion.sbuf:
                        touched[a.id] = a.bytes_per_partition
        self._touched.append(sum(touched.values()))  # an int per instruction: the spill check's floor
        if self.lnc > 1:
            self.shared_hbm.access(self.program, self.where(op, name), reads, writes)

    def issue(self, op: str, name: str | None, engine: str, duration: float,
              reads: list[NkiTensor], writes: list[NkiTensor]) -> tuple[float, float]:
        self.accesses(op, name, reads, writes)
        tl = self.timeline
        if tl.reads_previous(engine, reads, writes) and engine == "Vector":
            duration += rates.vector_dependent_extra_seconds()  # rates.VECTOR_DEPENDENT_FIXED_CYCLES
        start, end = tl.run(engine, duration, tl.ready(reads, writes), op, name)
        tl.record(reads, writes, end, end)
        return start, end

    def issue_dma(self, op: str, name: str | None, nbytes: int,
                  reads: list[NkiTensor], writes: list[NkiTensor]) -> tuple[float, float]:
        self.accesses(op, name, reads, writes)
        tl = self.timeline
        chunks, partitions = dma_shape(reads + writes)
        start, end = tl.dma(nbytes, tl.ready(reads, writes), op, name, chunks, partitions)
        tl.record(reads, writes, end, end)
        return start, end


def contiguous_run(v: NkiTensor) -> int:
    """Elements of ``v`` in one contiguous piece of memory: the trailing dims whose strides
    continue each other (an on-chip view stops at its partition dim, dim 0: each partition
    is a separate range of the address map, "Trainium/Inferentia2 architecture guide", data
    movement)."""
    run = 1
    pattern = v.pattern[1:] if v.buffer.on_chip else v.pattern
    for stride, count in reversed(pattern):
        if count == 1:
            continue
        if stride != run:
            break
        run *= count
    return run


def dma_shape(views: list[NkiTensor]) -> tuple[int, int]:
    """(contiguous chunks, partitions) of a DMA over ``views``: the chunks of the most
    fragmented side ("DMA buffers": data within one must be contiguous) and the partitions of
    its on-chip side (128 for an HBM-to-HBM copy)."""
    chunks, partitions = 1, rates.PMAX
    for v in views:
        if v.size:
            chunks = max(chunks, -(-v.size // contiguous_run(v)))
        if v.buffer.on_chip:
            partitions = min(partitions, v.partitions) if partitions != rates.PMAX else v.partitions
    return chunks, partitions


def _blocks(v: NkiTensor) -> list[tuple[Any, int]]:
    """(liveness key, bytes per partition) of the parts of ``v``'s allocation it touches: the
    whole allocation, or for a pre-0.6 tensor with block dims each block it touches (the block
    dims count logical tiles, not the physical tiles allocated: "nki.compiler.psum.alloc";
    "multi-buffering is implicit with block dimension": "NKI Block Dimension Migration Guide")."""
    a = v.alloc
    if not a.block_elems:
        return [(a.id, a.bytes_per_partition)]
    per_part = a.strides[0] if len(a.shape) > 1 else 1
    lo = hi = v.offset % per_part
    for stride, count in v.pattern:
        if count > 1 and stride % per_part:
            lo, hi = (lo + stride * (count - 1), hi) if stride < 0 else (lo, hi + stride * (count - 1))
    nbytes = a.block_elems * a.dtype.itemsize
    return [((a.id, b), nbytes) for b in range(lo // a.block_elems, hi // a.block_elems + 1)]


def _refuse_oob(v: NkiTensor) -> None:
    """A gather/scatter view with out-of-bounds indices: an error for every instruction but a
    DMA with oob_mode.skip (which passes only the in-bounds rows)."""
    if v._oob is not None:
        raise ConstraintError(v._oob[1])
