"""Overlap of the trnopt kernels on a Trainium device, with the Neuron SDK.

Times the same overlap-registry entries as benchmarks/kernel_overlap.py (trnopt.kernels.
overlap.launches: the fused kernel, the collective alone and the baseline matmul, same
shapes, rings and channels) and prints the same table from device wall-clock times, so
the two compare row by row. Without a Neuron device or without the Neuron SDK (nki,
torch-neuronx) it says so and exits 0.

    torchrun --nproc-per-node 16 benchmarks/kernel_device.py --tp 16     # on a trn2.48xlarge
    python benchmarks/kernel_device.py                                   # relaunches itself with torchrun
    python benchmarks/kernel_device.py --lnc 1                           # one physical core per rank

Each variant is launched through nki.jit from torch-neuronx on the XLA device of each rank
(one rank per process, the TP group = all ranks; at LNC 2, the default on trn2, as
``kernel[2]`` with NEURON_LOGICAL_NC_CONFIG=2, each rank's two physical cores splitting
the work as in the simulator), warmed up, then timed over --iters runs
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

import numpy as np


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

    from trnopt.kernels.overlap import BF16, hidden_fraction, launches, speedup

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_overlap import MODELS, channels_for, full_shape, header, row_text  # the simulator's table

    dist.init_process_group("xla")
    rank, tp = dist.get_rank(), dist.get_world_size()
    dev = xm.xla_device()

    def sync() -> None:
        xm.mark_step()
        xm.wait_device_ops()
        dist.barrier()

    def on_device(v):
        return torch.from_numpy(np.asarray(v, dtype=np.float32)).to(torch.bfloat16).to(dev)

    def timed(variant, me: int) -> float:
        # a one-rank launch (the baseline matmul) runs on every rank, as the fused kernel does
        call_args = [on_device(a) for a in variant.args_per_rank[me % len(variant.args_per_rank)]]
        launch = variant.kernel[args.lnc] if args.lnc > 1 else variant.kernel
        return _time(lambda: launch(*call_args, **dict(variant.kwargs)), args.iters, sync)

    rows = []
    for kernel in args.kernels:
        for model in args.models:
            shape = full_shape(kernel, MODELS[model], tp)
            for ch in channels_for(kernel, tp, args.lnc):
                lx = launches(kernel, shape, tp=tp, channels=ch, dtype=BF16, numerics=True)
                t_mm, t_cc, t_f = timed(lx.mm, rank), timed(lx.cc, rank), timed(lx.fused, rank)
                rows.append((kernel, model, ch, shape, t_mm, t_cc, t_f))
    if rank == 0:
        print(f"trnopt kernel overlap on device: TP{tp}, LNC {args.lnc}, bfloat16, median of {args.iters} runs")
        print(f"environment: {_environment()}")
        print(header())
        for kernel, model, ch, shape, a, b, c in rows:
            print(row_text(kernel, model, tp, ch, args.lnc, shape,
                           (a, b, c, hidden_fraction(a, b, c), speedup(a, b, c)), "-", 0.0))
        print("T_cc here is the wall time of the collective-alone kernel (staging copies included).")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=16, help="ranks (one process each), the TP / EP group")
    ap.add_argument("--kernels", nargs="+", default=["allgather_matmul", "matmul_reduce_scatter",
                                                     "alltoall_expert_matmul"])
    ap.add_argument("--models", nargs="+", default=["llama3-405b", "llama3-70b"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--lnc", type=int, default=2, choices=[1, 2], help="physical cores per rank (trn2 default 2)")
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
        return subprocess.call(cmd, env={**os.environ, "NEURON_LOGICAL_NC_CONFIG": str(args.lnc)})
    return _run_on_device(args)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
