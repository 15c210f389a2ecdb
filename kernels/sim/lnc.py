"""The programs of one logical core (LNC 2, or an SPMD grid): shared HBM and their ordering.

Hardware ("nki.isa.core_barrier", "nki.isa.sendrecv", "Logical NeuronCore configuration"):
the two physical cores of an LNC 2 rank run their instruction streams independently and
share the HBM stack; a shared_hbm tensor is one allocation both address. Nothing orders
an access of one core after an access of the other except a synchronisation:
``core_barrier`` (each core signals a semaphore on the other and waits for the other's)
and ``sendrecv`` (the pair of transfers completes together). Without one, a core that reads
what the other writes (or writes what the other reads or writes) races: on the device the
result depends on timing.

The simulator makes every run deterministic by refusing such races instead of resolving
them by thread timing: in numerics mode each shared allocation keeps, per element, which
programs wrote and read it since the last synchronisation of the rank's programs, and an
access that conflicts with another program's access in that interval raises
``RaceError`` naming both programs and instructions, whichever thread comes first. A
write that leaves the values as the recorded accesses left them conflicts with nothing but
another program's writes of other values (two writes of the same values, or both programs
copying a tensor onto itself: memory and every read end the same in either order); a
write is judged by the values it stored, kept with the write (not read back from memory
the other program's thread may have written since). A read
of shared elements nothing has written yet is not judged at once (the other program may
be about to write them, which is a race, not a read of unwritten memory): it is recorded,
a later write of those elements by another program in the same interval is a
``RaceError``, and a read still unwritten when every program reaches the next barrier (or
the end of the kernel) raises ``UninitializedReadError`` for the first such read. The
outcome therefore depends only on what each program accesses between barriers, never on
the interleaving of the Python threads: data crosses between programs only through a
barrier (or sendrecv), as on the device. Schedule-only runs (numerics=False) move no
data and check no races.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .errors import ConstraintError, UninitializedReadError
from .tensor import Allocation, NkiTensor


class RaceError(ConstraintError):
    """Two programs of one rank accessed the same shared_hbm elements, at least one writing,
    with no core_barrier / sendrecv between them."""


class SharedHbm:
    """shared_hbm allocations of one logical rank, seen by all its programs: the k-th
    shared_hbm allocation of each program is the same tensor; plus the race record."""

    def __init__(self, programs: int) -> None:
        self.programs = programs
        self._lock = threading.Lock()
        self._allocs: dict[int, Allocation] = {}
        # alloc id -> (allocation, per element: programs that wrote / read / changed it since the
        # last synchronisation (bit p: program p), who did what, the data after the last write)
        self._tracked: dict[int, tuple[Allocation, np.ndarray, np.ndarray, np.ndarray, dict, np.ndarray]] = {}
        self._unwritten: list[tuple[int, int, str, NkiTensor, np.ndarray]] = []  # (program, seq, message, view, mask)
        self._seq = 0
        # (program, id of the view) -> (the view, the values its latest write stored): what
        # the race check compares, not the memory another program may have written since
        self._written: dict[tuple[int, int], tuple[NkiTensor, np.ndarray]] = {}

    def is_tracked(self, alloc: Allocation) -> bool:
        return alloc.id in self._tracked

    def read_unwritten(self, program: int, message: str, v: NkiTensor, unwritten: np.ndarray) -> None:
        """Record a read of shared elements nothing has written (judged at the next barrier)."""
        with self._lock:
            self._seq += 1
            self._unwritten.append((program, self._seq, message, v, unwritten.copy()))

    def check_unwritten(self) -> None:
        """At a barrier or the end of the kernel: the first read of elements still unwritten."""
        with self._lock:
            pending = []
            for prog, seq, msg, v, mask in self._unwritten:
                still = mask & ~v.written_mask()
                if still.any():
                    pending.append((prog, seq, msg))
            self._unwritten = []
        if pending:
            raise UninitializedReadError(min(pending)[2])

    def get_or_create(self, k: int, make: Any) -> Allocation:
        with self._lock:
            if k not in self._allocs:
                self._allocs[k] = make()
            return self._allocs[k]

    def track(self, alloc: Allocation) -> None:
        """Record accesses of ``alloc`` (a tensor every program of the rank addresses)."""
        if self.programs > 1 and alloc.data is not None:
            with self._lock:
                if alloc.id not in self._tracked:
                    z = np.zeros(alloc.size, dtype=np.uint8)
                    self._tracked[alloc.id] = (alloc, z, z.copy(), z.copy(), {}, np.array(alloc.data))

    def write(self, program: int, v: NkiTensor, value: np.ndarray) -> None:
        """Store ``value`` in ``v`` of a tracked tensor and keep the values stored (under the
        lock: the other program's thread may write the same elements before this
        instruction's accesses are checked)."""
        with self._lock:
            v.assign(value)
            sel = v._gather_index() if v._rows is not None else None
            self._written[(program, id(v))] = (v, np.array(self._values(v, v.alloc.data, sel)))

    def access(self, program: int, label: str, reads: list[NkiTensor], writes: list[NkiTensor]) -> None:
        """Check and record one instruction's accesses of tracked tensors."""
        if not self._tracked:
            return
        try:
            self._access(program, label, reads, writes)
        finally:
            with self._lock:
                for key in [k for k in self._written if k[0] == program]:
                    del self._written[key]

    def _access(self, program: int, label: str, reads: list[NkiTensor], writes: list[NkiTensor]) -> None:
        bit = np.uint8(1 << program)
        with self._lock:
            for views, writing in ((reads, False), (writes, True)):
                for v in views:
                    entry = self._tracked.get(v.alloc.id)
                    if entry is None:
                        continue
                    alloc, wmask, rmask, cmask, who, seen = entry
                    # gather views: their elements; a reinterpreting view: its whole allocation
                    sel = v._gather_index() if v._rows is not None else None
                    if sel is not None:
                        w, r, c = wmask[sel], rmask[sel], cmask[sel]
                    elif v._dtype is None:
                        w, r, c = v._strided(wmask), v._strided(rmask), v._strided(cmask)
                    else:
                        w, r, c = wmask, rmask, cmask
                    others = np.uint8(~bit & 0xFF)
                    # a read conflicts with another program's writes that changed values; a
                    # write conflicts with another program's reads and writes unless it
                    # leaves the values as they were (then every order gives the same memory
                    # and the same reads: e.g. both programs zeroing a buffer, or copying a
                    # tensor onto itself)
                    clash = np.bitwise_and((w | r) if writing else c, others)
                    settled = changed = None
                    now = None
                    if writing:
                        # this write's values (as stored; else the memory now) against the
                        # memory as the recorded accesses left it
                        stored = self._written.get((program, id(v)))
                        now = stored[1] if stored is not None and stored[0] is v else \
                            np.array(self._values(v, alloc.data, sel))
                        before = self._values(v, seen, sel)
                        same = (now == before) | ((now != now) & (before != before))
                        changed = ~same
                        if clash.any():
                            settled = same & (np.bitwise_and(w, others) != 0)
                            clash = np.where(same, np.uint8(0), clash)
                    if clash.any():
                        first = tuple(int(i) for i in np.argwhere(clash)[0])
                        peer = int(np.log2(int(clash[first]) & -int(clash[first])))
                        what = "writes" if writing else "reads"
                        raise RaceError(
                            f"program {program}, {label}: {what} elements of shared_hbm tensor "
                            f"{v.alloc.label()} (first at view index {first}) that program {peer} "
                            f"{who.get(peer, 'accessed')} with no nisa.core_barrier or nisa.sendrecv "
                            f"between them: on the device the result depends on timing")
                    if sel is not None:
                        target = wmask if writing else rmask
                        target[sel] |= bit
                        if writing:
                            cmask[sel[changed]] |= bit
                        if settled is not None:
                            wmask[sel[settled]] = 0
                            cmask[sel[settled]] &= np.uint8(bit)
                    else:
                        (w if writing else r)[...] |= bit
                        if writing:
                            c[...] |= np.where(changed, bit, np.uint8(0)).astype(np.uint8)
                        if settled is not None:
                            (w if v._dtype is None else wmask)[settled] = 0
                            cc = c if v._dtype is None else cmask
                            cc[settled] &= np.uint8(bit)
                    if writing:
                        self._store(v, seen, now, sel)
                    who[program] = f"{'wrote' if writing else 'read'} in {label}"
                if writing and self._unwritten:
                    self._check_read_before_write(program, label, v)

    @staticmethod
    def _values(v: NkiTensor, flat: np.ndarray, sel: Any) -> np.ndarray:
        if sel is not None:
            return flat[sel]
        if v._dtype is None:
            return np.array(v._strided(flat))
        return flat

    @staticmethod
    def _store(v: NkiTensor, seen: np.ndarray, values: np.ndarray, sel: Any) -> None:
        """Record ``values`` (shaped as ``_values`` gives them) as the view's memory."""
        if sel is not None:
            seen[sel] = values
        elif v._dtype is None:
            v._strided(seen)[...] = values
        else:
            seen[...] = values

    def _check_read_before_write(self, program: int, label: str, v: NkiTensor) -> None:
        for prog, _, msg, rv, mask in self._unwritten:
            if prog == program or rv.alloc is not v.alloc:
                continue
            probe = np.zeros(v.alloc.size, dtype=bool)
            if rv._rows is not None:
                probe[rv._gather_index()[mask]] = True
            elif rv._dtype is None:
                rv._strided(probe)[...] = mask
            else:
                probe[...] = True
            hit = probe[v._gather_index()] if v._rows is not None else \
                (v._strided(probe) if v._dtype is None else probe)
            if hit.any():
                raise RaceError(
                    f"program {program}, {label}: writes elements of shared_hbm tensor {v.alloc.label()} that "
                    f"program {prog} read before they were written, with no nisa.core_barrier or "
                    f"nisa.sendrecv between them (the read: {msg.split(': ', 1)[0]})")

    def synchronised(self) -> None:
        """Every program passed a barrier: earlier accesses are ordered before later ones."""
        self.check_unwritten()
        with self._lock:
            for _, wmask, rmask, cmask, who, _ in self._tracked.values():
                wmask.fill(0)
                rmask.fill(0)
                cmask.fill(0)
                who.clear()
