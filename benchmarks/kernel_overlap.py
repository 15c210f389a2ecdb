"""Overlap of the trnopt kernels in the simulator, Llama 3 shapes, TP 4 to 64, side by side.

Every row is one entry of the overlap registry (trnopt.kernels.overlap.REGISTRY) timed
by its one timer: T_mm (the undecomposed matmul), T_cc (the collective alone: link busy
time of the ring / all-to-all kernel without matmul), T_f (the fused kernel), hidden
fraction 1 - (T_f - T_mm) / T_cc and speedup (T_mm + T_cc) / T_f, on the simulator's
engine timeline (schedule only: the full shapes are too large to simulate with data
here). Beside each row, the same kernel on the same ring and channels runs with data at a
scaled shape and is compared with its NumPy reference (column "check"). Under a row below
its goal, a line says where T_f - T_cc went: before the first transfer, transfers beyond
T_cc, after the last (`OverlapResult.overrun`), beside what the goal allows.

    python benchmarks/kernel_overlap.py                         # every row
    python benchmarks/kernel_overlap.py --tp 32 64 --models llama3-70b
    python benchmarks/kernel_overlap.py --kernels allgather_matmul --no-check
    python benchmarks/kernel_overlap.py --lnc 2             # both physical cores of each rank

Shapes per rank (sequence 8192, micro-batch 1, BF16): allgather_matmul X [8192 x h]
gathered from TP shards, W [h x h/TP] (the narrowest column-parallel projection);
matmul_reduce_scatter X [8192 x h/TP] @ W [h/TP x h]; alltoall_expert_matmul EP ranks, 4
pipeline sub-chunks, in both its variants: on ncc.all_to_all (1 channel) and on the ring's
two directions (2 channels, `trnopt.kernels.ring_alltoall`), each against its own
collective alone. At LNC 2 every kernel splits its rows (the expert kernel its
capacity slots) between the two physical cores of a rank, which share its links. The expert rows use Mixtral 8x7B instead (hidden 4096, expert
width 14336, 8 experts top-2: 16384 routed tokens per rank) at EP 4 and 8. Link per channel (one direction of one ring): the Trn2 torus, 1,024
GB/s per chip over 2 axes x 2 directions = 256 GB/s, hop latency 1.5 us (mid-point of
the documented ~1-2 us intra-instance); the channels `trnopt.kernels.plan` plans for the
TP group where benchmarks/overlap_table.py places it (`channels_for`): one where the
group spans two chips joined by one link (TP16 at LNC 1, TP8 at LNC 2), four where it
holds every rank of a trn2.48xlarge (TP64 at LNC 2: both directions of the torus's two
edge-disjoint Hamiltonian cycles, as the collective pages allow), else two. The
all-gather runs whole shards both ways (about tp/2 hops) where its ring fits on chip,
else every shard all the way round in halves (`allgather_matmul.gather_plan`); its T_cc
is the ring alone on the same schedule.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

from trnopt.kernels.overlap import BF16, REGISTRY, TOLERANCE, OverlapResult, measure
from trnopt.kernels.plan import group_plan
from trnopt.kernels.sim import LinkModel

SEQ = 8192
MODELS = {"llama3-405b": 16384, "llama3-70b": 8192}
EXPERT_MODEL = "mixtral-8x7b"  # the expert rows' shapes (`full_shape`)
LINK = LinkModel(bandwidth_Bps=256e9, latency_s=1.5e-6)


def channels_for(kernel: str, tp: int, lnc: int) -> tuple[int, ...]:
    """The channel settings measured for ``kernel``: for the expert kernel both of its
    variants, 1 (``ncc.all_to_all``, the runtime drives the links) and 2 (the ring's two
    directions, `trnopt.kernels.ring_alltoall`); else the ring channels of a TP group of
    ``tp`` ranks at this LNC on the trn2 torus, as `trnopt.kernels.plan.group_plan` plans
    them for the placement the overlap table measures inside one instance
    (`overlap_table.tp_groups`): 1 where it spans two chips joined by one link, 4 where it
    holds every core of the instance ("nki.collectives.collective_permute_implicit"), else 2."""
    if kernel == "alltoall_expert_matmul":
        return (1, 2)
    from overlap_table import representative_layout, tp_groups  # this directory; the table's placements
    groups = tp_groups("trn2", lnc, "llama3-405b")
    place = next((groups[tp, cls] for cls in ("core", "torus") if (tp, cls) in groups), None)
    if place is None:
        raise SystemExit(f"kernel_overlap: --tp {tp} at LNC {lnc}: not a TP group of one trn2 instance "
                         f"(one of {sorted({d for d, cls in groups if cls in ('core', 'torus')})})")
    return (group_plan(*representative_layout("trn2", lnc, place), "tp").channels,)


GOALS = ((4, 16, 0.95), (32, 64, 0.80))  # hidden fraction goals by TP range
EXPERT_GOAL = 0.85


def full_shape(kernel: str, hidden: int, tp: int) -> dict:
    if kernel == "allgather_matmul":
        return {"m": SEQ, "k": hidden, "n": hidden // tp}
    if kernel == "matmul_reduce_scatter":
        return {"m": SEQ, "k": hidden // tp, "n": hidden}
    # Mixtral 8x7B (arXiv:2401.04088): hidden 4096, expert width 14336, 8 experts, top-2
    return {"tokens": SEQ * 2, "h": 4096, "f": 14336, "e_local": 8 // tp, "n_sub": 4}


def scaled_shape(kernel: str, tp: int) -> dict:
    """The data check: a few tiles per rank, ragged nowhere (the tests cover ragged shapes)."""
    if kernel == "allgather_matmul":
        return {"m": 64 * tp, "k": 256, "n": 128}
    if kernel == "matmul_reduce_scatter":
        return {"m": 64 * tp, "k": 128, "n": 256}
    return {"tokens": 32 * tp, "h": 128, "f": 128, "e_local": 8 // tp, "n_sub": 2}


def environment() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
            f"cpu {cpu} x {os.cpu_count()}, {platform.system()} {platform.release()}")


def shape_text(shape: dict) -> str:
    return " ".join(f"{k} {v}" for k, v in shape.items() if k not in ("e_local",))


def header() -> str:
    return (f"{'kernel':<24}{'model':<13}{'TP':>4}{'ch':>3}{'LNC':>4}  {'shape (per rank)':<26}{'T_mm us':>10}{'T_cc us':>10}"
            f"{'T_f us':>10}{'hidden':>8}{'speedup':>9}  {'check':<16}{'goal':>6}")


def row_text(kernel: str, model: str, tp: int, ch: int, lnc: int, shape: dict, t: tuple | None, check: str,
             goal: float, note: str = "") -> str:
    head = f"{kernel:<24}{model:<13}{tp:>4}{ch:>3}{lnc:>4}  {shape_text(shape):<26}"
    if t is None:
        return head + f"NOT RUN: {note}"
    a, b, c, h, s = t
    mark = "ok" if h >= goal else "MISS"
    return head + (f"{a * 1e6:>10.1f}{b * 1e6:>10.1f}{c * 1e6:>10.1f}{h:>8.3f}{s:>9.3f}  {check:<16}"
                   f"{goal:>4.2f} {mark}")


def overrun_text(r: OverlapResult, goal: float) -> str:
    """The line under a row below its goal: where T_f - T_cc went (`OverlapResult.overrun`)
    and how much of it the goal allows: hidden >= goal <=> T_f - T_cc <= T_mm - goal x T_cc."""
    before, beyond, after = (x * 1e6 for x in r.overrun())
    allowed = (r.t_mm - goal * r.t_cc) * 1e6
    reach = (f"the goal allows {allowed:.1f} (T_mm - goal x T_cc)" if allowed > 0
             else "no schedule reaches the goal (T_mm < goal x T_cc)")
    return (f"    T_f - T_cc = {(r.t_f - r.t_cc) * 1e6:.1f} us: {before:.1f} before the first transfer "
            f"+ {beyond:.1f} of transfers beyond T_cc + {after:.1f} after the last; {reach}")


def goal_for(kernel: str, tp: int) -> float:
    if kernel == "alltoall_expert_matmul":
        return EXPERT_GOAL
    return next((g for lo, hi, g in GOALS if lo <= tp <= hi), 0.0)


def run_row(kernel: str, model: str, tp: int, ch: int, lnc: int, shape: dict, check_data: bool) -> int:
    """Measure and print one row; 1 if it is below its goal or its data check fails, else 0."""
    t0 = time.perf_counter()
    misses = 0
    try:
        r = measure(kernel, shape, tp=tp, channels=ch, link=LINK, dtype=BF16, lnc=lnc)
        check = "-"
        if check_data:
            c = measure(kernel, scaled_shape(kernel, tp), tp=tp, channels=ch, link=LINK,
                        dtype=BF16, numerics=True, seed=7, lnc=lnc)
            check = f"{'OK' if c.ok else 'WRONG'} {c.max_err:.1e}"
            misses += not c.ok
    except Exception as exc:  # noqa: BLE001 - a row that fails is reported, not hidden
        print(row_text(kernel, model, tp, ch, lnc, shape, None, "", 0, f"{type(exc).__name__}: {exc}"))
        return 1
    goal = goal_for(kernel, tp)
    misses += r.hidden_fraction < goal
    print(row_text(kernel, model, tp, ch, lnc, shape,
                   (r.t_mm, r.t_cc, r.t_f, r.hidden_fraction, r.speedup), check, goal)
          + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if r.hidden_fraction < goal:
        print(overrun_text(r, goal), flush=True)
    return min(misses, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+", default=list(REGISTRY), choices=list(REGISTRY))
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--tp", nargs="+", type=int, default=[4, 8, 16, 32, 64])
    ap.add_argument("--lnc", nargs="+", type=int, default=[1, 2], choices=[1, 2],
                    help="programs per rank: 1, or 2 (the two physical cores of an LNC 2 rank)")
    ap.add_argument("--no-check", action="store_true", help="skip the data check at the scaled shape")
    args = ap.parse_args(argv)
    print("trnopt kernel overlap, simulator timeline (trnopt.kernels.sim), registry trnopt.kernels.overlap")
    print(f"environment: {environment()}")
    print(f"link per channel {LINK.bandwidth_Bps / 1e9:.0f} GB/s, {LINK.latency_s * 1e6:.1f} us per hop, "
          f"channels as trnopt.kernels.plan places the TP group (a rank's: under LNC 2 its two cores share "
          f"them); bfloat16; timings schedule only "
          f"(numerics=False)")
    print(header())
    print("-" * len(header()))
    misses = 0
    rows = ((k, m, t, n) for k in args.kernels for m in args.models for t in args.tp for n in args.lnc)
    for kernel, model, tp, lnc in rows:
        if kernel == "alltoall_expert_matmul":
            if tp not in (4, 8) or model != args.models[0]:
                continue
            model = EXPERT_MODEL
        shape = full_shape(kernel, MODELS.get(model, 0), tp)
        for ch in channels_for(kernel, tp, lnc):
            misses += run_row(kernel, model, tp, ch, lnc, shape, not args.no_check)
    print(f"\n{misses} row(s) below goal or wrong. Goals: hidden >= 0.95 at TP4-16, >= 0.80 at TP32-64, "
          f">= {EXPERT_GOAL} for the expert kernel.")
    print("T_cc is the link time of the collective alone (busiest collective engine, its share of the DMA "
          "bandwidth included); T_mm the same matmul undecomposed on one rank (at LNC 2 split over its two cores "
          "as the kernel splits it).")
    if not args.no_check:
        print(f"check: OK when every element is within rtol x (|expected| + the tensor's max |expected|) of the "
              f"reference (trnopt.kernels.overlap.agreement; BF16 rtol {TOLERANCE[BF16]:g}), followed by "
              f"max |err| / max |expected| of the worst rank.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
