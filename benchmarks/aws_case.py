"""What benchmarks/aws_kernels.py runs: a `Case` (one AWS kernel, its inputs per rank and its
NumPy reference), the check of a kernel's output against it (`mismatch`), the wrong answers
that check must refuse (`wrong_answers`), and the helpers the case files share.

The check is per element, in units of the output's dtype::

    |got - want| <= rtol_ulps * eps * |want|  +  atol_ulps * eps * rms(want)

``eps`` is the machine epsilon of the kernel's output dtype (float32 2^-23, bfloat16 2^-7,
float16 2^-10, FP8 E4M3 2^-3; 0 for integers: exact), ``rms`` the root mean square of the
reference. Why: a kernel that rounds its exact result once into its output dtype is off by
at most half a unit in the last place *of that element* (rtol_ulps 1/2, the default), so the
relative term is the element's own; a sum whose terms were rounded (a BF16 operand, a
BF16 intermediate) is off by a few roundings of its *terms*, which near a cancellation is
large against the element and small against the tensor's typical magnitude, so the
absolute term is one unit in the last place of a typical element (atol_ulps 1). The rms,
unlike the largest value (the old rule: rtol x max|want| on every element, which let a 10%
scale error pass), is not moved by a few large elements. A case that needs more states
why in ``why``, and every case must still refuse a 1% scale error and two swapped rows
(`wrong_answers`; benchmarks/aws_kernels.py reports a case that does not as "loose").
"""

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
    rtol_ulps: float = 0.5  # relative term, in units of eps of the output dtype (module docstring)
    atol_ulps: float = 1.0  # absolute term, in units of eps x rms(reference)
    why: str = ""  # why this case needs more than the default ulps (required when it does)
    # the dtype whose eps judges the outputs where ``post`` changes theirs (one per output of a tuple)
    eps_dtype: Any = None
    expect_error: str | None = None  # a regex the simulator's error must match
    hardware_only: str = ""  # why it cannot run on a CPU simulator (not counted)
    module: str | None = None  # import as a package module (nki-library)
    # the file also imports the pre-0.6 API (``neuronxcc.nki``), as nki-library's router_topk
    # does for its type annotations: route that name to the simulator too while importing
    legacy_api: bool = False
    post: Callable[[Any], Any] | None = None  # the kernel's output into the reference's layout
    # for subkernels that take or return SBUF tensors: kernel -> a small kernel written here
    # that moves HBM arguments to SBUF, calls it, and copies its SBUF results to HBM
    wrap: Callable[[Any], Any] | None = None


DEFAULT_ULPS = (Case.rtol_ulps, Case.atol_ulps)


def eps_of(dtype: np.dtype) -> float:
    """Machine epsilon of a float dtype (ml_dtypes' too); 0 for integers and booleans (exact)."""
    try:
        return float(ml_dtypes.finfo(dtype).eps)
    except ValueError:
        return 0.0


def outputs(x: Any) -> list[np.ndarray]:
    return [np.asarray(o) for o in x] if isinstance(x, tuple) else [np.asarray(x)]


def mismatch(got: Any, want: Any, case: Case, dtypes: list | None = None) -> str:
    """'' when every element of every output is within the module's per-element tolerance,
    else what is wrong, first failing output first. ``dtypes``: the output dtypes whose eps
    applies (default: got's own; a wrong answer made in float64 is judged as the kernel's)."""
    if isinstance(want, tuple):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"expected {len(want)} outputs, got {type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            msg = _mismatch(np.asarray(g), np.asarray(w), case, dtypes[i] if dtypes else np.asarray(g).dtype)
            if msg:
                return f"output {i}: {msg}"
        return ""
    return _mismatch(np.asarray(got), np.asarray(want), case, dtypes[0] if dtypes else np.asarray(got).dtype)


def _mismatch(g: np.ndarray, w: np.ndarray, case: Case, dtype: np.dtype) -> str:
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    eps = eps_of(dtype)
    rms = float(np.sqrt(np.nanmean(w64 * w64))) if w64.size else 0.0
    err = np.abs(g64 - w64)
    tol = eps * (case.rtol_ulps * np.abs(w64) + case.atol_ulps * rms)
    bad = np.isnan(g64) | ~(err <= tol)
    bad &= ~(np.isnan(g64) & np.isnan(w64))
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        need = np.nanmax((err - case.rtol_ulps * eps * np.abs(w64)) / (eps * rms)) if eps and rms else float("inf")
        return (f"{int(bad.sum())} of {bad.size} elements off (first at {at}: got {g64[at]:.6g}, want {w64[at]:.6g}); "
                f"max |err| {np.nanmax(err):.3g}, eps {eps:.3g} ({dtype}), rms {rms:.3g}, "
                f"rtol {case.rtol_ulps:g} ulp, atol {case.atol_ulps:g} ulp x rms (passing needs atol {need:.3g})")
    return ""


def _swap_rows(o: np.ndarray) -> np.ndarray | None:
    """``o`` with row 0 and the row most unlike it swapped (rows: the first axis of more than one
    element); None when no two rows differ."""
    axis = next((a for a, n in enumerate(o.shape) if n > 1), None)
    if axis is None:
        return None
    rows = np.moveaxis(o, axis, 0).astype(np.float64).reshape(o.shape[axis], -1)
    diff = np.nansum(np.abs(rows - rows[0]), axis=1)
    k = int(np.argmax(diff))
    if diff[k] == 0:
        return None
    out = np.array(np.moveaxis(o, axis, 0))
    out[[0, k]] = out[[k, 0]]
    return np.moveaxis(out, 0, axis)


def wrong_answers(got: Any) -> dict[str, Any]:
    """Wrong versions of a kernel's (correct) output that the check must refuse: every output
    scaled by 1.01 (in float64), and two rows swapped in every output that has two different rows."""
    outs = outputs(got)
    pack = (lambda xs: tuple(xs)) if isinstance(got, tuple) else (lambda xs: xs[0])
    wrong = {"1% scale": pack([o.astype(np.float64) * 1.01 for o in outs])}
    swapped = [_swap_rows(o) for o in outs]
    if any(s is not None for s in swapped):
        wrong["row swap"] = pack([o if s is None else s for o, s in zip(outs, swapped)])
    return wrong


def sqrt_n(n: int) -> float:
    """atol_ulps of an FP32 sum of ``n`` products held against a float64 reference: each of the
    n partial sums rounds by up to half an FP32 ulp of itself, in random directions, so the error
    grows as sqrt(n) ulps of the sum's size (Higham, "Accuracy and Stability of Numerical
    Algorithms", 2nd ed. 2002, sec. 4.2); twice that covers the largest of ~1e5 elements."""
    return 2 * n ** 0.5


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


def bf16(z: np.ndarray) -> np.ndarray:
    """``z`` rounded to BF16 (to nearest even), back in float64."""
    return z.astype(BF16).astype(np.float64)


def psum_matmul(stationary: np.ndarray, moving: np.ndarray, tile: int = 128, psum_free: int = 512) -> np.ndarray:
    """``stationary.T @ moving`` as the Tensor engine's ``nc_matmul`` calls build it: one call
    per ``tile`` x ``tile`` stationary tile and ``psum_free`` columns of moving (the PE array's
    128 rows and columns; a 2 KiB PSUM bank holds 512 FP32 per partition), each product taken
    in FP32 and added into the FP32 PSUM accumulator contraction tile after contraction tile
    (NKI ISA ``nc_matmul``: the result accumulates in PSUM in fp32). A float64 sum differs from
    it by FP32 roundings, which decide the BF16 rounding of the few results next to a tie."""
    k, m = stationary.shape
    out = np.zeros((m, moving.shape[1]))
    for m0 in range(0, m, tile):
        for n0 in range(0, moving.shape[1], psum_free):
            acc = np.zeros((min(tile, m - m0), min(psum_free, moving.shape[1] - n0)), np.float32)
            for k0 in range(0, k, tile):
                a = np.ascontiguousarray(stationary[k0:k0 + tile, m0:m0 + tile], np.float32)
                acc += a.T @ np.ascontiguousarray(moving[k0:k0 + tile, n0:n0 + psum_free], np.float32)
            out[m0:m0 + tile, n0:n0 + psum_free] = acc
    return out
