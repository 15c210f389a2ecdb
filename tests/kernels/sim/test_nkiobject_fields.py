"""An NKIObject dataclass field the constructor leaves out reads None, as in the NKI 0.6+
front end (KLR's class tests), and a kernel that branches on it computes what NumPy does
(nki-library's mlp_tkg_constants builds MLPTKGConstantsDimensionSizes without remainderIFused)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trnopt.kernels.nki_api import nisa, nki, nl
from trnopt.kernels.sim import run_ranks


@dataclass
class Scale(nl.NKIObject):
    factor: float
    offset: float
    unused: int


@nki.jit
def scaled(x):
    cfg = Scale(factor=2.0, offset=1.0)  # ``unused`` left out: None
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    factor = cfg.factor * 3.0 if cfg.unused is None else cfg.factor
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor, op1=nl.add, operand1=cfg.offset)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_left_out_field_is_none_and_the_kernel_matches_numpy() -> None:
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    out = run_ranks(scaled, [(x,)]).outputs[0]
    np.testing.assert_array_equal(out, (x * np.float32(6.0) + np.float32(1.0)).astype(np.float32))


def test_positional_and_keyword_fields_still_set() -> None:
    s = Scale(4.0, offset=2.0)
    assert (s.factor, s.offset, s.unused) == (4.0, 2.0, None)
    assert Scale(1.0, 2.0, 3).unused == 3
