"""Addresses of on-chip memory (SBUF, PSUM) as the compiler assigns them: first fit, loop-body
tiles rotating through physical slots, and the hazards that memory reuse carries."""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

from . import rates


class OnChipSpace:
    """Addresses in one on-chip buffer (bytes per partition of SBUF or PSUM).

    A tile allocated at one place of the kernel (its allocation site: the source line, and
    its size) that runs again, as a tile declared in a loop body does, gets its addresses
    the way the Neuron compiler assigns them: the compiler "decides how many physical tiles
    are allocated to each tensor" and reuses, "or rotates, the same physical tiles across
    the loop iterations" so that DMA and compute engines overlap ("NKI Direct Allocation
    Developer Guide", Neuron SDK 2.26). Here each site has a ring of physical slots: a new
    tile of the site takes a fresh slot (first fit) until the site has
    ``rates.ROTATION_BUFFERS`` x L slots, L the most tiles of the site live at once, and
    then the free slot of the site whose last reader finished first; slots stay the site's
    (a slot whose tile is still live is never taken). L counts Python's view of liveness:
    a tile rebound each iteration (``t = nl.ndarray(...)`` in a loop body) is still
    referenced when its successor is allocated, so L = 2 there, while a list of k tiles
    emptied before the next iteration's k allocations has L = k.
    Memory reuse carries hazards: a tile placed in a slot, or over a freed range, cannot
    be accessed before the last instruction that read or wrote the memory's earlier tile
    ended (write-after-read/write on the reused memory). Allocations that do not fit (the
    capacity check counts bytes and reports over-capacity separately) go past the end and
    inherit nothing.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used: dict[int, tuple[int, int]] = {}  # alloc id (or -slot key) -> [lo, hi)
        self.released: list[tuple[int, int, float]] = []  # freed ranges and their last access end
        self.sites: dict[Any, list[list]] = {}  # site -> slots [lo, hi, occupant id or None, last use, key]
        self.slot_of: dict[int, list] = {}
        self.peak: dict[Any, int] = {}  # site -> most of its tiles live at once (the new one counted)
        self._keys = itertools.count(1)

    def place(self, aid: int, size: int, site: Any = None) -> float:
        """Give ``aid`` an address range of ``size``; return the time its memory is free."""
        slots = self.sites.setdefault((site, size), []) if site is not None else None
        if slots is not None:
            live = 1 + sum(1 for sl in slots if sl[2] is not None)
            self.peak[(site, size)] = peak = max(self.peak.get((site, size), 0), live)
        if slots is not None and len(slots) >= rates.ROTATION_BUFFERS * peak:
            free = [sl for sl in slots if sl[2] is None]
            if free:
                slot = min(free, key=lambda sl: sl[3])
                self.used.pop(-slot[4], None)
                slot[2] = aid
                self.used[aid] = (slot[0], slot[1])
                self.slot_of[aid] = slot
                return slot[3] if slot[1] <= self.capacity else 0.0
        spans = sorted(self.used.values())
        lo = 0
        for a, b in spans:
            if a - lo >= size:
                break
            lo = max(lo, b)
        hi = lo + size
        self.used[aid] = (lo, hi)
        if slots is not None:
            slot = [lo, hi, aid, 0.0, next(self._keys)]
            slots.append(slot)
            self.slot_of[aid] = slot
        if hi > self.capacity:
            return 0.0
        return max((t for a, b, t in self.released if a < hi and lo < b), default=0.0)

    def release(self, aid: int, last_use: float) -> None:
        span = self.used.pop(aid, None)
        slot = self.slot_of.pop(aid, None)
        if slot is not None:  # the range stays the site's
            slot[2], slot[3] = None, max(slot[3], last_use)
            self.used[-slot[4]] = (slot[0], slot[1])
            return
        if span is None or span[1] > self.capacity:
            return
        lo, hi = span
        self.released = [(a, b, t) for a, b, t in self.released if not (lo <= a and b <= hi and t <= last_use)]
        if last_use > 0:
            self.released.append((lo, hi, last_use))


_SIM_DIR = os.path.dirname(os.path.abspath(__file__))


def allocation_site() -> tuple[str, int] | None:
    """(file, line) of the kernel code that allocates: the first caller outside the simulator."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SIM_DIR):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else None
