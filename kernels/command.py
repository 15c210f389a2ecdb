"""`trnopt kernels`: the kernel plan of a solved layout, checked in the simulator.

    trnopt kernels --layout layout.json [--shape full|scaled] [--json FILE|-]

1. Reads the layout (the JSON `trnopt solve --json` writes) and prints its KernelPlan
   (kernels/plan.py): replica groups in ring order, the hop check, link class, channels,
   chunk sizes and tiles.
2. Runs every planned kernel, and the collective-alone ring it is timed against, on all
   ranks of one TP group (one EP group for the expert kernel) at a scaled shape, with data,
   in the plan's ring order and channels, and compares each rank's result with the NumPy
   reference (BF16: within 2e-2 x (|value| + the tensor's largest |value|), the tests' rule).
3. Prints the overlap table (T_mm, T_cc, T_f, hidden fraction, speedup) from the
   simulator's timeline, simulated by the overlap harness (kernels/overlap.py) and labelled
   with the simulator's version (numbers from the simulator are simulated, not measured).
   ``--shape full`` (default): at the layout's full shape, in the simulator's symmetric
   fast mode (one representative rank; the simulated table if that run fails, and said
   so). ``--shape scaled``: at the scaled shape of step 2. Beside each row: the fraction
   the cost model uses and its source (optimizer/cost/overlap.py).

The numerics check holds every rank of the group in one process: its rows per rank shrink
as the group grows (``scaled_rows``: the whole check stays at about SCALED_ROWS rows), and a
group of more than MAX_CHECK_PROGRAMS simulated cores is not run (the line says so), which
keeps the command under 1 GiB at every size trnopt accepts. ``--time-limit`` bounds the
whole command: a run still going then is stopped, the report says what did not run.

Exit codes: 0 all results match; 1 a result is wrong, the plan fails its checks, or the
layout does not fit the chip's HBM; 2 bad input (a malformed layout file: one line naming
the file, the key and the rule); 4 the time limit stopped a check before it finished.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from trnopt.kernels import overlap
from trnopt.kernels.plan import GroupPlan, KernelPlan, kernel_plan, local_ring
from trnopt.kernels.sim import __version__ as sim_version
from trnopt.kernels.sim.runner import time_limit
from trnopt.kernels.sim.watchdog import RunTimeLimitError
from trnopt.kernels.tiling import SBUF_TRN2
from trnopt.optimizer import defaults
from trnopt.optimizer.cost.overlap import measured

BF16 = np.dtype(ml_dtypes.bfloat16)
SCALED = {"ms": 64, "k": 256, "n": 128}  # rows per rank (at most), contraction, narrow side of W
SCALED_ROWS = 1024        # rows of the whole check (M) once the group is larger than SCALED_ROWS / 64 ranks
MAX_CHECK_PROGRAMS = 128  # simulated cores (ranks x LNC) of one numerics check: TP64 at LNC 2 peaks at ~0.65 GiB


@dataclass
class Check:
    """One numerics run: ``ok`` True (matches), False (wrong), None (not run or stopped; ``detail`` says why)."""

    kernel: str
    group: str
    shape: str
    ok: bool | None
    detail: str
    seconds: float


def _failed(kernel: str, label: str, shape: str, exc: Exception, t0: float) -> Check:
    """A run that raised: stopped at the time limit (ok None), else a wrong result."""
    if isinstance(exc, RunTimeLimitError):
        return Check(kernel, label, shape, None, f"--time-limit: {exc}", time.perf_counter() - t0)
    return Check(kernel, label, shape, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def _too_large(kernels: tuple[str, ...], label: str, ranks: int, lnc: int) -> list[Check] | None:
    """Checks not run, saying why, when the group has more simulated cores than one check holds."""
    if ranks * lnc <= MAX_CHECK_PROGRAMS:
        return None
    why = (f"not run: {ranks} ranks x LNC {lnc} = {ranks * lnc} simulated cores, more than the "
           f"{MAX_CHECK_PROGRAMS} one numerics check holds within 1 GiB")
    return [Check(k, label, "-", None, why, 0.0) for k in kernels]


def register(sub) -> None:
    p = sub.add_parser("kernels", help="plan the overlap kernels of a solved layout and check them in the simulator",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", required=True, help="layout JSON as `trnopt solve --json` writes it")
    p.add_argument("--shape", choices=("full", "scaled"), default="full",
                   help="shape of the overlap table: full (default) or the scaled shape of the numerics check")
    p.add_argument("--json", metavar="FILE", help="also write JSON to FILE ('-' for stdout only)")
    p.add_argument("--force", action="store_true", help="allow --json to replace an existing file")
    p.add_argument("--time-limit", type=float, default=defaults.KERNELS_TIME_LIMIT_S, metavar="SECONDS",
                   help="stop the simulator runs after this many seconds, saying which did not finish "
                        f"(default {defaults.KERNELS_TIME_LIMIT_S:g})")
    p.set_defaults(run=run)


# -- numerics at the scaled shape ---------------------------------------------------------------
def scaled_rows(tp: int, lnc: int, channels: int) -> int:
    """Rows per rank of the numerics check: SCALED["ms"], fewer once tp * SCALED["ms"] passes
    SCALED_ROWS (the work and memory of a check grow with tp x M), never fewer than one row per
    direction, core and channel (2 * lnc * channels), which the both-way rings split."""
    return min(SCALED["ms"], max(2 * lnc * channels, SCALED_ROWS // tp))


def scaled_shape(kernel: str, tp: int, lnc: int = 1, channels: int = 1) -> tuple[int, int, int]:
    m = scaled_rows(tp, lnc, channels) * tp
    if kernel == "allgather_matmul":
        return m, SCALED["k"], SCALED["n"]
    return m, SCALED["n"], SCALED["k"]


def overlap_variants(kernel: str, ring: tuple[int, ...], m: int, k: int, n: int, dtype, channels: int,
                     numerics: bool, seed: int = 0, sbuf_bytes: int = SBUF_TRN2):
    """(mm, cc, fused) Variants of a TP kernel on the ring ``ring`` (simulator ids, ring order),
    from the overlap registry (`trnopt.kernels.overlap.launches`), and the per-position
    inputs (x, w) for the references.

    allgather_matmul: X [m, k] gathered from shards of m / tp rows, W [k, n] per rank.
    matmul_reduce_scatter: X [m, k] per rank (a K-slice), W [k, n], output rows m / tp.
    """
    if kernel not in ("allgather_matmul", "matmul_reduce_scatter"):
        raise ValueError(f"unknown TP kernel {kernel!r}")
    lx = overlap.launches(kernel, {"m": m, "k": k, "n": n}, ring=ring, channels=channels, dtype=dtype, numerics=numerics,
                  seed=seed, sbuf_bytes=sbuf_bytes)
    pos = {r: i for i, r in enumerate(ring)}
    by_pos = sorted(range(len(ring)), key=lambda i: pos[i])  # simulator id of each list position
    x = [lx.fused.args_per_rank[i][0] for i in by_pos]
    w = [lx.fused.args_per_rank[i][1] for i in by_pos]
    return lx.mm, lx.cc, lx.fused, (x, w)


def check_tp(group: GroupPlan, kernel: str, lnc: int = 1, sbuf_bytes: int = SBUF_TRN2) -> list[Check]:
    from trnopt.kernels.allgather_matmul import allgather_matmul_reference, allgather_reference
    from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter_reference, reduce_scatter_reference
    from trnopt.kernels.sim import run_ranks

    ring = local_ring(group.first_group)
    tp = len(ring)
    label = f"{group.dim.upper()}{tp} ring {list(group.first_group[:8])}{'...' if tp > 8 else ''}"
    skipped = _too_large((kernel, "allgather_ring" if kernel == "allgather_matmul" else "reduce_scatter_ring"),
                         label, tp, lnc)
    if skipped:
        return skipped
    pos = {r: i for i, r in enumerate(ring)}
    m, k, n = scaled_shape(kernel, tp, lnc, group.channels)
    mm, cc_, fused, (x, w) = overlap_variants(kernel, ring, m, k, n, BF16, group.channels, numerics=True, seed=7,
                                              sbuf_bytes=sbuf_bytes)
    label = f"{group.dim.upper()}{tp} ring {list(group.first_group[:8])}{'...' if tp > 8 else ''}"
    out = []
    for variant, name in ((fused, kernel), (cc_, cc_.kernel.__name__)):
        t0 = time.perf_counter()
        try:
            res = run_ranks(variant.kernel, variant.args_per_rank, link=group.link, numerics=True, timeout_s=120,
                            kwargs=dict(variant.kwargs), lnc=lnc, sbuf_bytes_per_partition=sbuf_bytes)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is a wrong result, reported
            out.append(_failed(name, label, f"M {m} K {k} N {n}", exc, t0))
            continue
        if name == "allgather_matmul":
            expect = {p: allgather_matmul_reference(x, w[p]) for p in range(tp)}
        elif name == "allgather_ring":
            g = allgather_reference(x)
            expect = {p: g for p in range(tp)}
        elif name == "matmul_reduce_scatter":
            expect = dict(enumerate(matmul_reduce_scatter_reference(x, w)))
        else:
            partials = [variant.args_per_rank[ring[p]][0] for p in range(tp)]
            expect = dict(enumerate(reduce_scatter_reference(partials)))
        ok, detail = _verdict([res.outputs[i] for i in range(tp)], [expect[pos[i]] for i in range(tp)])
        out.append(Check(name, label, f"M {m} K {k} N {n}", ok, detail, time.perf_counter() - t0))
    return out


def check_ep(group: GroupPlan, lnc: int = 1, channels: int = 1, e_local: int = 1,
             sbuf_bytes: int = SBUF_TRN2) -> list[Check]:
    """The expert kernel on all ranks of one EP group at a scaled shape, with the plan's
    exchange and up to two of its local experts (``e_local``), against the reference."""
    from trnopt.kernels.alltoall_expert_matmul import alltoall_expert_matmul, alltoall_expert_matmul_reference
    from trnopt.kernels.overlap import operand
    from trnopt.kernels.sim import run_ranks

    ring = local_ring(group.first_group)
    ep = len(ring)
    pos = {r: i for i, r in enumerate(ring)}
    s_n, el, h, c, f = 2, min(e_local, 2), 128, 32, 128
    label = f"EP{ep} {'ring' if channels == 2 else 'all_to_all'} {list(group.first_group[:8])}{'...' if ep > 8 else ''}"
    shape = f"S {s_n} E_local {el} H {h} C {c} F {f}"
    skipped = _too_large(("alltoall_expert_matmul",), label, ep, lnc)
    if skipped:
        return skipped
    x = [operand((s_n, ep, el, h, c), BF16, True, seed=300 + p) for p in range(ep)]
    w = [operand((el, h, f), BF16, True, seed=400 + p) for p in range(ep)]
    t0 = time.perf_counter()
    try:
        res = run_ranks(alltoall_expert_matmul, [(x[pos[i]], w[pos[i]]) for i in range(ep)], link=group.link,
                        numerics=True, timeout_s=120, lnc=lnc, sbuf_bytes_per_partition=sbuf_bytes,
                        kwargs={"groups": (ring,), "channels": channels, "sbuf_bytes": sbuf_bytes})
    except Exception as exc:  # noqa: BLE001
        return [_failed("alltoall_expert_matmul", label, shape, exc, t0)]
    ref = alltoall_expert_matmul_reference(x, w)
    ok, detail = _verdict([res.outputs[i] for i in range(ep)], [ref[pos[i]] for i in range(ep)])
    return [Check("alltoall_expert_matmul", label, shape, ok, detail, time.perf_counter() - t0)]


def _verdict(outputs: list, expected: list) -> tuple[bool, str]:
    """(every rank matches, what to print): the first rank that does not, else the worst
    rank's error (`overlap.agreement`, BF16)."""
    verdicts = [overlap.agreement(got, want, BF16) for got, want in zip(outputs, expected)]
    bad = next(((i, v) for i, v in enumerate(verdicts) if not v.ok), None)
    if bad:
        return False, f"rank {bad[0]}: {bad[1]}"
    return True, str(max(verdicts, key=lambda v: v.rel))


# -- overlap table --------------------------------------------------------------------------------
def measure(group: GroupPlan, kernel: str, m: int, k: int, n: int, lnc: int = 1,
            sbuf_bytes: int = SBUF_TRN2) -> dict:
    """T_mm, T_cc, T_f of one TP kernel on the plan's ring, timeline only (the overlap harness),
    with ``sbuf_bytes`` per partition (the target chip's, as benchmarks/overlap_table.py measures)."""
    res = overlap.measure(kernel, {"m": m, "k": k, "n": n}, link=group.link, lnc=lnc, sbuf_bytes=sbuf_bytes,
                          ring=local_ring(group.first_group), channels=group.channels, timeout_s=600)
    return {"t_mm": res.t_mm, "t_cc": res.t_cc, "t_f": res.t_f, "hidden_fraction": res.hidden_fraction,
            "speedup": res.speedup}


def overlap_rows(plan: KernelPlan, shape: str) -> tuple[list[dict], str]:
    """The overlap table's rows and a line saying where they came from."""
    tp = plan.tp
    table = measured()
    kernels = [k for k in plan.kernels if k.kernel in ("allgather_matmul", "matmul_reduce_scatter")]
    rows = []
    if not kernels:
        return rows, "no TP kernels in this plan (TP = 1)"
    if shape == "scaled":
        how = f"timeline at the scaled shape, simulated now by trnopt NKI simulator {sim_version} (numerics=False)"
    else:
        how = (f"timeline at the full shape, simulated now by trnopt NKI simulator {sim_version} in its symmetric "
               "fast mode (numerics=False, one representative rank)")
    for ku in kernels:
        key = {"target": plan.target, "lnc": plan.lnc, "shape_class": plan.shape_class}
        row = {"kernel": ku.kernel, "tp": tp.size, "link_class": tp.link_class, "channels": tp.channels,
               "cost_model_fraction": table.fraction(ku.kernel, tp.size, tp.link_class, **key),
               "cost_model_source": table.source_of(ku.kernel, tp.size, tp.link_class, **key)}
        if shape == "scaled":
            m, k, n = scaled_shape(ku.kernel, tp.size, plan.lnc, tp.channels)
            try:
                row.update(shape={"m": m, "k": k, "n": n}, source=f"simulated now ({sim_version})",
                           **measure(tp, ku.kernel, m, k, n, plan.lnc, plan.sbuf_bytes))
            except RunTimeLimitError:
                row.update(_table_row(table, ku.kernel, tp, key), source="table (run stopped at the time limit)")
        else:
            try:
                row.update(shape={"m": ku.m, "k": ku.k, "n": ku.n}, source=f"simulated now ({sim_version}, symmetric)",
                           **measure(tp, ku.kernel, ku.m, ku.k, ku.n, plan.lnc, plan.sbuf_bytes))
            except RunTimeLimitError:
                row.update(_table_row(table, ku.kernel, tp, key), source="table (symmetric run stopped at the "
                           "time limit)")
            except Exception as exc:  # noqa: BLE001 - fall back to the table, saying why
                row.update(_table_row(table, ku.kernel, tp, key),
                           source=f"table, {table.provenance_text()} (symmetric run failed: {exc})")
        rows.append(row)
    return rows, how


def _table_row(table, kernel: str, tp: GroupPlan, key: dict) -> dict:
    r = table.row(kernel, tp.size, tp.link_class, **key)
    if r is None:
        return {"shape": None, "t_mm": None, "t_cc": None, "t_f": None, "hidden_fraction": None, "speedup": None}
    return {k: r.get(k) for k in ("shape", "t_mm", "t_cc", "t_f", "hidden_fraction", "speedup")}


def table_lines(rows: list[dict], how: str) -> list[str]:
    if not rows:
        return [f"overlap: {how}"]
    out = [f"overlap: {how}",
           f"  {'kernel':<23}{'TP':>4} {'link':<9}{'ch':>3}  {'shape M x K x N':<22}{'T_mm us':>11}{'T_cc us':>10}"
           f"{'T_f us':>11}{'hidden':>10}{'speedup':>9}  cost model uses"]
    for r in rows:
        s = r.get("shape")
        shape = f"{s['m']} x {s['k']} x {s['n']}" if s else "-"
        if r.get("t_mm") is None:
            nums = f"{'not simulated at this TP degree and link class':>51}"
        else:
            nums = (f"{r['t_mm'] * 1e6:>11.2f}{r['t_cc'] * 1e6:>10.2f}{r['t_f'] * 1e6:>11.2f}"
                    f"{r['hidden_fraction']:>10.3f}{r['speedup']:>9.3f}")
        source = f"  [{r['source']}]" if str(r.get("source", "")).startswith("table") else ""
        out.append(f"  {r['kernel']:<23}{r['tp']:>4} {r['link_class']:<9}{r['channels']:>3}  {shape:<22}{nums}  "
                   f"{r['cost_model_fraction']:.3f} ({r['cost_model_source']}){source}")
    return out


# -- command ----------------------------------------------------------------------------------------
def run(args) -> int:
    from trnopt.optimizer.commands.args import MAX_TIME_LIMIT_S, check_float, load_runnable_layout
    from trnopt.optimizer.commands.output import check_output, write_output
    from trnopt.optimizer.errors import TimeLimitError

    check_float(args.time_limit, "--time-limit", 0.0, MAX_TIME_LIMIT_S, open_low=True)
    check_output(args.json, "--json", args.force)
    with time_limit(args.time_limit):  # every simulator run below ends by then
        target, workload, layout, _ = load_runnable_layout(args.layout)
        plan = kernel_plan(workload, layout, target)
        say = (lambda *a: None) if args.json == "-" else print
        say("\n".join(plan.lines()))
        problems = plan.problems()
        for p in problems:
            say(f"check FAILED: {p}")
        checks = numerics_checks(plan, workload, layout)
        say("")
        say(f"simulator, scaled shape, data (BF16: an element passes within {overlap.TOLERANCE[BF16]:g} x (its "
            f"value + the tensor's largest)), all ranks of one group:")
        for c in checks:
            verdict = {True: "OK   ", False: "WRONG", None: "-    "}[c.ok]
            say(f"  {c.kernel:<23} {c.group:<28} {c.shape:<22} {verdict} {c.detail} ({c.seconds:.1f} s)")
        if not checks:
            say("  nothing to run: no TP or EP group")
        rows, how = overlap_rows(plan, args.shape)
    say("")
    say("\n".join(table_lines(rows, how)))
    wrong = [c for c in checks if c.ok is False]
    matched = [c for c in checks if c.ok]
    stopped = [c for c in checks if "--time-limit" in c.detail] + \
        [r for r in rows if "time limit" in str(r.get("source", ""))]
    say("")
    say(f"result: {len(matched)} of {len(checks)} kernel runs match their references"
        + (f" ({len(checks) - len(matched) - len(wrong)} not run)" if len(matched) + len(wrong) < len(checks) else "")
        + (f"; {len(problems)} plan check(s) failed" if problems else "; plan checks pass"))
    if args.json:
        doc = {"layout_file": args.layout, "plan": plan.as_dict(),
               "checks": [c.__dict__ for c in checks], "overlap": {"source": how, "rows": rows},
               "ok": not wrong and not problems and not stopped}
        write_output(args.json, doc, args.force)
    if wrong or problems:
        print(f"trnopt kernels: {len(wrong)} wrong result(s), {len(problems)} plan problem(s)", file=sys.stderr)
        return 1
    if stopped:
        raise TimeLimitError(f"--time-limit {args.time_limit:g} s stopped {len(stopped)} simulator run(s) before "
                             "they finished (the report says which); raise --time-limit to finish them")
    return 0


def numerics_checks(plan: KernelPlan, workload, layout) -> list[Check]:
    """Every planned kernel at the scaled shape, with data, on all ranks of one group."""
    checks: list[Check] = []
    if plan.tp.size > 1:
        for kernel in ("allgather_matmul", "matmul_reduce_scatter"):
            checks += check_tp(plan.tp, kernel, plan.lnc, plan.sbuf_bytes)
    expert = next((k for k in plan.kernels if k.kernel == "alltoall_expert_matmul"), None)
    if expert is not None:  # only where the layout has an EP group
        checks += check_ep(plan.ep, plan.lnc, expert.channels, workload.model.moe.experts // layout.ep,
                           plan.sbuf_bytes)
    return checks
