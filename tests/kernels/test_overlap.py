"""The overlap harness: registry entries, the timer's ratios, and its numerics check."""

from __future__ import annotations

import pytest

import numpy as np

from trnopt.kernels.overlap import BF16, REGISTRY, agreement, baseline, hidden_fraction, measure, speedup
from trnopt.kernels.sim import LinkModel

LINK = LinkModel(256e9, 1.5e-6)


def test_registry_names_every_part():
    assert set(REGISTRY) == {"allgather_matmul", "matmul_reduce_scatter", "alltoall_expert_matmul"}
    for name, e in REGISTRY.items():
        assert e.name == name and e.fused.__name__ == name
        assert callable(e.reference) and e.collective is not e.fused and e.baseline is not e.fused


def test_unknown_kernel_says_what_is_known():
    with pytest.raises(KeyError, match="known:"):
        REGISTRY["nope"]


def test_allgather_timings(dtypes):
    t = measure("allgather_matmul", {"m": 1024, "k": 512, "n": 512}, tp=4, dtype=dtypes["bf16"],
                link=LINK, channels=2).as_dict()
    assert set(t) >= {"t_mm", "t_cc", "t_f", "hidden_fraction", "speedup"}
    # no t_f >= t_mm: the fused kernel receives X into SBUF over the ring where the
    # undecomposed matmul loads it from HBM, so at a load-bound shape it may be the faster
    assert t["t_mm"] > 0 and t["t_cc"] > 0 and t["t_f"] > 0
    assert t["hidden_fraction"] == pytest.approx(1 - (t["t_f"] - t["t_mm"]) / t["t_cc"])
    assert t["speedup"] == pytest.approx((t["t_mm"] + t["t_cc"]) / t["t_f"])
    assert t["numerics"] is False


@pytest.mark.parametrize("kernel,shape,ch", [
    ("allgather_matmul", {"m": 1024, "k": 512, "n": 512}, 2),
    ("matmul_reduce_scatter", {"m": 1024, "k": 256, "n": 1024}, 1),
    ("alltoall_expert_matmul", {"tokens": 256, "h": 256, "f": 256, "n_sub": 2}, 2),
])
def test_overrun_parts_sum_to_what_the_fused_kernel_adds(kernel, shape, ch, dtypes):
    r = measure(kernel, shape, tp=4, dtype=dtypes["bf16"], link=LINK, channels=ch)
    before, beyond, after = r.overrun()
    first, last = r.cc_window
    assert 0 <= first < last <= r.t_f and before == first and after == r.t_f - last
    assert before + beyond + after == pytest.approx(r.t_f - r.t_cc)
    assert (r.t_mm - before - beyond - after) / r.t_cc == pytest.approx(r.hidden_fraction)
    if kernel == "matmul_reduce_scatter":
        assert before > 0  # the first partial sum must be computed before it can move


@pytest.mark.parametrize("kernel,shape,lnc", [("allgather_matmul", {"m": 1024, "k": 512, "n": 512}, 1),
                                              ("matmul_reduce_scatter", {"m": 1024, "k": 256, "n": 1024}, 2)])
def test_a_baseline_simulated_once_serves_every_ring_and_link(kernel, shape, lnc):
    """benchmarks/overlap_table.py simulates T_mm once per shape (`baseline`) and passes it to
    `measure` for every ring and link: the rows must be the ones a whole measurement gives."""
    t_mm = baseline(kernel, shape, lnc=lnc)
    for tp, link, ch in ((4, LINK, 2), (2, LinkModel(12.5e9, 15e-6), 1)):
        whole = measure(kernel, shape, tp=tp, link=link, channels=ch, lnc=lnc)
        reused = measure(kernel, shape, tp=tp, link=link, channels=ch, lnc=lnc, t_mm=t_mm)
        assert whole.t_mm == t_mm
        assert (reused.t_mm, reused.t_cc, reused.t_f, reused.hidden_fraction) == (
            whole.t_mm, whole.t_cc, whole.t_f, whole.hidden_fraction)


def test_reduce_scatter_timings(dtypes):
    t = measure("matmul_reduce_scatter", {"m": 1024, "k": 256, "n": 1024}, tp=4, dtype=dtypes["bf16"],
                link=LINK, channels=1).as_dict()
    assert t["t_mm"] > 0 and t["t_cc"] > 0 and t["t_f"] >= t["t_mm"]
    assert t["hidden_fraction"] == pytest.approx(1 - (t["t_f"] - t["t_mm"]) / t["t_cc"])


def test_expert_timings(dtypes):
    t = measure("alltoall_expert_matmul", {"tokens": 256, "h": 256, "f": 256, "n_sub": 2}, tp=4,
                dtype=dtypes["bf16"], link=LINK).as_dict()
    assert t["t_mm"] > 0 and t["t_cc"] > 0 and t["t_f"] > 0
    assert t["speedup"] == pytest.approx((t["t_mm"] + t["t_cc"]) / t["t_f"])


@pytest.mark.parametrize("kernel,shape,ch", [
    ("allgather_matmul", {"m": 256, "k": 200, "n": 96}, 2),
    ("matmul_reduce_scatter", {"m": 256, "k": 130, "n": 300}, 2),
    ("alltoall_expert_matmul", {"tokens": 64, "h": 130, "f": 96, "n_sub": 2}, 1),
    ("alltoall_expert_matmul", {"tokens": 64, "h": 130, "f": 96, "n_sub": 2}, 2),
])
def test_numerics_check_against_the_reference(kernel, shape, ch, dtypes):
    r = measure(kernel, shape, tp=4, dtype=dtypes["fp32"], link=LINK, channels=ch, numerics=True)
    assert r.ok is True and r.max_err < 1e-5


def test_numerics_check_catches_a_wrong_reference(monkeypatch, dtypes):
    from trnopt.kernels import references
    real = references.allgather_matmul_reference
    monkeypatch.setattr(references, "allgather_matmul_reference", lambda *a, **k: 2 * real(*a, **k))
    r = measure("allgather_matmul", {"m": 256, "k": 200, "n": 96}, tp=2, dtype=dtypes["fp32"], link=LINK,
                numerics=True)
    assert r.ok is False


def test_agreement_rule_at_its_boundary():
    # BF16 rtol 2e-2: an element may be off by 0.02 x (|e| + max|e|); here max|e| = 10
    e = np.array([10.0, 1.0, 0.0])
    assert agreement(e + [0.39, 0.21, 0.19], e, BF16).ok  # bounds 0.4, 0.22, 0.2
    bad = agreement(e + [0.0, 0.23, 0.21], e, BF16)
    assert not bad.ok and bad.off == 2 and bad.rel == pytest.approx(0.023)
    assert "2 elements off" in str(bad)
    nan = agreement([np.nan, 1.0, 0.0], e, BF16)
    assert not nan.ok and nan.off == 1 and nan.rel == float("inf")
    wrong = agreement(np.zeros((2, 3)), np.zeros((3, 2)), BF16)
    assert not wrong.ok and str(wrong) == "shape (2, 3) != expected (3, 2)"


def test_ratio_formulas():
    assert hidden_fraction(10, 4, 11) == pytest.approx(0.75)
    assert speedup(10, 4, 11) == pytest.approx(14 / 11)
    with pytest.raises(AssertionError, match="T_cc must be > 0"):
        hidden_fraction(1, 0, 1)
