"""The matmul pipeline's issue order: what the Tensor Engine waits for goes first."""

import ml_dtypes
import numpy as np

from trnopt.kernels.sim import TensorSpec, run_ranks
from trnopt.kernels.tiling import choose_tiling, matmul


def test_a_groups_stores_go_after_the_next_loads():
    """Four PSUM groups of several K blocks each: every group's store is issued after its
    evacuation and after the loads of the next K-block iteration (the DMA queues serve in
    issue order, so a store issued first would hold those loads back); only the last
    group's store, at the flush, has no loads left to follow."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    m, k, n = 1024, 4096, 2048
    t = choose_tiling(m, k, n, 2, 2)
    assert -(-k // 128) > t.k_block, t  # several K blocks per group
    res = run_ranks(matmul, [(TensorSpec((k, m), bf16), TensorSpec((k, n), bf16))], numerics=False)
    seq = [i.name for i in res.timeline.cores[0].instructions if i.engine == "DMA" or i.name == "mm_evac"]
    stores = [j for j, name in enumerate(seq) if name == "mm_st"]
    assert len(stores) >= 4, seq
    for j in stores[:-1]:
        evac = max(i for i in range(j) if seq[i] == "mm_evac")
        assert any(seq[i].startswith("mm_ld") for i in range(evac + 1, j)), f"store {j} right after its evacuation"
    assert seq[stores[-1] - 1] == "mm_evac"


def test_a_third_staging_buffer_hides_the_loads_fixed_cost(monkeypatch):
    """x streamed in K blocks of 1024 rows whose matmul (8 x 8 x 256 cycles, 6.8 us) is
    shorter than a load's fixed cost plus its transfer (1.9 + 5.7 us): with two staging
    buffers the Tensor Engine waits on every block, with three the next load starts a
    block earlier. The tiling takes three where they fit, and counts them in its SBUF
    bytes."""
    import dataclasses

    from trnopt.kernels import tiling

    bf16 = np.dtype(ml_dtypes.bfloat16)
    m, k, n = 4096, 8192, 256
    t = choose_tiling(m, k, n, 2, 2)
    assert t.bufs == 3 and t.resident_w and not t.resident_x, t
    two = dataclasses.replace(t, bufs=2)
    assert t.sbuf_bytes(k, n, 2, 2) - two.sbuf_bytes(k, n, 2, 2) == t.k_block * t.m_tiles * 128 * 2
    args = [(TensorSpec((k, m), bf16), TensorSpec((k, n), bf16))]
    three_s = run_ranks(matmul, args, numerics=False).timeline.total_s
    real = tiling.choose_tiling
    monkeypatch.setattr(tiling, "choose_tiling", lambda *a, **kw: dataclasses.replace(real(*a, **kw), bufs=2))
    two_s = run_ranks(matmul, args, numerics=False).timeline.total_s
    assert three_s < 0.98 * two_s, (three_s, two_s)
