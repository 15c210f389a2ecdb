"""The overlap kernels at LNC 2: the two physical cores of a rank split every kernel's work.

Each kernel runs with data on both programs of every rank and is compared with its
reference (the simulator refuses any shared element both programs touch without a
barrier, so a wrong split fails as a race or as a wrong result); the schedules show each
core doing half the matmul, and the two cores sharing the rank's links.
"""

from __future__ import annotations

import pytest

from trnopt.kernels.allgather_matmul import ring_calls
from trnopt.kernels.overlap import REGISTRY, launches, measure, run
from trnopt.kernels.sim import LinkModel, TensorSpec, run_ranks
from trnopt.kernels.tiling import matmul

LINK = LinkModel(256e9, 1.5e-6)

CASES = [
    ("allgather_matmul", {"m": 64 * 4, "k": 256, "n": 128}, 4, 2),
    ("allgather_matmul", {"m": 36 * 3, "k": 200, "n": 96}, 3, 1),   # ragged rows, K and N; one channel
    ("allgather_matmul", {"m": 8 * 8, "k": 256, "n": 64}, 8, 2),    # small shards: the SBUF ring, two per call
    ("matmul_reduce_scatter", {"m": 64 * 4, "k": 128, "n": 256}, 4, 2),
    ("matmul_reduce_scatter", {"m": 20 * 3, "k": 96, "n": 300}, 3, 1),  # ragged
    ("alltoall_expert_matmul", {"tokens": 32 * 4, "h": 128, "f": 128, "e_local": 2, "n_sub": 2}, 4, 1),
    # the ring variant: halves of each core's slots each way, ragged H and F, odd and even rings
    ("alltoall_expert_matmul", {"tokens": 32 * 4, "h": 130, "f": 96, "e_local": 2, "n_sub": 2}, 4, 2),
    ("alltoall_expert_matmul", {"tokens": 32 * 3, "h": 130, "f": 96, "e_local": 1, "n_sub": 2}, 3, 2),
]


@pytest.mark.parametrize("kernel,shape,tp,channels", CASES, ids=lambda v: str(v))
def test_every_kernel_matches_its_reference_at_lnc2(kernel, shape, tp, channels, dtypes):
    r = measure(kernel, shape, tp=tp, channels=channels, link=LINK, dtype=dtypes["bf16"], numerics=True, seed=3,
                lnc=2)
    assert r.ok, f"{kernel} at LNC 2: max |err|/scale {r.max_err:.2e}"


@pytest.mark.parametrize("split", ["rows", "cols"])
def test_each_core_does_half_the_matmul(split, dtypes):
    x, w = TensorSpec((512, 1024), dtypes["bf16"]), TensorSpec((512, 1024), dtypes["bf16"])
    one = run_ranks(matmul, [(x, w)], numerics=False, lnc=1, kwargs={"split": split}).timeline
    two = run_ranks(matmul, [(x, w)], numerics=False, lnc=2, kwargs={"split": split}).timeline
    busy = [c.busy["Tensor"] for c in two.cores]
    assert len(busy) == 2 and busy[0] == pytest.approx(busy[1])
    assert busy[0] == pytest.approx(one.cores[0].busy["Tensor"] / 2, rel=0.02)


def test_the_baseline_splits_as_its_kernel_does():
    rs = launches("matmul_reduce_scatter", {"m": 256, "k": 128, "n": 256}, tp=4)
    ag = launches("allgather_matmul", {"m": 256, "k": 128, "n": 256}, tp=4)
    assert rs.mm.kwargs["split"] == "cols"  # each core its columns: W is the larger operand
    assert ag.mm.kwargs.get("split", "rows") == "rows"


def test_the_two_cores_share_the_ranks_link():
    """A ring of whole-chunk permutes: at LNC 2 each core sends half the bytes at half the
    bandwidth, so the link time per core equals LNC 1's; the DMA share halves."""
    lx = launches("allgather_matmul", {"m": 1024, "k": 1024, "n": 128}, tp=4, channels=2)
    link = LinkModel(64e9, 0.0)  # slow enough that the link, not the DMA, sets the collective's time
    one, two = (run(lx.cc, link=link, lnc=lnc).timeline for lnc in (1, 2))
    cc1 = one.cores[0].busy["CC0"]
    cc2 = [c.busy["CC0"] for c in two.cores[:2]]
    assert cc2[0] == pytest.approx(cc1, rel=0.05) and cc2[1] == pytest.approx(cc1, rel=0.05)


def test_ring_calls_cover_every_step_once_the_first_alone():
    assert [list(c) for c in ring_calls(5, 1)] == [[0], [1], [2], [3], [4]]
    assert [list(c) for c in ring_calls(6, 2)] == [[0], [1, 2], [3, 4], [5]]
    for tp in range(1, 9):
        assert [s for c in ring_calls(tp, 2) for s in c] == list(range(tp))


def test_a_kernel_refuses_more_programs_than_rows(dtypes):
    with pytest.raises(AssertionError, match="programs"):
        measure("matmul_reduce_scatter", {"m": 4, "k": 128, "n": 1}, tp=4, link=LINK, dtype=dtypes["bf16"],
                numerics=True, lnc=2)


def test_registry_kernels_all_run_at_lnc2():
    assert {c[0] for c in CASES} == set(REGISTRY)
