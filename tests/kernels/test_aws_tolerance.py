"""benchmarks/aws_kernels.py's check: per element, in units of the output dtype's eps; it
passes a kernel that rounds its exact result once, and refuses a 1% scale error and two
swapped rows; a case that needs more than the default ulps says why."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from aws_case import DEFAULT_ULPS, Case, mismatch, wrong_answers  # noqa: E402
from aws_cases_blocks import BLOCK_CASES  # noqa: E402
from aws_cases_lib import LIB_CASES  # noqa: E402
from aws_cases_moe import MOE_CASES  # noqa: E402
from aws_cases_mx import MX_CASES  # noqa: E402
from aws_cases_mx_cte import MX_MOE_CASES  # noqa: E402
from aws_cases_sdk import SDK_CASES  # noqa: E402

CASES = SDK_CASES + LIB_CASES + BLOCK_CASES + MOE_CASES + MX_CASES + MX_MOE_CASES
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def _matmul(rng, dtype):
    """A reference product and a kernel's answer that rounds the exact product once to ``dtype``."""
    a, b = rng.standard_normal((256, 128)), rng.standard_normal((128, 64))
    want = a @ b
    return want, want.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_rounding_passes_and_wrong_answers_fail(dtype):
    want, got = _matmul(np.random.default_rng(0), dtype)
    case = Case("f.py", "k", None, None)
    assert mismatch(got, want, case) == ""
    wrong = wrong_answers(got)
    assert set(wrong) == {"1% scale", "row swap"}
    for name, bad in wrong.items():
        assert mismatch(bad, want, case, [np.dtype(dtype)]), name


def test_the_old_rule_passed_a_5_percent_error_this_one_does_not():
    want, got = _matmul(np.random.default_rng(1), ml_dtypes.bfloat16)
    bad = got.astype(np.float64) * 1.05
    scale = np.abs(want).max()
    assert np.all(np.abs(bad - want) <= 3e-2 * (np.abs(want) + scale))  # attention_bwd's old rtol x (|w| + max|w|)
    assert "elements off" in mismatch(bad, want, Case("f.py", "k", None, None), [np.dtype(ml_dtypes.bfloat16)])


def test_tuples_nan_and_integers():
    case = Case("f.py", "k", None, None)
    w = np.arange(12, dtype=np.int32).reshape(4, 3)
    assert mismatch((w, w.astype(np.float32)), (w, w), case) == ""
    assert mismatch((w + 1, w), (w, w), case).startswith("output 0:")  # integers: exact
    nan = np.full((2, 2), np.nan)
    assert mismatch(nan, nan, case) == ""          # never written where the reference says so
    assert mismatch(nan, np.zeros((2, 2)), case)   # NaN where a value is due


def test_every_case_with_more_than_the_default_says_why():
    for c in CASES:
        if (c.rtol_ulps, c.atol_ulps) != DEFAULT_ULPS:
            assert c.why, f"{c.file}::{c.kernel}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_case_tolerance_passes_a_1_percent_scale_error_at_its_own_dtype(dtype):
    """Per case, at the dtypes its tolerance is meant for (its eps_dtype, else each of these):
    a tensor of normal values scaled by 1.01 fails, unless the case's ulps are for FP32 sums."""
    rng = np.random.default_rng(2)
    want = rng.standard_normal((512, 64))
    for c in CASES:
        if c.eps_dtype is not None or (c.atol_ulps > 2 and dtype is not np.float32):
            continue
        got = want.astype(dtype)
        assert mismatch(got.astype(np.float64) * 1.01, want, c, [np.dtype(dtype)]), f"{c.file}::{c.kernel}"


def test_mx_quantize_follows_the_ocp_rule_and_nki_scale():
    """OCP MX v1.0 sec. 6.3: shared exponent floor(log2 amax) - emax_elem, elements rounded to
    nearest even; NKI's quantize_mx uses a scale twice the OCP one."""
    from aws_cases_mx import mx_quantize

    block = np.zeros(32)
    block[:4] = [1.0, 1.0625, 1.09375, -0.5]  # amax 1: NKI scale 2^-7, elements 128, 136, 140, -64
    vals, byte = mx_quantize(block)
    assert int(byte) == 127 - 7
    # E4M3 steps by 16 in [128, 256): 136 is a tie -> 128 (even), 140 -> 144
    assert list(vals[:4]) == [1.0, 1.0, 1.125, -0.5]
    assert int(mx_quantize(block, nki_scale=False)[1]) == 127 - 8
    fp4, b4 = mx_quantize(np.array([6.0, 0.25, 0.75, -2.6] + [0.0] * 28), kind="fp4", nki_scale=False)
    assert int(b4) == 127 and list(fp4[:4]) == [6.0, 0.0, 1.0, -3.0]  # E2M1 grid 0, .5, 1, 1.5, 2, 3, 4, 6
    zeros, bz = mx_quantize(np.zeros(32))
    assert int(bz) == 0 and not zeros.any()


def test_psum_matmul_is_fp32_accumulation_of_128_row_tiles():
    from aws_case import psum_matmul

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((384, 130)), rng.standard_normal((384, 600))
    got = psum_matmul(a, b)
    exact = a.T @ b
    assert got.dtype == np.float64 and np.array_equal(got, got.astype(np.float32))  # FP32 values
    assert np.allclose(got, exact, rtol=1e-5, atol=1e-4) and not np.array_equal(got, exact)
