"""Registers: rank ids are runtime values; register arithmetic and dynamic access patterns."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.sim import run_ranks
from trnopt.kernels.sim.registers import VirtualRegister


def test_python_cannot_look_at_a_register() -> None:
    r = VirtualRegister(3)
    for use in (lambda: bool(r), lambda: int(r), lambda: [0, 1, 2, 3][r], lambda: [0, 1, 2, 3].index(r),
                lambda: range(r), lambda: {r: 1}, lambda: r in [3]):
        with pytest.raises(TypeError):
            use()


def test_register_arithmetic_wraps_at_32_bits() -> None:
    r = VirtualRegister(7)
    assert ((r * 4 + 1) // 2 - 3).value() == 11
    assert (100 - r).value() == 93 and (-r).value() == -7 and (r % 4).value() == 3
    assert ((r << 2) | 1).value() == 29 and (r == 7).value() == 1 and (r < 2).value() == 0
    assert (VirtualRegister(2 ** 31 - 1) + 1).value() == -2 ** 31


@nki.jit
def place_by_rank(x):
    """Rank r writes its row at row r of the output: register offset in a dynamic access pattern."""
    n = 4
    out = nl.ndarray((n, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.memset(dst=(z := nl.ndarray((n, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)), value=0.0)
    nisa.dma_copy(dst=out, src=z)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = ncc.rank_id()
    nisa.dma_copy(dst=out[nl.ds(r, 1), :], src=t)
    slot = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    reg = nisa.register_alloc(0)
    nisa.register_move(reg, r * 10 + 1)
    nisa.register_store(slot, reg)
    back = nisa.register_alloc()
    nisa.register_load(back, slot)
    o2 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.register_store(o2, back)
    return out, o2


def test_rank_id_register_in_nl_ds_and_register_load_store() -> None:
    xs = [np.full((1, 3), r + 1, np.float32) for r in range(4)]
    res = run_ranks(place_by_rank, [(x,) for x in xs])
    for r, (out, o2) in enumerate(res.outputs):
        want = np.zeros((4, 3), np.float32)
        want[r] = r + 1
        np.testing.assert_array_equal(out, want)
        assert int(o2[0, 0]) == 10 * r + 1


@nki.jit
def ring_index_in_python(x):
    g = ncc.ReplicaGroup([[0, 1]])
    ring = [0, 1]
    return ring.index(ncc.collective_permute_implicit_current_processing_rank_id(1, g))


def test_indexing_a_python_list_with_the_processing_rank_fails_as_it_would_compile() -> None:
    with pytest.raises(TypeError, match="of a VirtualRegister"):
        run_ranks(ring_index_in_python, [(np.zeros((1, 1), np.float32),)] * 2)
