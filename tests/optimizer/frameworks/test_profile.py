"""Framework profiles: the decisions each framework runs, and which placements its rank order produces."""

from __future__ import annotations

import random
from dataclasses import FrozenInstanceError, replace

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import profile as P
from trnopt.optimizer.model.schedules import SCHEDULES
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
    ddp = build(t, 2, {"tp": {"core": 4, "x": 4, "y": 4}, "pp": {"ring": 4}, "dp": {"efa": 2}}, dp_replicate=2,
                recompute="op")
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
    lay = build(t, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}}, interleave=2,
                recompute="full")
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


@pytest.mark.parametrize("shape", [llama405b_trn2u_x2, deepseek_trn3_gen2, llama8b_trn2])
def test_tested_shapes_are_producible(shape):
    t, lay = shape()
    assert P.TORCHTITAN.producible(lay, t) is None
    assert P.placement_conflict(lay, t) is None


def test_tp_across_the_ring_is_not_producible_and_the_reason_says_why():
    t = load_target("trn2u")
    lay = build(t, 2, {"tp": {"ring": 4}, "dp": {"core": 4, "x": 4, "y": 4, "efa": 2}})
    why = P.TORCHTITAN.producible(lay, t)
    assert why is not None
    assert "tp takes 4 on ring" in why and "dp takes 4 on core" in why
    assert "ranks 0, 4, 8" in why and "64 consecutive ranks" in why
    assert isinstance(P.torchrun_binding(lay, t), str)


def test_pipeline_stages_inside_an_instance_before_dp_across_are_not_producible():
    t = load_target("trn2")
    lay = build(t, 2, {"tp": {"core": 4}, "dp": {"efa": 2}, "pp": {"x": 4, "y": 4}})
    assert "dp takes 2 on efa" in P.TORCHTITAN.producible(lay, t)


def test_expert_with_context_parallel_is_refused_by_torchtitan_only():
    t = load_target("trn2u")
    lay = build(t, 1, {"tp": {"core": 4}, "cp": {"x": 2}, "ep": {"x": 2, "y": 4}, "dp": {"ring": 4}})
    assert "expert-parallel" in P.TORCHTITAN.producible(lay, t)
    assert P.NXD.producible(lay, t) is None


def test_binding_lands_every_rank_on_its_planned_core():
    t, lay = llama8b_trn2()
    b = P.torchrun_binding(lay, t)
    assert b.bound and b.nproc_per_node == 64 and b.nodes == 1
    slot = b.slot
    for p in rank_map(lay, t):
        n, local = divmod(p.rank, b.nproc_per_node)
        assert slot[n] == (p.domain, p.instance)
        assert b.local_core[local] == p.chip * lay.ranks_per_chip + p.core
    # default placement (tp on the cores, dp over the chips): local rank i is core i, no binding
    t2, lay2 = llama405b_trn2u_x2()
    b2 = P.torchrun_binding(lay2, t2)
    assert not b2.bound and b2.nodes == 8
    assert b2.node_rank == {(d, i): 4 * d + i for d in range(2) for i in range(4)}


def test_node_order_permutes_instances_when_the_plan_numbers_them_otherwise():
    # DP over the ring first and the torus second: instance i of the domain holds ranks of dp block i
    t = load_target("trn2u")
    lay = build(t, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}})
    b = P.torchrun_binding(lay, t)
    assert sorted(b.node_rank.values()) == [0, 1, 2, 3]
    lay_rev = build(t, 1, {"tp": {"core": 4, "x": 4, "y": 4}, "pp": {"ring": 4}})
    assert P.TORCHTITAN.producible(lay_rev, t) is None


def exact_binding(lay, t):
    """The referee of torchrun_binding, from every rank's place: (node rank per instance, cores of
    each node by local rank) when every instance holds one aligned block of consecutive ranks, else None."""
    per = lay.ranks_per_chip * t.chips_per_instance
    on: dict[tuple[int, int], dict[int, int]] = {}
    for p in rank_map(lay, t):
        on.setdefault((p.domain, p.instance), {})[p.rank] = p.chip * lay.ranks_per_chip + p.core
    node_rank, cores = {}, []
    for slot, held in on.items():
        first = min(held)
        if first % per or sorted(held) != list(range(first, first + per)):
            return None
        node_rank[slot] = first // per
        cores.append(tuple(held[first + i] for i in range(per)))
    return node_rank, cores


@pytest.mark.parametrize("name,domains,lnc", [("trn2u", 2, 2), ("trn2u", 1, 1), ("trn2", 2, 2),
                                              ("trn3-gen2", 1, 2), ("trn3-gen1", 1, 2)])
def test_structural_rule_agrees_with_the_exact_check(name, domains, lnc):
    """The rule the search can state as constraints (placement_conflict) is the exact check."""
    t = load_target(name)
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(120):
        lay = random_layout(t, domains, rng, lnc, dims=("tp", "dp", "pp"))
        referee = exact_binding(lay, t)
        exact = referee is not None
        assert (P.placement_conflict(lay, t) is None) is exact, lay.placement_text()
        assert (P.TORCHTITAN.producible(lay, t) is None) is exact
        fast = P.torchrun_binding(lay, t)
        assert isinstance(fast, P.TorchrunBinding) is exact
        if exact:
            node_rank, cores = referee
            assert fast.node_rank == node_rank and all(c == fast.local_core for c in cores), lay.placement_text()
        seen[exact] += 1
    assert seen[True] and seen[False]  # both outcomes exercised


def test_the_binding_of_millions_of_ranks_reads_instances_not_ranks():
    t = load_target("trn2u")
    lay = build(t, 19968, {"tp": {"core": 4, "x": 2}, "dp": {"x": 2, "y": 4, "ring": 4, "efa": 19968}})
    b = P.torchrun_binding(lay, t)
    assert isinstance(b, P.TorchrunBinding) and b.nodes == 19968 * 4 and not b.bound
    assert sorted(b.node_rank.values()) == list(range(b.nodes))
