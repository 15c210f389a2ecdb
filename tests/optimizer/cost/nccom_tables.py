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
          header: str | None = None, dtype: str = "uint8") -> str:
    """nccom-test's table for t = alpha + beta * S, each time off by up to ``noise`` (a fixed pattern)."""
    elem = {"uint8": 1, "bf16": 2, "fp32": 4}[dtype]
    nccom_op = {"all_reduce": "allr", "all_gather": "allg", "reduce_scatter": "redsct", "all_to_all": "alltoall"}[op]
    first = header if header is not None else f"# nccom-test -r {ranks} -N {nodes} -b 8 -e 1GB -f 4 -d {dtype} {nccom_op}"
    lines = [first, "       size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)"]
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
