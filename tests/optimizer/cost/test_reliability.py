"""Reliability: Young's interval on the seed's numbers, and the goodput it implies."""

import pytest

from trnopt.optimizer.cost.reliability import goodput_fraction, job_mtbf, young_interval


def test_seed_young_interval():
    assert young_interval(90, 24 * 3600) / 60 == pytest.approx(65.7, abs=0.05)


def test_job_mtbf_shrinks_with_instances():
    assert job_mtbf(3170 * 3600, 8) == pytest.approx(3170 * 3600 / 8)


def test_goodput_is_a_fraction_and_peaks_near_young():
    delta, mtbf, restart = 90.0, 24 * 3600.0, 600.0
    tau = young_interval(delta, mtbf)
    best = goodput_fraction(delta, tau, mtbf, restart)
    assert 0 < best < 1
    assert best >= goodput_fraction(delta, tau / 2, mtbf, restart)
    assert best >= goodput_fraction(delta, tau * 2, mtbf, restart)
