"""How long simulating a TP=16 all-gather of a 4096 x 4096 BF16 tensor takes on this machine.

Two kernels, each run by ``trnopt.kernels.sim.run_ranks`` with 16 ranks (each holding a
256 x 4096 shard): one ``ncc.all_gather`` call, and a ring of 15
``collective_permute_implicit`` steps that DMA each received chunk into place. Both are
timed with numerics on (data checked against NumPy) and off (schedule only). Goal: under
10 s wall time with numerics. Also prints the simulated kernel time.

    /work/venv/bin/python benchmarks/sim_allgather.py
"""

from __future__ import annotations

import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

from trnopt.kernels.nki_api import USING_REAL_NKI, nki, ncc, nisa, nl
from trnopt.kernels.sim import TensorSpec, run_ranks

TP, ROWS, COLS = 16, 4096, 4096


@nki.jit
def all_gather_once(x, tp):
    g = ncc.ReplicaGroup([list(range(tp))])
    rows, cols = x.shape
    src = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray((tp * rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    out = nl.ndarray((tp * rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@nki.jit
def all_gather_ring(x, tp):
    g = ncc.ReplicaGroup([list(range(tp))])
    rows, cols = x.shape
    out = nl.ndarray((tp * rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    bufs = [nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x)
    for i in range(tp):
        r = ncc.collective_permute_implicit_current_processing_rank_id(i, g)
        nisa.dma_copy(dst=out[r * rows:(r + 1) * rows, :], src=bufs[i % 2])
        if i < tp - 1:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[i % 2]]], dsts_by_channel=[[bufs[(i + 1) % 2]]],
                                            replica_group=g)
    return out


def main() -> int:
    print(f"python {sys.version.split()[0]} on {platform.platform()}, {os.cpu_count()} CPUs, "
          f"numpy {np.__version__}, real nki: {USING_REAL_NKI}")
    rng = np.random.default_rng(0)
    full = rng.standard_normal((ROWS, COLS), dtype=np.float32).astype(ml_dtypes.bfloat16)
    shard = ROWS // TP
    shards = [(full[r * shard:(r + 1) * shard],) for r in range(TP)]
    specs = [(TensorSpec((shard, COLS), ml_dtypes.bfloat16),)] * TP
    print(f"TP={TP} all-gather of {ROWS} x {COLS} BF16 ({full.nbytes / 2**20:.0f} MiB), "
          f"shards {shard} x {COLS}")
    print(f"{'kernel':<18}{'numerics':>9}{'wall s':>9}{'simulated us':>14}{'exposed us':>12}  correct")
    worst = 0.0
    for kernel in (all_gather_once, all_gather_ring):
        for numerics in (True, False):
            t0 = time.perf_counter()
            res = run_ranks(kernel, shards if numerics else specs, numerics=numerics,
                            kwargs=dict(tp=TP), timeout_s=60)
            wall = time.perf_counter() - t0
            ok = all(np.array_equal(o, full) for o in res.outputs) if numerics else "-"
            if numerics:
                worst = max(worst, wall)
            print(f"{kernel.__name__:<18}{str(numerics):>9}{wall:9.2f}{res.timeline.total_s * 1e6:14.1f}"
                  f"{res.timeline.exposed_comm_s * 1e6:12.1f}  {ok}")
            del res
    print(f"slowest numerics run {worst:.2f} s (goal < 10 s): {'OK' if worst < 10 else 'OVER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
