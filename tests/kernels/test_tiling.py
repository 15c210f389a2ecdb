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
