"""KernelPlan: group 0 stands for every replica group, every ring hop is one link, link class and model."""

from __future__ import annotations

import math

import pytest

from trnopt.kernels.plan import grid_cycle, kernel_plan, local_ring, order_group, snake
from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.placement import groups, rank_map
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

WORKLOAD = Workload(load_model("llama3-405b"), Training(seq=8192, global_batch=1024))


def layout_for(target_name: str, tp: dict[str, int], lnc: int = 2, ep: dict[str, int] | None = None,
               domains: int = 1) -> tuple[Layout, object]:
    """TP (and EP) on the given axis factors; the rest is DP."""
    target = load_target(target_name)
    axes = target.axes(lnc, domains)
    tp_row = tuple(tp.get(a.name, 1) for a in axes)
    ep_row = tuple((ep or {}).get(a.name, 1) for a in axes)
    dp_row = tuple(a.size // (f * e) for a, f, e in zip(axes, tp_row, ep_row))
    rows = {"tp": tp_row, "ep": ep_row, "dp": dp_row}
    placement = tuple(rows.get(d, (1,) * len(axes)) for d in DIMS)
    t, e = math.prod(tp_row), math.prod(ep_row)
    ranks = math.prod(a.size for a in axes)
    return Layout(tp=t, pp=1, dp=ranks // t, ep=e, axes=axes, placement=placement, lnc=lnc), target


CASES = [
    # (target, tp placement, lnc, expected link class)
    ("trn2", {"core": 4, "x": 4}, 2, "torus"),          # TP16 along one torus ring
    ("trn2", {"core": 4, "x": 2, "y": 2}, 2, "torus"),  # TP16 on a 2x2 sub-grid (lines, even box)
    ("trn2", {"x": 4, "y": 4}, 2, "torus"),             # TP16 on the whole torus, cores to DP
    ("trn2", {"core": 8, "x": 2}, 1, "torus"),          # TP16 at LNC=1
    ("trn2", {"core": 4, "x": 4, "y": 4}, 2, "torus"),  # TP64, the whole instance
    ("trn2u", {"ring": 4}, 2, "ring"),                  # a TP group on the UltraServer ring
    ("trn2u", {"core": 4, "ring": 4}, 2, "ring"),
    ("trn2u", {"core": 4, "ring": 2}, 2, "ring"),
    ("trn2u", {"core": 4, "x": 4, "y": 2, "ring": 2}, 2, "ring"),
    ("trn2u", {"core": 4}, 2, "core"),
    ("trn3-gen1", {"core": 4, "switch": 4}, 2, "switch"),
    ("trn3-gen1", {"switch": 16}, 2, "switch"),
    ("trn3-gen2", {"core": 4, "switch": 8}, 2, "switch"),
    ("trn3-gen2", {"core": 2, "switch": 3}, 2, "switch"),  # odd chip count: the switch closes any ring
]


def every_ring(layout, target, dim):
    """Every group of ``dim`` from the whole rank map, each in the plan's ring order: the referee
    for the plan's claim that group 0 stands for all of them."""
    coords = {r: layout.rank_coordinates(r)[1] for r in range(layout.ranks)}
    places = rank_map(layout, target)
    rings = [order_group(layout, coords, [p.rank for p in g])[0] for g in groups(layout, places, dim)]
    return rings, coords


@pytest.mark.parametrize("target_name,tp,lnc,cls", CASES, ids=lambda v: str(v))
def test_plan_rings_are_one_link_per_hop_and_stand_for_every_group(target_name, tp, lnc, cls):
    layout, target = layout_for(target_name, tp, lnc)
    plan = kernel_plan(WORKLOAD, layout, target)
    g = plan.tp
    assert g.size == layout.tp and g.count * g.size == layout.ranks
    assert g.link_class == cls == cc.link_class(layout.span("tp"))
    assert g.one_hop, g.hops
    assert all(h.links == 1 for h in g.hops)
    rings, coords = every_ring(layout, target, "tp")
    assert len(rings) == g.count
    assert sorted(r for ring in rings for r in ring) == list(range(layout.ranks))  # the groups partition the ranks
    assert tuple(rings[0]) == g.first_group
    for ring in rings:
        for a, b in zip(ring, ring[1:] + ring[:1]):
            ca, cb = coords[a], coords[b]
            diff = [(ax, x, y) for ax, x, y in zip(layout.axes[1:], ca[1:], cb[1:]) if x != y]
            assert len(diff) <= 1, (a, b, diff)  # same chip, or one axis
            for ax, x, y in diff:
                d = abs(x - y)
                assert ax.kind in ("switch", "scale_out") or min(d, ax.size - d) == 1, (a, b, ax.name, x, y)
    assert plan.problems() == []


def test_trn2_torus_ring_crosses_chips_in_a_cycle():
    layout, target = layout_for("trn2", {"x": 4, "y": 4})
    g = kernel_plan(WORKLOAD, layout, target).tp
    assert g.hop_counts() == {"torus": 16}
    assert g.channels == 2
    assert g.link_gbs == pytest.approx(512 / 2 / 4)  # one direction of one axis, shared by 4 groups per chip
    assert g.latency_us == pytest.approx(1.5)


def test_trn2u_ring_link_model_matches_the_benchmark_convention():
    # core4 x ring4: one group per chip; 256 GB/s per chip on the ring, both directions -> 128 per channel
    layout, target = layout_for("trn2u", {"core": 4, "ring": 4})
    g = kernel_plan(WORKLOAD, layout, target).tp
    assert g.link_gbs == pytest.approx(128.0)
    assert g.hop_counts() == {"core": 12, "ring": 4}
    # TP16 in the trn2 torus, one group per chip: 256 GB/s per channel, as benchmarks/kernel_overlap.py
    layout, target = layout_for("trn2", {"core": 4, "x": 4})
    assert kernel_plan(WORKLOAD, layout, target).tp.link_gbs == pytest.approx(256.0)


def test_two_chips_on_a_partial_axis_get_one_channel():
    layout, target = layout_for("trn2", {"core": 4, "x": 2})
    g = kernel_plan(WORKLOAD, layout, target).tp
    assert g.one_hop and g.channels == 1


def test_core_only_group_and_tp1():
    layout, target = layout_for("trn2u", {"core": 4})
    plan = kernel_plan(WORKLOAD, layout, target)
    assert plan.tp.hop_counts() == {"core": 4} and plan.tp.channels == 2
    assert [k.kernel for k in plan.kernels] == ["allgather_matmul", "matmul_reduce_scatter"]
    assert all(k.fits for k in plan.kernels)
    layout, target = layout_for("trn2u", {})
    plan = kernel_plan(WORKLOAD, layout, target)
    assert plan.tp.size == 1 and plan.kernels == () and plan.problems() == []


def test_ep_groups_partition_and_plan_the_expert_kernel():
    moe = Workload(load_model("mixtral-8x7b"), Training(seq=4096, global_batch=256))
    layout, target = layout_for("trn3-gen1", {"core": 4}, ep={"switch": 8})
    plan = kernel_plan(moe, layout, target)
    assert plan.ep is not None and plan.ep.size == 8 and plan.ep.count == layout.ranks // 8
    rings, _ = every_ring(layout, target, "ep")
    assert sorted(r for ring in rings for r in ring) == list(range(layout.ranks)) and tuple(rings[0]) == plan.ep.first_group
    assert plan.ep.one_hop and plan.ep.link_class == "switch"
    expert = next(k for k in plan.kernels if k.kernel == "alltoall_expert_matmul")
    assert expert.channels == 1 and "ncc.all_to_all" in "\n".join(plan.lines())  # a switch: the runtime's


@pytest.mark.parametrize("target,ep,lnc,channels", [
    ("trn2", {"x": 4}, 2, 2),             # a torus ring: both directions, store and forward
    ("trn2u", {"ring": 4}, 2, 2),         # the UltraServer ring
    ("trn2", {"x": 4, "y": 2}, 1, 2),     # EP8 on a 4x2 sub-grid's cycle
    ("trn2", {"x": 2}, 2, 1),             # two chips on a partial axis share one link: one channel, all_to_all
    ("trn2", {"core": 4}, 2, 1),          # within one chip
])
def test_expert_exchange_follows_the_ep_ring(target, ep, lnc, channels):
    from trnopt.kernels import ring_alltoall
    moe = Workload(load_model("mixtral-8x7b"), Training(seq=4096, global_batch=256))
    layout, tgt = layout_for(target, {}, lnc=lnc, ep=ep)
    plan = kernel_plan(moe, layout, tgt)
    expert = next(k for k in plan.kernels if k.kernel == "alltoall_expert_matmul")
    assert expert.channels == channels, (plan.ep.link_class, plan.ep.channels)
    # bytes per channel at the first step: the whole send buffer, or the ring direction's half-blocks;
    # on the ring each core's capacity slots are even
    e_local, h = 8 // layout.ep, 4096
    block, rem = divmod(expert.chunk_bytes * (1 if channels == 1 else 2), 2 * e_local * h * (
        layout.ep if channels == 1 else len(ring_alltoall.pieces(layout.ep, 0))))
    assert rem == 0 and (channels == 1 or block % (2 * lnc) == 0), (expert.chunk_bytes, block)


def test_odd_line_without_wrap_is_flagged():
    # 3 chips on part of a 6-chip ring axis: no one-hop cycle exists; the check says so
    from trnopt.optimizer.model.target import Axis
    axes = (Axis("core", 1, "core", 1e12, 0.0), Axis("x", 6, "torus", 100e9, 1e-6), Axis("efa", 1, "scale_out", 1e9, 0))
    rows = tuple({"tp": (1, 3, 1), "dp": (1, 2, 1)}.get(d, (1, 1, 1)) for d in DIMS)
    layout = Layout(tp=3, pp=1, dp=2, axes=axes, placement=rows, lnc=1)
    from trnopt.kernels.plan import group_plan
    target = load_target("trn2")
    g = group_plan(layout, target, "tp")
    assert not g.one_hop
    assert max(h.links for h in g.hops) == 2


@pytest.mark.parametrize("a,b,wrap", [(2, 3, False), (3, 2, False), (4, 4, False), (3, 3, True), (5, 1, True),
                                      (2, 1, False), (3, 5, True), (4, 6, False)])
def test_grid_cycle_uses_grid_edges(a, b, wrap):
    cyc = grid_cycle(a, b, wrap)
    assert cyc is not None and sorted(cyc) == [(i, j) for i in range(a) for j in range(b)]
    for (i, j), (k, l) in zip(cyc, cyc[1:] + cyc[:1]):
        di, dj = abs(i - k), abs(j - l)
        ok = (di + dj == 1) or (dj == 0 and wrap and di == a - 1 and a >= 3) or (a * b == 2)
        assert ok, ((i, j), (k, l))


def test_grid_cycle_none_when_impossible_and_snake_is_a_path():
    assert grid_cycle(3, 3, False) is None
    pts = snake([3, 2, 4])
    assert len(set(pts)) == 24
    assert all(sum(abs(x - y) for x, y in zip(p, q)) == 1 for p, q in zip(pts, pts[1:]))


def test_local_ring_keeps_the_ring_order():
    assert local_ring((40, 41, 45, 44)) == (0, 1, 3, 2)


def test_the_plan_of_millions_of_ranks_reads_one_group():
    # 5.1 M ranks: a plan that visited every rank would take minutes here; group 0 is the same ring
    small, target = layout_for("trn2u", {"core": 4, "x": 2}, domains=1)
    huge, _ = layout_for("trn2u", {"core": 4, "x": 2}, domains=19968)
    assert huge.ranks == 19968 * 256
    a, b = kernel_plan(WORKLOAD, small, target).tp, kernel_plan(WORKLOAD, huge, target).tp
    assert b.count == huge.ranks // 8 and b.first_group == a.first_group and b.hops == a.hops and b.one_hop


@pytest.mark.parametrize("target_name,tp,lnc,channels", [
    ("trn2", {"core": 4, "x": 4, "y": 4}, 2, 4),            # every logical core of the instance
    ("trn2", {"core": 8, "x": 4, "y": 4}, 1, 4),            # every physical core, LNC 1
    ("trn2u", {"core": 4, "x": 4, "y": 4}, 2, 4),           # one instance of the UltraServer
    ("trn2u", {"core": 4, "x": 4, "y": 4, "ring": 2}, 2, 2),  # beyond one node
    ("trn2", {"x": 4, "y": 4}, 2, 2),                        # every chip but not every core
    ("trn2", {"core": 8, "x": 4, "y": 2}, 1, 2),            # half the torus
    ("trn3-gen1", {"core": 4, "switch": 16}, 2, 2),          # a switch, no torus
])
def test_four_channels_only_for_a_whole_node(target_name, tp, lnc, channels):
    """The collective pages allow 4 channels for a replica group of all devices in a node, 2 otherwise."""
    layout, target = layout_for(target_name, tp, lnc=lnc)
    assert kernel_plan(WORKLOAD, layout, target).tp.channels == channels


@pytest.mark.parametrize("target_name,tp,lnc,where,way,steps", [
    ("trn2", {"core": 4, "x": 4, "y": 4}, 2, "on chip", "both ways", 33),  # TP64: 128-row shards sit in SBUF
    ("trn2", {"core": 4}, 2, "through HBM", "halves", 4),                  # TP4: 2,048-row shards do not
    ("trn2", {"core": 4, "x": 2}, 2, "through HBM", "one way", 8),         # two chips on one link: one channel
])
def test_the_plan_states_the_ring_the_tp_kernels_run(target_name, tp, lnc, where, way, steps):
    """Each TP kernel's line says where its ring's chunks live, its schedule, its steps (the
    own one included) and the bytes per channel of its widest step, both cores of a rank
    counted: a shard of 8192 / TP rows goes whole each way (both ways), split over all
    channels (halves) or on one (one way)."""
    layout, target = layout_for(target_name, tp, lnc=lnc)
    plan = kernel_plan(WORKLOAD, layout, target)
    ms = 8192 // layout.tp
    for use in plan.kernels:
        assert use.ring == f"{where}{use.ring[len(where):use.ring.index(',')]}, {way}, {steps} steps", use.ring
        per_channel = ms // (use.channels // 2) if way == "both ways" else ms // use.channels
        row_bytes = 2 * (use.k if use.kernel == "allgather_matmul" else use.n)  # BF16 shard rows or sum rows
        assert use.chunk_bytes == per_channel * row_bytes, (use.kernel, use.chunk_bytes)
        assert f"ring {use.ring}, up to {use.chunk_bytes / 2**20:.2f} MiB per step per channel" in "\n".join(plan.lines())


def test_a_shard_too_small_for_the_channels_is_a_plan_problem():
    """At 256 sequence rows TP64 leaves 4 rows a shard: fewer than 4 channels x 2 cores, the
    kernels' precondition; the plan says so instead of describing a ring that cannot run."""
    short = Workload(load_model("llama3-405b"), Training(seq=256, global_batch=1024))
    layout, target = layout_for("trn2", {"core": 4, "x": 4, "y": 4}, lnc=2)
    plan = kernel_plan(short, layout, target)
    assert plan.problems() == [f"{kernel}: cannot run: 4 rows per shard over 4 channel(s) x 2 core(s)"
                               for kernel in ("allgather_matmul", "matmul_reduce_scatter")]
