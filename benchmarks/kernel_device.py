"""Overlap of the trnopt kernels on a Trainium device, with the Neuron SDK.

Prints the table of benchmarks/kernel_overlap.py (T_mm, T_cc, T_f, hidden fraction,
speedup) from device wall-clock times. Without a Neuron device or without the Neuron SDK
(nki, torch-neuronx) it says so and exits 0.

    torchrun --nproc-per-node 16 benchmarks/kernel_device.py --tp 16     # on a trn2.48xlarge
    python benchmarks/kernel_device.py                                   # relaunches itself with torchrun

Each variant is launched through nki.jit from torch-neuronx on the XLA device of each rank
(one rank per process, the TP group = all ranks), warmed up, then timed over --iters runs
between device barriers; rank 0 prints the medians. For engine-level traces, run a single
variant under the Neuron profiler (`neuron-explorer` / `neuron-profile capture`) with
NEURON_RT_INSPECT_ENABLE=1; this script only reports wall-clock times.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time


def _no_device_reason() -> str | None:
    """Why the device run cannot happen here, or None when it can."""
    if not glob.glob("/dev/neuron*"):
        return "no Neuron device found (/dev/neuron* absent)"
    try:
        import torch_neuronx  # noqa: F401
        import torch_xla  # noqa: F401
    except ImportError as exc:
        return f"Neuron device present but torch-neuronx is not installed ({exc}); pip install 'trnopt[neuron]'"
    from trnopt.kernels.nki_api import USING_REAL_NKI

    if not USING_REAL_NKI:
        return "Neuron device present but the real nki package is not importable (or TRNOPT_FORCE_SIM is set)"
    return None


def _environment() -> str:
    return f"python {platform.python_version()}, {platform.system()} {platform.release()}, cpu x {os.cpu_count()}"


def _time(fn, iters: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _run_on_device(args: argparse.Namespace) -> int:  # pragma: no cover - needs Trainium
    import torch
    import torch.distributed as dist
    import torch_xla.core.xla_model as xm

    from trnopt.kernels.allgather_matmul import allgather_matmul, allgather_ring
    from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter, reduce_scatter_ring
    from trnopt.kernels.overlap import hidden_fraction, speedup
    from trnopt.kernels.tiling import matmul

    dist.init_process_group("xla")
    rank, tp = dist.get_rank(), dist.get_world_size()
    dev = xm.xla_device()
    groups = (tuple(range(tp)),)
    h, seq = args.hidden, args.seq
    bf = torch.bfloat16

    def sync() -> None:
        xm.mark_step()
        xm.wait_device_ops()
        dist.barrier()

    def rnd(*shape):
        return torch.randn(*shape, dtype=bf).to(dev)

    rows = []
    ms = seq // tp
    x_shard, w_col, x_full = rnd(h, ms), rnd(h, h // tp), rnd(h, seq)
    x_k, w_row, part = rnd(h // tp, seq), rnd(h // tp, h), rnd(seq, h)
    for ch in (1, 2):
        t_mm = _time(lambda: matmul(x_full, w_col), args.iters, sync)
        t_cc = _time(lambda: allgather_ring(x_shard, groups=groups, channels=ch), args.iters, sync)
        t_f = _time(lambda: allgather_matmul(x_shard, w_col, groups=groups, channels=ch), args.iters, sync)
        rows.append(("allgather_matmul", ch, t_mm, t_cc, t_f))
        t_mm = _time(lambda: matmul(x_k, w_row), args.iters, sync)
        t_cc = _time(lambda: reduce_scatter_ring(part, groups=groups, channels=ch), args.iters, sync)
        t_f = _time(lambda: matmul_reduce_scatter(x_k, w_row, groups=groups, channels=ch), args.iters, sync)
        rows.append(("matmul_reduce_scatter", ch, t_mm, t_cc, t_f))
    if rank == 0:
        print(f"trnopt kernel overlap on device: TP{tp}, hidden {h}, sequence {seq}, bfloat16")
        print(f"environment: {_environment()}")
        print(f"{'kernel':<24}{'ch':>3}{'T_mm us':>11}{'T_cc us':>10}{'T_f us':>11}{'hidden':>8}{'speedup':>9}")
        for k, ch, a, b, c in rows:
            print(f"{k:<24}{ch:>3}{a * 1e6:>11.1f}{b * 1e6:>10.1f}{c * 1e6:>11.1f}"
                  f"{hidden_fraction(a, b, c):>8.3f}{speedup(a, b, c):>9.3f}")
        print("T_cc here is the wall time of the collective-alone kernel (staging copies included); "
              "alltoall_expert_matmul: not run on device by this script yet.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    reason = _no_device_reason()
    if reason is not None:
        print(f"kernel_device: not run: {reason}.")
        print(f"environment: {_environment()}")
        print("The simulator's table is benchmarks/kernel_overlap.py.")
        return 0
    if "RANK" not in os.environ:  # relaunch one process per rank  # pragma: no cover
        torchrun = shutil.which("torchrun")
        if torchrun is None:
            print("kernel_device: not run: torchrun not found (install torch-neuronx)")
            return 0
        cmd = [torchrun, f"--nproc-per-node={args.tp}", __file__] + (argv if argv is not None else sys.argv[1:])
        return subprocess.call(cmd)
    return _run_on_device(args)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
