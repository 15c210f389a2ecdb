"""Simulated numbers name the simulator that made them: the shipped overlap table was written by
this simulator version; the names the real package has beyond the reference table exist."""

from __future__ import annotations

from trnopt.kernels import sim
from trnopt.kernels.sim import apicheck, language, nki_typing
from trnopt.optimizer.cost.overlap import measured


def test_the_shipped_overlap_table_was_written_by_this_simulator():
    """The shipped table names the simulator that wrote it, and that is this one: a clock change
    (a new ``__version__``) fails here until benchmarks/overlap_table.py has regenerated it."""
    from trnopt.optimizer.commands.report import stale_note

    table = measured()
    assert table.simulator_version == sim.__version__
    assert f"trnopt NKI simulator {sim.__version__}" in table.provenance_text()
    assert stale_note(table) == ""


def test_the_report_says_when_a_table_is_older_than_the_simulator():
    from trnopt.optimizer.commands.report import stale_note
    from trnopt.optimizer.cost.overlap import parse_table

    old = parse_table({"version": 1, "provenance": {"simulator_version": "0.9"}, "rows": []}, "old.json")
    assert stale_note(old) == f"; this simulator is {sim.__version__}: regenerate the table"
    assert stale_note(parse_table({"version": 1, "rows": []}, "hand.json")) == ""


def test_names_beyond_the_reference_table():
    assert apicheck.beyond_table_missing() == []
    assert list(language.range(2, 8, 3)) == [2, 5] and language.bool is language.bool_
    assert language.bool_.itemsize == 1  # "stored as a byte"
    assert nki_typing.mutable_tensor is nki_typing.tensor


def test_the_report_reads_the_simulators_version_without_importing_it():
    """The solve report names the simulator version; reading it must not import the simulator."""
    import subprocess
    import sys

    code = ("import sys; from trnopt.optimizer.commands.report import simulator_version; v = simulator_version(); "
            "imported = 'trnopt.kernels.sim' in sys.modules; import trnopt.kernels.sim as sim; "
            "print(imported, v == sim.__version__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]
