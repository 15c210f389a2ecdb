"""The kernel benchmarks' command lines: the device script without a device, and the table
row both benchmarks print (the device script reuses the simulator's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kernel_device  # noqa: E402
import kernel_overlap  # noqa: E402


@pytest.mark.skipif(bool(kernel_device._no_device_reason() is None), reason="a Neuron device is present")
def test_device_script_without_a_device_says_so_and_exits_0(capsys):
    assert kernel_device.main(["--lnc", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel_device: not run: ") and "kernel_overlap.py" in out


def test_a_row_names_its_lnc_and_marks_a_miss():
    shape = kernel_overlap.full_shape("allgather_matmul", 16384, 16)
    row = kernel_overlap.row_text("allgather_matmul", "llama3-405b", 16, 2, 2, shape,
                                  (1e-3, 5e-4, 1.2e-3, 0.6, 1.25), "-", 0.95)
    assert row.split()[2:5] == ["16", "2", "2"] and row.endswith("0.95 MISS")
    assert kernel_overlap.header().split()[1:5] == ["model", "TP", "ch", "LNC"]


def test_a_miss_says_where_its_overrun_went():
    from trnopt.kernels.overlap import OverlapResult
    r = OverlapResult("allgather_matmul", 32, 2, {}, t_mm=233e-6, t_cc=278e-6, t_f=293e-6,
                      hidden_fraction=1 - 60 / 278, speedup=511 / 293, exposed_comm_f=0.0,
                      cc_window=(4e-6, 287e-6), numerics=False)
    line = kernel_overlap.overrun_text(r, 0.80)
    assert "T_f - T_cc = 15.0 us: 4.0 before the first transfer + 5.0 of transfers beyond T_cc + 6.0 after" in line
    assert line.endswith("the goal allows 10.6 (T_mm - goal x T_cc)")
    short = OverlapResult("allgather_matmul", 32, 2, {}, 200e-6, 278e-6, 290e-6, 0.0, 1.0, 0.0, (0.0, 285e-6), False)
    assert kernel_overlap.overrun_text(short, 0.80).endswith("no schedule reaches the goal (T_mm < goal x T_cc)")


def test_benchmark_channels_are_the_plans():
    """The benchmark runs each TP group on the channels `trnopt.kernels.plan` gives it where
    the overlap table places it: one on a chip pair, four for a whole trn2 instance; the
    expert kernel in both its variants (all_to_all, and the ring's two directions)."""
    ag = "allgather_matmul"
    assert kernel_overlap.channels_for(ag, 16, 1) == (1,)  # 8 cores x 2 chips joined by one link
    assert kernel_overlap.channels_for(ag, 8, 2) == (1,)
    assert kernel_overlap.channels_for(ag, 32, 2) == (2,)
    assert kernel_overlap.channels_for(ag, 64, 2) == (4,)  # every core of a trn2.48xlarge
    assert kernel_overlap.channels_for(ag, 64, 1) == (2,)
    assert kernel_overlap.channels_for("alltoall_expert_matmul", 8, 2) == (1, 2)
    with pytest.raises(SystemExit, match="--tp 128 at LNC 2: not a TP group of one trn2 instance"):
        kernel_overlap.channels_for(ag, 128, 2)
