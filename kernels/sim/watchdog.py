"""Bounding a run in time: the caller waits for the rank threads, never forever.

A rank stuck in its own Python (an endless loop, a sleep, a lock) issues no instruction.
``wait`` joins the threads and fails the run once no participant has issued an
instruction or finished for ``timeout_s`` seconds, naming each stalled participant, the
kernel line it is executing (from its thread's current frame) and the measured length of
the stall (reported GRACE_S after timeout_s, so that a rank waiting at a collective for the
stalled one reports first, naming the collective). Participants blocked in a collective are reported by the rendezvous itself.
The stalled threads are daemons and are left behind; the run's rendezvous is aborted so
that every other thread stops at its next instruction or collective. A thread stopped in
a debugger (``breakpoint()``, an IDE: its frames carry a trace function) is not stalled:
while one is, no time limit runs.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .errors import SimulatorError

POLL_S = 0.2  # the caller wakes this often to look for a stall (each wake takes the GIL)
GRACE_S = 0.5  # a rank waiting in a collective reports the stall itself, with the collective named


class StallError(SimulatorError):
    """No rank made progress for the run's timeout."""


class RunTimeLimitError(SimulatorError):
    """The run was still going at its deadline (``runner.time_limit``): stopped, not failed."""


def _innermost_user_frame(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "trnopt/kernels/sim/" not in name and "/threading.py" not in name:
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "an unknown line"


def _is_debugger(trace: object) -> bool:
    owner = getattr(trace, "__self__", trace)
    mod = type(owner).__module__ or ""
    return any(mod.startswith(m) for m in ("bdb", "pdb", "pydevd", "_pydevd", "debugpy")) or \
        any(c.__name__ == "Bdb" for c in type(owner).__mro__)


def debugging() -> bool:
    """True while some thread is stopped in a debugger (pdb / breakpoint(), pydevd, debugpy:
    a frame whose trace function belongs to one; a coverage tracer does not count)."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_trace is not None and _is_debugger(frame.f_trace):
                return True
            frame = frame.f_back
    return False


def wait(threads: dict[Any, threading.Thread], contexts: dict[Any, Any], rdv: Any, timeout_s: float,
         deadline: float | None = None) -> None:
    """Join ``threads``; raise StallError after ``timeout_s`` seconds without progress, and
    RunTimeLimitError once ``time.monotonic()`` passes ``deadline`` (None: no deadline); either
    aborts the rendezvous, so every rank stops at its next instruction or collective."""
    def progress() -> int:
        return sum(c.timeline.issued for c in contexts.values()) + sum(not t.is_alive() for t in threads.values())

    last, since = progress(), time.monotonic()
    while True:
        alive = [p for p, t in threads.items() if t.is_alive()]
        if not alive:
            return
        threads[alive[0]].join(POLL_S)
        now, seen = time.monotonic(), progress()
        if deadline is not None and now > deadline and rdv.error is None and not debugging():
            err = RunTimeLimitError(f"stopped at its time limit with {len(alive)} of {len(threads)} rank "
                                    f"program(s) still running ({progress()} instructions issued)")
            rdv.abort(err)
            raise err
        if seen != last or debugging():
            last, since = seen, now
            continue
        if rdv.error is not None:
            # a failure was reported; give the others a moment to stop, then leave them
            if now - since > min(timeout_s, 1.0):
                return
            continue
        if now - since > timeout_s + GRACE_S:
            stalled = [p for p in alive if not rdv.is_blocked(p)]
            lines = [f"  rank {p[0]}" + (f" (program {p[1]})" if p[1] else "") + f" at "
                     f"{_innermost_user_frame(threads[p])}" for p in stalled or alive]
            err = StallError(
                f"no rank issued an instruction for {now - since:.1f} s (timeout_s={timeout_s:g}); "
                f"stalled in kernel code:\n" + "\n".join(lines))
            rdv.abort(err)
            raise err
