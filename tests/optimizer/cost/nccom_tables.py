"""Synthetic nccom-test output from a known alpha and beta, with a little deterministic noise."""

from __future__ import annotations

import math

from trnopt.optimizer.cost.nccom import bus_factor

GIB = 2**30


def sizes(lo: int = 8, hi: int = 2**30, factor: int = 2) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def table(op: str, ranks: int, nodes: int, alpha_s: float, beta_s_per_byte: float, noise: float = 0.005,
          header: str | None = "", dtype: str = "uint8") -> str:
    """nccom-test's table for t = alpha + beta * S, each time off by up to ``noise`` (a fixed pattern);
    ``header`` a first line ("": the nccom-test command as a comment; None: none, as nccom-test prints)."""
    elem = {"uint8": 1, "bf16": 2, "fp32": 4}[dtype]
    nccom_op = {"all_reduce": "allr", "all_gather": "allg", "reduce_scatter": "redsct", "all_to_all": "alltoall"}[op]
    first = f"# nccom-test -r {ranks} -N {nodes} -b 8 -e 1GB -f 4 -d {dtype} {nccom_op}" if header == "" else header
    lines = ([first] if first is not None else []) + \
        ["       size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)"]
    busbws = []
    for i, s in enumerate(sizes(max(8, elem))):
        t = (alpha_s + beta_s_per_byte * s) * (1 + noise * math.sin(2.1 * i + 0.5))
        t_us = max(1, round(t * 1e6))
        algbw = s / (t_us * 1e-6) / GIB
        busbw = algbw * bus_factor(op, ranks)
        busbws.append(round(busbw, 2))
        lines.append(f"{s:>14} {s // elem:>15} {dtype:>7} {t_us:>11} {algbw:>14.2f} {busbw:>14.2f}")
    lines.append(f"Avg bus bandwidth:      {sum(busbws) / len(busbws):.4f}GB/s")
    return "\n".join(lines) + "\n"


NCCOM_OP = {"all_reduce": "allr", "all_gather": "allg", "reduce_scatter": "redsct", "all_to_all": "alltoall",
            "p2p": "permute"}


def model_table(target, op: str, ranks: int, nodes: int, noise: float = 0.005, lo: int = 8, hi: int = 2**30,
                factor: int = 2, header: str | None = "", dtype: str = "uint8") -> str:
    """nccom-test's output for a run on ``target`` as the cost model times it: every size's time is
    collectives.collective_time on the run's group (the algorithm chosen by size: Mesh, RDH,
    KangaRing or Ring, hierarchical across nodes), off by up to ``noise`` (a fixed pattern), printed
    as nccom-test prints it (whole microseconds; algbw = size / time in GiB/s; busbw = algbw x the
    operation's bus factor; the footer their mean). ``header``: a first line ("" for the nccom-test
    command as a comment, None for no line: nccom-test itself prints none)."""
    from trnopt.optimizer.cost.nccom import Row, Run
    from trnopt.optimizer.cost.nccom_run import run_times

    elem = {"uint8": 1, "bf16": 2, "fp32": 4}[dtype]
    shape = Run("model", op, ranks, nodes, None, None, 1,
                tuple(Row(0, s, 1.0, 0.0, 0.0) for s in sizes(max(lo, elem), hi, factor)))
    times = run_times(target, shape)
    first = f"# nccom-test -r {ranks} -N {nodes} -b {lo} -e {hi} -f {factor} -d {dtype} {NCCOM_OP[op]}" \
        if header == "" else header
    lines = ([first] if first is not None else []) + \
        ["     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)"]
    busbws = []
    for i, (row, t) in enumerate(zip(shape.rows, times)):
        t_us = max(1, round(t * (1 + noise * math.sin(2.1 * i + 0.5)) * 1e6))
        algbw = row.size / (t_us * 1e-6) / GIB
        busbw = algbw * bus_factor(op, ranks)
        busbws.append(round(busbw, 2))
        lines.append(f"{row.size:>12} {row.size // elem:>15} {dtype:>8} {t_us:>11} {algbw:>14.2f} {busbw:>14.2f}")
    lines.append(f"Avg bus bandwidth:      {sum(busbws) / len(busbws):.4f}GB/s")
    return "\n".join(lines) + "\n"
