"""Errors raised by the simulator.

Every message names the instruction (op name, and ``name=`` when the kernel gave one),
the rank, and the rule broken with the numbers involved.
"""

from __future__ import annotations


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""


class ConstraintError(SimulatorError):
    """A hardware or API rule was broken (capacity, layout, placement, dtype, bounds)."""


class UninitializedReadError(SimulatorError):
    """An instruction read memory that nothing had written (it holds NaN on a fresh tensor)."""


class CollectiveMismatchError(SimulatorError):
    """Ranks of one replica group issued different collectives, or one waited on a peer that never came."""


class SymmetryError(SimulatorError):
    """A symmetric run (``run_ranks(symmetric=True)``) met something that breaks the symmetry
    it assumes (different arguments per rank, numerics, uneven or partial replica groups,
    an explicit permute that is not a permutation of all ranks)."""


class _Aborted(BaseException):
    """Raised inside the other rank threads once one rank has failed; never escapes run_ranks."""


def where(rank: int | None, op: str, name: str | None = None, program: int = 0) -> str:
    """The "rank 3, nc_matmul(name='mm0')" prefix of every message."""
    label = f"{op}(name={name!r})" if name else op
    who = "outside any rank" if rank is None else f"rank {rank}"
    if program:
        who += f" (program {program})"
    return f"{who}, {label}"
