"""What benchmarks/aws_kernels.py runs: a `Case` (one AWS kernel, its inputs per rank and its
NumPy reference) and the helpers the case files share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
LIB = "lib/src/nkilib_src"  # aws-neuron/nki-library's package root in the kernel folder


@dataclass
class Case:
    """One kernel: where it is, its inputs (per rank), its NumPy reference."""

    file: str  # relative to FOLDER
    kernel: str
    inputs: Callable[[np.random.Generator, int], tuple[tuple, dict]]  # (rng, rank) -> (args, kwargs)
    reference: Callable[..., Any] | None  # (args, kwargs, rank, all_args) -> expected output(s)
    ranks: int = 1
    lnc: int | None = None
    rtol: float = 1e-5
    atol: float = 1e-5
    expect_error: str | None = None  # a regex the simulator's error must match
    hardware_only: str = ""  # why it cannot run on a CPU simulator (not counted)
    module: str | None = None  # import as a package module (nki-library)
    post: Callable[[Any], Any] | None = None  # the kernel's output into the reference's layout
    # for subkernels that take or return SBUF tensors: kernel -> a small kernel written here
    # that moves HBM arguments to SBUF, calls it, and copies its SBUF results to HBM
    wrap: Callable[[Any], Any] | None = None


def f32(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def lib_case(path: str, kernel: str, inputs: Any, reference: Any, **kw: Any) -> Case:
    """A case of nki-library: ``path`` below nkilib/, imported as its package module."""
    module = "nkilib." + path[:-3].replace("/", ".")
    return Case(f"{LIB}/nkilib/{path}", kernel, inputs, reference, module=module, **kw)


def gathered(al: list, key: int = 0, axis: int = 0) -> np.ndarray:
    return np.concatenate([a[key] for a in al], axis=axis)


def replica_group(n: int) -> Any:
    import nki.collectives as ncc  # the simulator's, after install()
    return ncc.ReplicaGroup([list(range(n))])
