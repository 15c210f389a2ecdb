"""`trnopt kernels` stays bounded: rows of the numerics check, groups too large to hold, and --time-limit."""

from __future__ import annotations

import json
import time

import pytest

from trnopt.kernels import command
from trnopt.kernels.plan import GroupPlan
from trnopt.optimizer.commands.cli import main
from tests.kernels.test_command import hand_layout


def test_rows_per_rank_shrink_as_the_group_grows():
    assert command.scaled_rows(8, 2, 2) == 64                 # small groups: the full 64 rows per rank
    assert command.scaled_rows(64, 2, 4) == 16                # TP64: 1,024 rows in all
    assert command.scaled_rows(64, 2, 4) * 64 == command.SCALED_ROWS
    assert command.scaled_rows(256, 2, 4) == 16               # never below one row per direction, core, channel
    assert command.scaled_shape("allgather_matmul", 64, 2, 4) == (1024, 256, 128)


def test_a_group_too_large_to_hold_is_not_run_and_says_so():
    group = GroupPlan.__new__(GroupPlan)  # only the fields check_tp reads before it decides
    object.__setattr__(group, "dim", "tp")
    object.__setattr__(group, "first_group", tuple(range(256)))
    checks = command.check_tp(group, "allgather_matmul", lnc=2)
    assert [c.kernel for c in checks] == ["allgather_matmul", "allgather_ring"]
    assert all(c.ok is None and "512 simulated cores" in c.detail and "1 GiB" in c.detail for c in checks)


def test_time_limit_stops_the_runs_and_exits_4(tmp_path, capsys):
    # TP16 (a check of 32 simulated cores) needs 16 KV heads to divide under torchtitan
    path = hand_layout(tmp_path, "trn2u", {"core": 4, "x": 4}, model="gpt3-175b")
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(["kernels", "--layout", str(path), "--time-limit", "0.5", "--json", "-"])
    elapsed = time.monotonic() - t0
    captured = capsys.readouterr()
    assert rc == 4
    doc = json.loads(captured.out)
    assert doc["ok"] is False and all(c["ok"] is None and "--time-limit" in c["detail"] for c in doc["checks"])
    assert all("time limit" in r["source"] for r in doc["overlap"]["rows"])
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trnopt: time limit: --time-limit 0.5 s stopped")
    # not a speed test: the full run takes minutes of CPU; stopped, it ends within seconds of its limit
    assert elapsed < 60


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_time_limit_is_checked(tmp_path, capsys, value):
    path = hand_layout(tmp_path, "trn2u", {"core": 4})
    assert main(["kernels", "--layout", str(path), "--time-limit", value]) == 2
    assert "--time-limit" in capsys.readouterr().err
