"""All-to-all on the two directions of a ring: store and forward on `collective_permute_implicit`.

``ncc.all_to_all`` leaves the links to the runtime. On a ring (a torus ring, or the ring
of an EP group placed along one), the exchange can instead run on the ring's two
directions as explicit channels, like the TP kernels' rings: channel 0 forward (to the
successor), channel 1 backward ("nki.collectives.collective_permute_implicit": every rank
sends to its ring neighbour on each channel).

Schedule, for ``ep`` ranks at ring position p. Each block (what p sends to one position)
travels in two halves, cut along one axis, so that both directions carry the same bytes:
- the halves of the blocks for p + d (1 <= d <= (ep - 1) // 2) go d hops forward, those
  for p - d d hops backward; with ep even, the block for p + ep/2 sends its first half
  forward and its second backward. These are the pieces of the two directions
  (`pieces`), nearest first, in one tensor per direction.
- Step t (1 <= t <= ep // 2) sends on each channel every piece that has not reached its
  destination: the stage at t = 1, else what arrived at t - 1 without the pieces that
  were for that rank. A rank keeps the pieces of distance t that arrive at step t.

Link time per direction, with P = ep - 1 pieces of b/2 bytes at the first step (b the
block): sum over t of (P - 2(t - 1)) * b/2 / B, plus ep // 2 hop latencies a. For ep = 8:
(7 + 5 + 3 + 1) * b/2 / B = 8 b / B + 4 a, against ``ncc.all_to_all`` on a full-bisection
link (``rates.LinkModel``): 7 (b / B + a). No schedule on a ring moves less: a cut into
two arcs of ep/2 ranks is crossed by ep^2/4 blocks each way over two links, ep^2/8 blocks
per link and direction (8 for ep = 8), which is what store and forward sends, in ep/2 hop
latencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from trnopt.kernels.nki_api import ncc, nisa, nl
from trnopt.kernels.ring import position_after

CHANNELS = (0, 1)  # forward, backward (the simulator: even channels forward, odd backward)


@dataclass(frozen=True)
class Piece:
    """Half ``half`` (0: first, 1: second along the cut axis) of the block for the rank
    ``distance`` hops away in the direction of travel."""

    distance: int
    half: int


def pieces(ep: int, direction: int) -> list[Piece]:
    """The pieces one direction (0 forward, 1 backward) carries from its stage, nearest first."""
    out = [Piece(d, q) for d in range(1, (ep - 1) // 2 + 1) for q in (0, 1)]
    if ep % 2 == 0:
        out.append(Piece(ep // 2, direction))
    return out


def in_flight(ep: int, direction: int, step: int) -> int:
    """Index in `pieces` of the first piece still travelling at ``step`` (0: the stage)."""
    return next((i for i, p in enumerate(pieces(ep, direction)) if p.distance >= max(step, 1)),
                len(pieces(ep, direction)))


def steps(ep: int) -> int:
    """Ring steps of the exchange: ep // 2 (the farthest piece's distance)."""
    return ep // 2


class RingExchange:
    """The buffers and steps of ring all-to-alls of ``rounds`` rounds of blocks of ``shape``.

    Per direction, private-HBM buffers [rounds, pieces, *half] (``half``: ``shape`` with
    axis ``axis`` halved): the stage (every piece, step 0) and what arrives at each step
    (the pieces still travelling). ``box`` arguments restrict a pass to part of every block,
    one slice or index per block axis (None: whole); the cut axis must stay whole.

    Args:
        ep: ranks of the ring; rg: its ReplicaGroup (list order is ring order).
        rounds: independent exchanges (e.g. pipeline sub-chunks), each its own buffers.
        shape: one block; axis: the axis halved (its size must be even).
        dtype, name: of the buffers.
        lists: for each channel (0, 1), the direction whose pieces it carries (0 forward,
            1 backward): (0, 1) sends each direction's pieces its own way; (1, 0) sends
            them back the way they came (the combine of a dispatch).
    """

    def __init__(self, ep: int, rg: Any, rounds: int, shape: Sequence[int], axis: int, dtype: Any, name: str,
                 lists: tuple[int, int] = (0, 1)) -> None:
        assert ep >= 2, f"{name}: ring all-to-all needs ep >= 2, got {ep}"
        assert shape[axis] % 2 == 0, (
            f"{name}: the ring all-to-all halves axis {axis} of each block; expected an even size, got {shape[axis]}")
        self.ep, self.rg, self.axis, self.lists = ep, rg, axis, lists
        self.half = tuple(n // 2 if i == axis else n for i, n in enumerate(shape))
        self.bufs = [[nl.ndarray((rounds, len(pieces(ep, d)) - in_flight(ep, d, t)) + self.half, dtype=dtype,
                                 buffer=nl.private_hbm, name=f"{name}{d}_{t}") for t in range(steps(ep) + 1)]
                     for d in range(2)]

    def _view(self, d: int, t: int, r: int, i0: int, i1: int | None, box: Sequence[Any]) -> Any:
        idx = [slice(0, n) if b is None else b for n, b in zip(self.half, box)]
        first = slice(i0, i1) if i1 is not None else i0
        return self.bufs[d][t][(r, first, *idx)]

    def stage(self, d: int, r: int, piece: int, box: Sequence[Any]) -> Any:
        """Piece ``piece`` (index in `pieces`) of direction ``d``'s stage, round ``r``."""
        return self._view(d, 0, r, piece, None, box)

    def run(self, r: int, box: Sequence[Any], name: str) -> None:
        """The ring steps of round ``r`` over ``box``."""
        for t in range(1, steps(self.ep) + 1):
            self.step(r, box, t, name)

    def step(self, r: int, box: Sequence[Any], t: int, name: str) -> None:
        """Ring step ``t`` of round ``r`` over ``box``: each channel sends what is still travelling."""
        srcs, dsts = [], []
        for d in self.lists:
            lo = in_flight(self.ep, d, t) - in_flight(self.ep, d, t - 1)
            srcs.append([self._view(d, t - 1, r, lo, self.bufs[d][t - 1].shape[1], box)])
            dsts.append([self._view(d, t, r, 0, self.bufs[d][t].shape[1], box)])
        ncc.collective_permute_implicit(srcs_by_channel=srcs, dsts_by_channel=dsts, replica_group=self.rg,
                                        channel_ids=list(CHANNELS), name=f"{name}_t{t}")

    def arrivals(self, d: int, r: int, box: Sequence[Any]) -> list[tuple[int, Piece, Any]]:
        """``(step, piece, view)`` of the pieces of direction ``d`` that end at this rank, in
        order of arrival (a piece of distance t arrives at step t)."""
        return [(t, p, self._view(d, t, r, i, None, box)) for t in range(1, steps(self.ep) + 1)
                for i, p in enumerate(self._ending(d, t))]

    def landed(self, d: int, r: int, t: int, box: Sequence[Any]) -> tuple[list[Piece], Any]:
        """The pieces of direction ``d`` that end at this rank at step ``t`` (both halves of
        a block, or the one half of the opposite block) and their view, [pieces, *box], the
        first in the step's buffer."""
        ps = self._ending(d, t)
        return ps, self._view(d, t, r, 0, len(ps), box)

    def _ending(self, d: int, t: int) -> list[Piece]:
        """The pieces of direction ``d`` of distance ``t``: the first of step t's buffer."""
        return [p for p in pieces(self.ep, d)[in_flight(self.ep, d, t):] if p.distance == t]

    def cut(self, view_of_block: Callable[[slice], Any], piece: Piece) -> Any:
        """The half ``piece.half`` of a block, given a function from a slice of the cut axis
        to the block's view."""
        h = self.half[self.axis]
        return view_of_block(slice(piece.half * h, (piece.half + 1) * h))


def destination(pos: Any, ep: int, direction: int, distance: int) -> Any:
    """Ring position ``distance`` hops from ``pos`` forward (direction 0) or backward (1):
    where data comes from after ``distance`` steps on the other direction's channel
    (`ring.position_after`, register arithmetic)."""
    return position_after(pos, distance, ep, 1 - direction)


def ring_all_to_all(src: Any, dst: Any, ex: RingExchange, r: int, pos: Any, block: Callable[[Any, Any, slice], Any],
                    name: str) -> None:
    """``dst[j] = (position j's src)[me]`` over the whole blocks of round ``r``, as
    ``ncc.all_to_all`` with collective_dim 0: stage, ring steps, placement.

    ``block(t, j, cut)`` is the view of block j of tensor t restricted to ``cut`` on the
    cut axis (j may be a register)."""
    whole = [None] * len(ex.half)
    for d in range(2):
        for i, p in enumerate(pieces(ex.ep, d)):
            j = destination(pos, ex.ep, d, p.distance)
            nisa.dma_copy(dst=ex.stage(d, r, i, whole), src=ex.cut(lambda c, j=j: block(src, j, c), p),
                          name=f"{name}_stage")
    own = slice(0, 2 * ex.half[ex.axis])
    nisa.dma_copy(dst=block(dst, pos, own), src=block(src, pos, own), name=f"{name}_own")
    ex.run(r, whole, name)
    for d in range(2):
        for t, p, view in ex.arrivals(d, r, whole):
            j = destination(pos, ex.ep, 1 - d, t)  # the piece came t hops from the other side
            nisa.dma_copy(dst=ex.cut(lambda c, j=j: block(dst, j, c), p), src=view, name=f"{name}_out")
