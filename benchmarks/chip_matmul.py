"""Simulated ``chip_matmul`` of the Trainium targets: the share of TensorE's rate one large GEMM
reaches on one NeuronCore of each generation.

    python benchmarks/chip_matmul.py            # trn1, trn2, trn3
    python benchmarks/chip_matmul.py --size 1024

`kernels/tiling.py`'s ``matmul`` (the overlap kernels' T_mm baseline) runs Y = X @ W, 4096 x
4096 x 4096 BF16, both operands read from HBM and Y written back, on one core at LNC 1, timed
by the simulator (schedule only, numerics off) on each generation's rates and SBUF capacity
(`kernels.sim.rates.GENERATIONS`, each rate with its public source). Printed per generation:
TensorE busy time, kernel time and their ratio, the figure each target's ``chip_matmul``
states (targets/machines/trn*.toml, with this script's output in ``chip_matmul_source``). A
ratio below 1 is time TensorE waits: for the first loads, for the DMA stream where the
engine outruns it (trn1: 16 DMA engines x 17 B/ns against a 2.8 GHz TensorE), and for the
last stores.

These are simulated numbers (the simulator's version is printed), not device measurements.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from trnopt.kernels import sim
from trnopt.kernels.overlap import BF16
from trnopt.kernels.sim import TensorSpec, rates, run_ranks
from trnopt.kernels.tiling import matmul

GENERATIONS = ("trn1", "trn2", "trn3")


def tensor_share(gen: str, size: int = 4096) -> tuple[float, float]:
    """(TensorE busy, kernel time) in seconds of the ``size``-cubed BF16 matmul from HBM on one
    core of generation ``gen``."""
    spec = TensorSpec((size, size), np.dtype(BF16))
    with rates.generation(gen) as g:
        sbuf = g.sbuf_bytes_per_partition
        res = run_ranks(matmul, [(spec, spec)], link=rates.DEFAULT_LINK, numerics=False, lnc=1,
                        sbuf_bytes_per_partition=sbuf, kwargs={"sbuf_bytes": sbuf})
    return res.timeline.busy_s.get("Tensor", 0.0), res.timeline.total_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="M = K = N of the GEMM (a multiple of 512)")
    ap.add_argument("--generations", nargs="+", default=list(GENERATIONS), choices=GENERATIONS)
    args = ap.parse_args(argv)
    if args.size <= 0 or args.size % 512:
        print(f"chip_matmul: --size {args.size}: must be a positive multiple of 512", file=sys.stderr)
        return 2
    print(f"trnopt NKI simulator {sim.__version__}: kernels/tiling.py matmul, {args.size} x {args.size} x "
          f"{args.size} BF16 from HBM, one core (LNC 1)")
    for gen in args.generations:
        busy, total = tensor_share(gen, args.size)
        print(f"{gen:<5} TensorE-busy / kernel time = {busy * 1e6:.1f} / {total * 1e6:.1f} us = {busy / total:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
