"""Shared fixtures and the one per-dtype tolerance table for the kernel tests.

Tolerances (DESIGN.md section 9, issue 6): BF16 2e-2 relative, FP32 1e-5 relative.
"Relative" is measured against the scale of the expected tensor: an element passes when
|actual - expected| <= rtol * (|expected| + max|expected|), so values near zero are judged
against the tensor's magnitude rather than their own (cancellation in a sum of K products
makes elementwise relative error meaningless there). Exact comparisons (no reduction in
the path, or integer-valued data whose sums are exact in FP32) use `assert_exact`.

Tests use the fixtures below (`assert_close`, `assert_exact`, `tol`, `make_tensor`, `rng`)
rather than importing this module, so that test directories with their own conftest.py
never collide on the module name.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

BF16 = np.dtype(ml_dtypes.bfloat16)
FP32 = np.dtype(np.float32)

#: Relative tolerance per storage dtype of the kernel's inputs and outputs.
TOLERANCE: dict[np.dtype, float] = {
    BF16: 2e-2,
    FP32: 1e-5,
}

DTYPES = {"bf16": BF16, "fp32": FP32}


def tolerance(dtype) -> float:
    """Relative tolerance for `dtype` (a numpy dtype or one of the names in DTYPES)."""
    dt = DTYPES[dtype] if isinstance(dtype, str) else np.dtype(dtype)
    try:
        return TOLERANCE[dt]
    except KeyError:
        raise KeyError(f"no tolerance for dtype {dt}; known: {sorted(map(str, TOLERANCE))}") from None


def _assert_close(actual, expected, dtype, what: str = "output") -> None:
    """Compare in float64 with the tolerance of `dtype` (see the module docstring)."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    assert np.all(np.isfinite(a)), f"{what}: {np.count_nonzero(~np.isfinite(a))} non-finite values"
    rtol = tolerance(dtype)
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    err = np.abs(a - e)
    bound = rtol * (np.abs(e) + scale)
    bad = err > bound
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements outside rtol={rtol:g} "
            f"(first at {idx}: got {a[idx]!r}, expected {e[idx]!r}; max|err|={err.max():.3g}, "
            f"scale={scale:.3g})"
        )


def _assert_exact(actual, expected, what: str = "output") -> None:
    """Bitwise equality of values (NaN never equal)."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    af, ef = a.astype(np.float64), e.astype(np.float64)
    bad = ~(af == ef)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements differ "
            f"(first at {idx}: got {af[idx]!r}, expected {ef[idx]!r})"
        )


def random_tensor(rng: np.random.Generator, shape, dtype, *, integer: bool = False) -> np.ndarray:
    """Standard-normal data (or small integers in [-3, 3], exact under FP32 sums) in `dtype`."""
    if integer:
        return rng.integers(-3, 4, size=shape).astype(np.float32).astype(dtype)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator; tests that need several streams derive from it."""
    return np.random.default_rng(20240601)


@pytest.fixture
def assert_close():
    """`assert_close(actual, expected, dtype, what)` with the table's tolerance for dtype."""
    return _assert_close


@pytest.fixture
def assert_exact():
    """`assert_exact(actual, expected, what)`: value equality, no tolerance."""
    return _assert_exact


@pytest.fixture
def tol():
    """`tol(dtype)`: the relative tolerance of the table."""
    return tolerance


@pytest.fixture
def make_tensor():
    """`make_tensor(rng, shape, dtype, integer=False)`."""
    return random_tensor


@pytest.fixture
def dtypes():
    """Name -> numpy dtype for the parametrised dtypes ("bf16", "fp32")."""
    return DTYPES
