"""benchmarks/legacy_kernels.py's check for kernels that round their intermediates to BF16
but return FP32 (attention v7, v8): one unit roundoff of BF16 per element passes, a 1% scale
error and two swapped rows fail; without ``computes_in`` the FP32 check refuses the
BF16-rounded answer."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from legacy_kernels import compare  # noqa: E402


def _softmax_v(rng):
    """softmax(s) @ v exactly, and the same with the weights and v rounded to BF16."""
    s, v = rng.standard_normal((256, 512)) * 3, rng.uniform(-1, 1, (512, 64))
    e = np.exp(s - s.max(axis=1, keepdims=True))
    bf = lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
    return (e @ v) / e.sum(axis=1, keepdims=True), ((bf(e) @ bf(v)) / e.sum(axis=1, keepdims=True)).astype(np.float32)


def test_bf16_intermediates_pass_and_wrong_answers_fail():
    want, got = _softmax_v(np.random.default_rng(0))
    assert compare(got, want, 1e-3, ml_dtypes.bfloat16) == ""
    assert compare(got, want, 1e-3) != ""  # the FP32 check is too tight for BF16 intermediates
    assert compare((got * 1.01).astype(np.float32), want, 1e-3, ml_dtypes.bfloat16) != ""
    swapped = got.copy()
    swapped[[3, 7]] = swapped[[7, 3]]
    assert compare(swapped, want, 1e-3, ml_dtypes.bfloat16) != ""
