"""The ring all-to-all's schedule (`trnopt.kernels.ring_alltoall`) and the ring burst rule."""

from __future__ import annotations

import pytest

from trnopt.kernels.ring import burst_bytes
from trnopt.kernels.ring_alltoall import Piece, in_flight, pieces, steps


@pytest.mark.parametrize("ep", [2, 3, 4, 5, 6, 7, 8, 16])
def test_every_half_block_travels_once_the_shorter_way(ep):
    sent = {}
    for d in (0, 1):
        for p in pieces(ep, d):
            dest = (p.distance if d == 0 else -p.distance) % ep
            assert (dest, p.half) not in sent, f"ep={ep}: half {p.half} for +{dest} sent twice"
            sent[(dest, p.half)] = p.distance
            assert p.distance <= ep // 2
    assert set(sent) == {(j, q) for j in range(1, ep) for q in (0, 1)}


@pytest.mark.parametrize("ep", [2, 3, 4, 5, 8, 16])
def test_both_directions_carry_the_bisection_bytes(ep):
    """Each direction's link carries sum over steps of the pieces still travelling:
    ep^2/4 halves (ep^2/8 blocks: a cut's ep^2/4 blocks each way over two links), and
    both directions the same."""
    for d in (0, 1):
        carried = sum(len(pieces(ep, d)) - in_flight(ep, d, t) for t in range(1, steps(ep) + 1))
        assert carried == ep * ep // 4
    assert len(pieces(ep, 0)) == len(pieces(ep, 1)) == ep - 1


def test_pieces_nearest_first_and_the_opposite_half_each_way():
    assert pieces(4, 0) == [Piece(1, 0), Piece(1, 1), Piece(2, 0)]
    assert pieces(4, 1) == [Piece(1, 0), Piece(1, 1), Piece(2, 1)]
    assert pieces(5, 1) == [Piece(1, 0), Piece(1, 1), Piece(2, 0), Piece(2, 1)]
    assert [in_flight(8, 0, t) for t in range(5)] == [0, 0, 2, 4, 6]


def test_burst_bytes_is_one_k_block_iteration_of_the_cores_dma():
    # 1024 rows = 8 row tiles, 8 K tiles, 512 columns: 8 * 8 * 512 cycles at 2.4 GHz = 13.65 us;
    # at 368 GB/s shared by two channels: 2.51 MB each
    assert burst_bytes(1024, 8, 512) == int(8 * 8 * 512 / 2.4e9 * 368e9 / 2)
    assert burst_bytes(1024, 8, 512, channels=1) == int(8 * 8 * 512 / 2.4e9 * 368e9)
