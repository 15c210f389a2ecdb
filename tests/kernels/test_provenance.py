"""Simulated numbers name the simulator that made them: the shipped overlap table was written by
this simulator version; the names the real package has beyond the reference table exist."""

from __future__ import annotations

from trnopt.kernels import sim
from trnopt.kernels.sim import apicheck, language, nki_typing
from trnopt.optimizer.cost.overlap import measured


def test_the_shipped_overlap_table_was_written_by_this_simulator_version():
    # raise kernels/sim/__init__.py's __version__ with the clock, and regenerate the table with it
    assert measured().simulator_version == sim.__version__


def test_names_beyond_the_reference_table():
    assert apicheck.beyond_table_missing() == []
    assert list(language.range(2, 8, 3)) == [2, 5] and language.bool is language.bool_
    assert language.bool_.itemsize == 1  # "stored as a byte"
    assert nki_typing.mutable_tensor is nki_typing.tensor
