"""Overlap of the three trnopt kernels in the simulator, at Llama 3 405B shapes.

For each kernel and target: T_mm (the undecomposed matmul), T_cc (the collective alone:
link busy time of the ring / all-to-all kernel without matmul), T_f (the fused kernel),
hidden fraction 1 - (T_f - T_mm) / T_cc and speedup (T_mm + T_cc) / T_f, all measured
side by side in this one process on the simulator's engine timeline.

    python benchmarks/kernel_overlap.py                 # both targets, all kernels
    python benchmarks/kernel_overlap.py --targets trn2  # the TP16 torus only

Shapes (Llama 3 405B: hidden 16384, sequence 8192, BF16), per rank:
  allgather_matmul       X [8192 x 16384] gathered from TP shards of 8192/TP rows, W [16384 x 16384/TP]
  matmul_reduce_scatter  X [8192 x 16384/TP] @ W [16384/TP x 16384], reduce-scattered to 8192/TP rows
  alltoall_expert_matmul EP = TP ranks, one expert each, top-1, capacity factor 1, 8192 tokens per
                         rank of hidden 16384, expert width 16384/EP, 4 pipeline sub-chunks
These are too large to simulate with data on this machine, so every row runs the timeline
without data (numerics=False); the kernels' numerics are verified by tests/kernels at
smaller shapes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

from trnopt.kernels.allgather_matmul import allgather_matmul_timings
from trnopt.kernels.alltoall_expert_matmul import alltoall_expert_matmul_timings
from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter_timings
from trnopt.kernels.sim import LinkModel

HIDDEN, SEQ = 16384, 8192
BF16 = np.dtype(ml_dtypes.bfloat16)

# Link per channel (one direction of one ring) for each target.
TARGETS = {
    "trn2": dict(
        label="trn2 4x4 torus, TP16", tp=16,
        link=LinkModel(bandwidth_Bps=256e9, latency_s=1.5e-6),
        source=("1,024 GB/s per chip over both torus axes (DESIGN.md section 3, AWS Neuron trn2 "
                "architecture page) = 2 axes x 2 directions x 256 GB/s. A TP16 ring over the full "
                "4x4 torus (a Hamiltonian cycle) uses one link per direction: 256 GB/s per channel, "
                "512 GB/s per chip with both channels; the full 1,024 GB/s would need a second "
                "edge-disjoint ring (4 channels), which these kernels do not use. Hop latency "
                "1.5 us (mid-point of the documented ~1-2 us intra-instance)."),
    ),
    "trn2u": dict(
        label="trn2u ring across 4 instances, TP4", tp=4,
        link=LinkModel(bandwidth_Bps=128e9, latency_s=2e-6),
        source=("256 GB/s per chip on the ring across the 4 instances of a Trn2 UltraServer "
                "(DESIGN.md section 3), taken as both directions together: 128 GB/s per channel. "
                "Hop latency 2 us: ASSUMPTION (not published)."),
    ),
}


def environment() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
            f"cpu {cpu} x {os.cpu_count()}, {platform.system()} {platform.release()}")


def rows_for(target: str, kernels: list[str]):
    t = TARGETS[target]
    tp, link = t["tp"], t["link"]
    if "allgather_matmul" in kernels:
        for ch in (1, 2):
            yield ("allgather_matmul", ch, f"M {SEQ} K {HIDDEN} N {HIDDEN // tp}",
                   lambda ch=ch: allgather_matmul_timings(SEQ, HIDDEN, HIDDEN // tp, tp, BF16, link, ch))
    if "matmul_reduce_scatter" in kernels:
        for ch in (1, 2):
            yield ("matmul_reduce_scatter", ch, f"M {SEQ} K {HIDDEN // tp} N {HIDDEN}",
                   lambda ch=ch: matmul_reduce_scatter_timings(SEQ, HIDDEN // tp, HIDDEN, tp, BF16, link, ch))
    if "alltoall_expert_matmul" in kernels:
        yield ("alltoall_expert_matmul", "-", f"T {SEQ} H {HIDDEN} F {HIDDEN // tp}",
               lambda: alltoall_expert_matmul_timings(SEQ, HIDDEN, HIDDEN // tp, tp, BF16, link, n_sub=4))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--kernels", nargs="+", default=["allgather_matmul", "matmul_reduce_scatter",
                                                     "alltoall_expert_matmul"])
    args = ap.parse_args(argv)
    print("trnopt kernel overlap, simulator timeline (trnopt.kernels.sim)")
    print(f"environment: {environment()}")
    print("mode: schedule only (numerics=False) for every row: the 405B shapes are too large to "
          "simulate with data here; numerics are checked by tests/kernels at small shapes")
    print("dtype: bfloat16; one rank per chip, one NeuronCore (LNC 1) per rank")
    for name in args.targets:
        t = TARGETS[name]
        print(f"\n== {t['label']}: link {t['link'].bandwidth_Bps / 1e9:.0f} GB/s per channel, "
              f"{t['link'].latency_s * 1e6:.1f} us per hop")
        print(f"   source: {t['source']}")
        hdr = (f"{'kernel':<24}{'ch':>3}  {'shape (per rank)':<24}{'T_mm us':>11}{'T_cc us':>10}"
               f"{'T_f us':>11}{'hidden':>8}{'speedup':>9}{'sim s':>7}")
        print(hdr)
        print("-" * len(hdr))
        for kernel, ch, shape, run in rows_for(name, args.kernels):
            t0 = time.perf_counter()
            try:
                r = run()
            except Exception as exc:  # noqa: BLE001 - a row that fails is reported, not hidden
                print(f"{kernel:<24}{ch!s:>3}  {shape:<24} NOT RUN: {type(exc).__name__}: {exc}")
                continue
            el = time.perf_counter() - t0
            print(f"{kernel:<24}{ch!s:>3}  {shape:<24}{r['t_mm'] * 1e6:>11.1f}{r['t_cc'] * 1e6:>10.1f}"
                  f"{r['t_f'] * 1e6:>11.1f}{r['hidden_fraction']:>8.3f}{r['speedup']:>9.3f}{el:>7.1f}",
                  flush=True)
    print("\nGoal (issue 6): hidden fraction >= 0.90 at TP16 on the torus (ByteDance Flux reports 96% on GPUs).")
    print("T_cc is the link time of the collective alone: busy time of the busiest collective engine in the "
          "ring all-gather / ring reduce-scatter kernel with the same channels and whole chunks, or the dispatch + "
          "combine all_to_all of the expert kernel (staging DMA copies excluded).")
    print("The expert all-to-all is timed with the simulator's (n-1)(S/n/B + a) formula on channel 0; on a torus "
          "the real all-to-all is bisection-limited, so that row is optimistic about T_cc.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
