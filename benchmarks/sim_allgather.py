"""How long simulating a TP=16 all-gather of a 4096 x 4096 BF16 tensor takes on this machine.

Two kernels, each run by ``trnopt.kernels.sim.run_ranks`` with 16 ranks (each holding a
256 x 4096 shard): one ``ncc.all_gather`` call, and a ring of 15
``collective_permute_implicit`` steps that DMA each received chunk into place. Both are
timed with numerics on (data checked against NumPy) and off (schedule only). Goal: under
10 s wall time with numerics. Also prints the simulated kernel time.

Then the production shape of ``allgather_matmul_timings(8192, 16384, 1024, tp=16,
dtype=bfloat16, link=256 GB/s + 1.5 us, channels=2, numerics=False)``: its three variants
(T_mm ``tiling.matmul`` on one rank, T_cc ``allgather_ring``, T_f ``allgather_matmul``,
~23K instructions per rank) each run with every rank simulated (``symmetric=False``) and
with rank 0 only (``symmetric=True``), wall times side by side and the timelines compared.

    /work/venv/bin/python benchmarks/sim_allgather.py            # both parts
    /work/venv/bin/python benchmarks/sim_allgather.py --full     # production shape only
    /work/venv/bin/python benchmarks/sim_allgather.py --baseline DIR [--rounds N]
        # the current simulator and an older one side by side: DIR holds a ``trnopt`` package
        # (e.g. a worktree of an earlier commit); N rounds (default 3) alternate old and new,
        # each a fresh process, and the ratio new/old of their CPU seconds is printed per round

Every time is printed as wall seconds and CPU seconds of this process (all threads); on a
shared, loaded machine compare the CPU columns of two runs made side by side.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

from trnopt.kernels.allgather_matmul import allgather_matmul, allgather_ring
from trnopt.kernels.nki_api import USING_REAL_NKI, nki, ncc, nisa, nl
from trnopt.kernels.sim import LinkModel, TensorSpec, run_ranks
from trnopt.kernels.tiling import matmul

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


def production_shape() -> bool:
    """The three variants of allgather_matmul_timings at 405B TP16 shapes, full vs symmetric."""
    m, k, n, tp, channels = 8192, 16384, 1024, 16, 2
    bf16 = np.dtype(ml_dtypes.bfloat16)
    link = LinkModel(256e9, 1.5e-6)
    ms = m // tp
    kw = {"groups": (tuple(range(tp)),), "channels": channels}
    variants = [
        ("T_mm matmul", matmul, [(TensorSpec((k, m), bf16), TensorSpec((k, n), bf16))], {}),
        ("T_cc allgather_ring", allgather_ring, [(TensorSpec((k, ms), bf16),)] * tp, kw),
        ("T_f allgather_matmul", allgather_matmul, [(TensorSpec((k, ms), bf16), TensorSpec((k, n), bf16))] * tp, kw),
    ]
    print(f"\nallgather_matmul_timings({m}, {k}, {n}, tp={tp}, bf16, 256 GB/s + 1.5 us, channels={channels}, "
          f"numerics=False): each variant with all ranks simulated vs rank 0 only")
    print(f"{'variant':<22}{'ranks':>6}{'instr/rank':>11}{'full s':>9}{'symm s':>9}{'speed-up':>9}"
          f"{'kernel us':>12}  same timeline")
    total_full = total_sym = 0.0
    ok_all = True
    for label, kernel, args, kwargs in variants:
        walls, cpus, res = [], [], []
        for sym in (False, True):
            c0 = time.process_time()
            t0 = time.perf_counter()
            res.append(run_ranks(kernel, args, numerics=False, link=link, kwargs=kwargs, symmetric=sym and len(args) > 1,
                                 timeout_s=60))
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        full, symm = res
        same = (full.timeline.total_s == symm.timeline.total_s and full.timeline.busy_s == symm.timeline.busy_s
                and full.timeline.exposed_comm_s == symm.timeline.exposed_comm_s)
        ok_all &= same
        total_full += walls[0]
        total_sym += walls[1]
        n_instr = sum(full.timeline.cores[0].counts.values())
        print(f"{label:<22}{len(args):>6}{n_instr:>11}{walls[0]:9.2f}{walls[1]:9.2f}{walls[0] / walls[1]:8.1f}x"
              f"{full.timeline.total_s * 1e6:12.1f}  {same}   cpu s {cpus[0]:.2f} / {cpus[1]:.2f}")
        del res, full, symm
    print(f"{'all three':<39}{total_full:9.2f}{total_sym:9.2f}{total_full / total_sym:8.1f}x")
    return ok_all


def main() -> int:
    if "--baseline" in sys.argv[1:]:
        return _with_baseline()
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        return _main()
    finally:
        # read by _with_baseline: the whole benchmark's CPU and wall seconds in this process
        print(f"TOTAL cpu s {time.process_time() - c0:.3f} wall s {time.perf_counter() - t0:.3f}", flush=True)


def _main() -> int:
    print(f"python {sys.version.split()[0]} on {platform.platform()}, {os.cpu_count()} CPUs, "
          f"numpy {np.__version__}, real nki: {USING_REAL_NKI}")
    if "--full" in sys.argv[1:]:
        return 0 if production_shape() else 1
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
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = run_ranks(kernel, shards if numerics else specs, numerics=numerics,
                            kwargs=dict(tp=TP), timeout_s=60)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            ok = all(np.array_equal(o, full) for o in res.outputs) if numerics else "-"
            if numerics:
                worst = max(worst, wall)
            print(f"{kernel.__name__:<18}{str(numerics):>9}{wall:9.2f}{res.timeline.total_s * 1e6:14.1f}"
                  f"{res.timeline.exposed_comm_s * 1e6:12.1f}  {ok}   cpu s {cpu:.2f}")
            del res
    print(f"slowest numerics run {worst:.2f} s (goal < 10 s): {'OK' if worst < 10 else 'OVER'}")
    return 0 if production_shape() else 1


def _with_baseline() -> int:
    """The current simulator and the ``trnopt`` under DIR in alternating rounds; CPU ratio new/old."""
    import re
    import statistics
    import subprocess

    argv = sys.argv[1:]
    i = argv.index("--baseline")
    if i + 1 >= len(argv) or not os.path.isdir(os.path.join(argv[i + 1], "trnopt")):
        print("error: --baseline DIR needs a directory holding a trnopt package", file=sys.stderr)
        return 2
    base, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    rounds = 3
    if "--rounds" in rest:
        j = rest.index("--rounds")
        rounds = int(rest[j + 1])
        rest = rest[:j] + rest[j + 2:]
    env_new = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    envs = {"new": env_new, "old": {**env_new, "PYTHONPATH": base}}
    rc, ratios, walls = 0, [], []
    for r in range(rounds):
        got = {}
        # alternate which goes first so a load change on the machine hits both alike
        for label in (("old", "new") if r % 2 == 0 else ("new", "old")):
            p = subprocess.run([sys.executable, __file__, *rest], env=envs[label], capture_output=True, text=True)
            rc |= p.returncode
            m = re.search(r"^TOTAL cpu s ([0-9.]+) wall s ([0-9.]+)", p.stdout, re.M)
            if m is None:
                print(f"round {r + 1} {label}: no TOTAL line (exit {p.returncode})\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
                return 1
            got[label] = (float(m.group(1)), float(m.group(2)))
            if r == 0:
                print(f"===== {label} ({'baseline ' + base if label == 'old' else 'current simulator'})")
                print(p.stdout.rstrip(), flush=True)
        ratios.append(got["new"][0] / got["old"][0])
        walls.append(got["new"][1] / got["old"][1])
        print(f"round {r + 1}: cpu s new {got['new'][0]:.2f} old {got['old'][0]:.2f} ratio {ratios[-1]:.3f}; "
              f"wall ratio {walls[-1]:.3f}", flush=True)
    print(f"median cpu ratio new/old {statistics.median(ratios):.3f} over {rounds} rounds "
          f"(wall {statistics.median(walls):.3f}); goal <= 1.10")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
