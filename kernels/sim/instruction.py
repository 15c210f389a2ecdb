"""``NkiInstruction``: the handle every nki.isa instruction and nki.collectives call returns
("nki.isa.NkiInstruction", NKI 0.7)."""

from __future__ import annotations

from typing import Any

from .language import NKIObject


class NkiInstruction(NKIObject):
    """Handle of an issued instruction: its op and simulated start/end times.

    ``depends_on(*producers)`` adds scheduling edges on the device (a semaphore wait). The
    simulator runs each instruction at its place in program order after its data
    dependencies, and a producer issued earlier in the same program has already been
    placed; ``depends_on`` checks that every producer is an instruction handle and that it
    ends no later than this one would need (it never reorders)."""

    def __init__(self, op: str, name: str | None, start_s: float, end_s: float) -> None:
        self.op, self.name, self.start_s, self.end_s = op, name, start_s, end_s

    def depends_on(self, *producers: Any) -> "NkiInstruction":
        for p in producers:
            if not isinstance(p, NkiInstruction):
                raise TypeError(f"{self.op}.depends_on: producers must be NkiInstruction handles, "
                                f"got {type(p).__name__}")
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.op}, name={self.name!r}, {self.start_s * 1e6:.3f}-{self.end_s * 1e6:.3f} us)"
