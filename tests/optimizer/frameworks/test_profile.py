"""Framework profiles: the decisions each framework runs, and which placements its rank order produces."""

from __future__ import annotations

import random
from dataclasses import FrozenInstanceError, replace

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import profile as P
from trnopt.optimizer.model.layout import SCHEDULES
from trnopt.optimizer.model.placement import rank_map
from trnopt.optimizer.model.target import load_target

from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import build, deepseek_trn3_gen2, llama8b_trn2, llama405b_trn2u_x2, random_layout

W405 = Workload(load_model("llama3-405b"), Training())


def test_profiles_are_frozen_and_named():
    assert P.profile("torchtitan") is P.TORCHTITAN and P.profile("nxd") is P.NXD
    assert P.DEFAULT == "torchtitan"
    with pytest.raises(FrozenInstanceError):
        P.TORCHTITAN.hsdp = False
    with pytest.raises(InputError, match="unknown framework"):
        P.profile("megatron")


def test_torchtitan_runs_fsdp_with_hsdp_and_its_schedules():
    tt = P.TORCHTITAN
    assert tt.zero_stages == (3,) and tt.hsdp and tt.interleaved and {"every-2", "every-4"} <= set(tt.recompute)
    assert {"1F1B", "Interleaved1F1B"} <= set(tt.schedules)
    assert {"ZBVZeroBubble", "DualPipeV"} <= {s for s, _ in tt.schedules_refused}  # under torch.compile
    t, lay = llama405b_trn2u_x2()
    assert tt.supports(lay, W405) is None
    assert tt.schedule(lay) == "1F1B"
    assert "ZeRO-1" in tt.supports(replace(lay, zero=1, dp_replicate=1), W405)
    # all of dp replicated, nothing sharded: torchtitan would run DDP, which it cannot with TP
    ddp = build(t, 2, {"tp": {"core": 4, "x": 4, "y": 4}, "pp": {"ring": 4}, "dp": {"efa": 2}}, dp_replicate=2)
    assert ddp.dp_shard == 1 and "DDP" in tt.supports(ddp, W405)


def test_nxd_runs_zero1_without_hsdp():
    t, lay = llama405b_trn2u_x2()
    assert P.NXD.zero_stages == (0, 1) and not P.NXD.hsdp
    assert "HSDP" in P.NXD.supports(replace(lay, zero=1), W405)
    assert P.NXD.supports(replace(lay, zero=1, dp_replicate=1), W405) is None
    assert "ZeRO-3" in P.NXD.supports(replace(lay, dp_replicate=1), W405)


def test_schedule_names_follow_interleave():
    t = load_target("trn2u")
    lay = build(t, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}}, interleave=2)
    assert P.TORCHTITAN.schedule(lay) == "Interleaved1F1B"
    assert P.NXD.schedule(lay) == "interleaved 1F1B"
    assert P.TORCHTITAN.schedule(replace(lay, interleave=1)) == "1F1B"
    no_interleave = replace(P.NXD, schedules=("1F1B",))
    assert "no Interleaved1F1B pipeline schedule" in no_interleave.supports(replace(lay, zero=1), W405)


def test_each_framework_runs_the_schedules_its_code_names():
    t = load_target("trn2u")
    lay = build(t, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}}, interleave=2)
    for name in ("ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble"):
        split = replace(lay, schedule=name)
        assert P.TORCHTITAN.schedule(split) == name
        assert "_check_torch_compile_compatibility" in P.TORCHTITAN.supports(split, W405)
        why = P.NXD.supports(replace(split, zero=1), W405)
        assert why.startswith(f"nxd has no {name} pipeline schedule") and "virtual_pipeline" in why
    gpipe = replace(lay, interleave=1, schedule="GPipe")
    assert P.TORCHTITAN.schedule(gpipe) == "GPipe" and P.TORCHTITAN.supports(gpipe, W405) is None
    assert "GPipe" in P.NXD.supports(replace(gpipe, zero=1), W405)
    named = set(P.TORCHTITAN.schedules) | {s for s, _ in P.TORCHTITAN.schedules_refused}
    assert named == set(SCHEDULES) and "pipeline_parallel.py" in P.TORCHTITAN.schedule_source
