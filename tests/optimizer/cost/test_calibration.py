"""The cost model on the published runs it is calibrated on, and the fit behind the shipped values."""

import dataclasses

import pytest

from trnopt.optimizer.cost.calibration import GPU_FREE, band, fit, rows, table5_cases, trn1_cases
from trnopt.optimizer.model.target import BUILTIN_TARGETS, load_target

TRAINIUM = ("trn1", "trn2", "trn2u", "trn3-gen1", "trn3-gen2")


def test_trn1_published_runs_within_the_goal():
    scored = rows(load_target("trn1"), trn1_cases())
    errors = [abs(r.error) for r in scored]
    assert len(scored) == 6
    assert sum(errors) / len(errors) <= 0.10, [f"{r.label} {r.error:+.1%}" for r in scored]
    assert max(errors) <= 0.20, [f"{r.label} {r.error:+.1%}" for r in scored]


def test_table5_errors_within_the_goal():
    scored = rows(load_target("a100"), table5_cases())
    errors = [abs(r.error) for r in scored]
    assert len(scored) == 8
    assert sum(errors) / len(errors) <= 0.05, [f"{r.label} {r.error:+.1%}" for r in scored]


def test_shipped_trainium_efficiency_is_the_trn1_fit_and_carried_to_trn2_and_trn3():
    trn1 = load_target("trn1")
    found = fit(trn1, trn1_cases())
    best = found.efficiency
    assert dataclasses.replace(best, fitted_on=trn1.efficiency.fitted_on) == trn1.efficiency
    assert all(a.achievable == found.link_share for a in trn1.domain_axes)
    for name in TRAINIUM:
        e = load_target(name).efficiency
        assert dataclasses.replace(e, fitted_on="") == dataclasses.replace(best, fitted_on=""), name
        assert "trn1" in e.fitted_on, name


def test_shipped_gpu_efficiency_is_the_table5_fit():
    a100 = load_target("a100")
    best = fit(a100, table5_cases(), GPU_FREE).efficiency
    assert dataclasses.replace(best, fitted_on=a100.efficiency.fitted_on) == a100.efficiency


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_every_target_says_what_its_efficiency_was_fitted_on(name):
    assert load_target(name).efficiency.fitted_on


def test_band_brackets_the_rows():
    low, high = band([0.10, -0.05, 0.02])
    assert low == pytest.approx(1 / 1.10) and high == pytest.approx(1 / 0.95)
    assert band([0.0]) == (1.0, 1.0)
