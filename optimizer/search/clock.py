"""The search's wall clock, read in this one place and only for the --time-limit safety stop.

Work budgets, never wall time, decide between layouts (search/branch.py); a test replaces
``CLOCK`` with one that runs fast, as on a slow machine, and checks that the answer does
not change.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

CLOCK = time.perf_counter  # the search's wall clock, in seconds; the only one it reads (tests replace it)


def clock() -> float:
    """Seconds on the search's wall clock (``CLOCK``): for the safety stop only, never to choose a layout."""
    return CLOCK()


class SafetyStop(Exception):
    """The wall-clock safety stop (--time-limit) passed during a step that cannot check it (a model's build)."""


@contextlib.contextmanager
def interruptible(deadline: float):
    """Raise SafetyStop in the block when ``deadline`` (on ``clock``) passes: a timer signal
    interrupts pure-Python work such as building a LayoutModel, which checks no clock (at
    1,600 UltraServers one build outlasted a 120 s limit by 45 s). Outside the main thread
    (where signals cannot be caught) the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    left = deadline - clock()
    if left <= 0:
        raise SafetyStop

    def stop(*_):
        raise SafetyStop

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
