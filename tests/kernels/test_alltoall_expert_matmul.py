"""alltoall_expert_matmul, expert_alltoall and the MoE packing helpers in the multi-rank simulator."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.alltoall_expert_matmul import alltoall_expert_matmul, expert_alltoall, grouped_expert_matmul
from trnopt.kernels.references import alltoall_expert_matmul_reference, alltoall_reference, moe_reference
from trnopt.kernels.routing import pack_dispatch, unpack_combine
from trnopt.kernels.sim import TensorSpec, run_ranks

# Ragged: H and F are not multiples of 128 / 512, C not of anything.
S, EL, H, C, F = 2, 2, 150, 10, 200


def _run(kernel, args, groups, numerics=True):
    kwargs = {"groups": groups} if groups is not None else {}
    return run_ranks(kernel, args, kwargs=kwargs, numerics=numerics, timeout_s=120.0)


def _inputs(rng, make_tensor, ep, dtype, s=S, el=EL, h=H, c=C, f=F, integer=False):
    xs = [make_tensor(rng, (s, ep, el, h, c), dtype, integer=integer) for _ in range(ep)]
    ws = [make_tensor(rng, (el, h, f), dtype, integer=integer) for _ in range(ep)]
    return xs, ws


def _check(ep, dt, rng, make_tensor, assert_close, **shape):
    xs, ws = _inputs(rng, make_tensor, ep, dt, **shape)
    res = _run(alltoall_expert_matmul, [(xs[r], ws[r]) for r in range(ep)], (tuple(range(ep)),))
    ref = alltoall_expert_matmul_reference(xs, ws)
    for r in range(ep):
        assert res.outputs[r].dtype == dt
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("ep", [2, 4, 8, 16, pytest.param(32, marks=pytest.mark.slow),
                                pytest.param(64, marks=pytest.mark.slow)])
def test_matches_reference(ep, dtype, rng, make_tensor, assert_close, dtypes):
    """The ragged default shape up to EP16; EP32 and EP64 (slow) on a smaller one."""
    shape = {} if ep <= 16 else dict(s=1, el=1, h=130, c=3, f=64)
    _check(ep, dtypes[dtype], rng, make_tensor, assert_close, **shape)


@pytest.mark.parametrize("s,el,h,c,f", [(1, 1, 128, 128, 512), (3, 1, 129, 130, 513), (4, 3, 5, 1, 7)])
def test_tile_edges(s, el, h, c, f, rng, make_tensor, assert_close, dtypes):
    _check(4, dtypes["fp32"], rng, make_tensor, assert_close, s=s, el=el, h=h, c=c, f=f)


def test_exact_on_integer_data(rng, make_tensor, assert_exact, dtypes):
    dt, ep = dtypes["fp32"], 4
    xs, ws = _inputs(rng, make_tensor, ep, dt, integer=True)
    res = _run(alltoall_expert_matmul, [(xs[r], ws[r]) for r in range(ep)], (tuple(range(ep)),))
    ref = alltoall_expert_matmul_reference(xs, ws)
    for r in range(ep):
        assert_exact(res.outputs[r], ref[r], f"rank {r}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_collectives_alone_are_exact_all_to_alls(dtype, rng, make_tensor, assert_exact, dtypes):
    dt, ep = dtypes[dtype], 8
    xs = [make_tensor(rng, (S, ep, EL, H, C), dt) for _ in range(ep)]
    ys = [make_tensor(rng, (S, ep, EL, C, F), dt) for _ in range(ep)]
    res = _run(expert_alltoall, [(xs[r], ys[r]) for r in range(ep)], (tuple(range(ep)),))
    rx, ry = alltoall_reference(xs), alltoall_reference(ys)
    for r in range(ep):
        assert_exact(res.outputs[r][0], rx[r], f"rank {r} dispatch")
        assert_exact(res.outputs[r][1], ry[r], f"rank {r} combine")


def test_grouped_matmul_alone(rng, make_tensor, assert_close, dtypes):
    dt = dtypes["bf16"]
    x = make_tensor(rng, (S, 4, EL, H, C), dt)
    w = make_tensor(rng, (EL, H, F), dt)
    res = _run(grouped_expert_matmul, [(x, w)], None)
    ref = np.einsum("sjehc,ehf->sjecf", x.astype(np.float64), w.astype(np.float64))
    assert_close(res.outputs[0], ref, dt)


@pytest.mark.parametrize("channels", [1, 2])
def test_moe_layer_body_end_to_end(channels, rng, make_tensor, assert_close, dtypes):
    """Route tokens top-2 over 8 experts on 4 ranks, run the kernel (either exchange), unpack:
    equals the dense MoE formula for every kept choice (some are dropped by the capacity, on
    purpose)."""
    dt, ep, el, t_n, topk, h, f = dtypes["fp32"], 4, 2, 40, 2, 96, 80
    experts = make_tensor(rng, (ep * el, h, f), dt)
    tokens = [make_tensor(rng, (t_n, h), dt) for _ in range(ep)]
    ids = [np.stack([rng.choice(ep * el, size=topk, replace=False) for _ in range(t_n)]) for _ in range(ep)]
    gates = [rng.random((t_n, topk)) for _ in range(ep)]
    packed = [pack_dispatch(tokens[r], ids[r], ep=ep, e_local=el, capacity=8, n_sub=2) for r in range(ep)]
    assert any(s is None for p in packed for row in p[1].slot for s in row), "capacity should drop some"
    ws = [experts[r * el:(r + 1) * el] for r in range(ep)]
    res = run_ranks(alltoall_expert_matmul, [(packed[r][0], ws[r]) for r in range(ep)],
                    kwargs={"groups": (tuple(range(ep)),), "channels": channels}, numerics=True, timeout_s=120.0)
    for r in range(ep):
        got = unpack_combine(res.outputs[r], packed[r][1], gates[r])
        want = moe_reference(tokens[r], ids[r], gates[r], experts, plan=packed[r][1])
        assert_close(got, want, dt, f"rank {r}")


def test_sub_groups(rng, make_tensor, assert_close, dtypes):
    dt = dtypes["bf16"]
    groups = ((1, 3, 0, 2), (7, 5, 6, 4))
    xs, ws = _inputs(rng, make_tensor, 4, dt)
    xs, ws = xs * 2, ws * 2
    res = _run(alltoall_expert_matmul, [(xs[r], ws[r]) for r in range(8)], groups)
    for g in groups:
        ref = alltoall_expert_matmul_reference([xs[q] for q in g], [ws[q] for q in g])
        for i, r in enumerate(g):
            assert_close(res.outputs[r], ref[i], dt, f"rank {r}")


@pytest.mark.parametrize("bad,msg", [
    ({"w": (EL, H + 1, F)}, "but w is"),
    ({"x": (S, 2, EL, H)}, "must be \\[S, ep, E_local, H, C\\]"),
    ({"x": (S, 3, EL, H, C)}, "must hold ep=3 ranks"),
])
def test_preconditions(bad, msg, dtypes):
    dt = dtypes["fp32"]
    x = np.zeros(bad.get("x", (S, 2, EL, H, C)), dtype=dt)
    w = np.zeros(bad.get("w", (EL, H, F)), dtype=dt)
    with pytest.raises(AssertionError, match=msg):
        _run(alltoall_expert_matmul, [(x, w), (x, w)], ((0, 1),))


def test_production_tiles_fit(dtypes):
    """405B hidden (16384), expert width 1024, 32 slots per expert per sub-chunk on 2 ranks,
    schedule only: capacity and layout checks pass."""
    dt = dtypes["bf16"]
    args = [(TensorSpec((2, 2, 1, 16384, 32), dt), TensorSpec((1, 16384, 1024), dt))] * 2
    res = _run(alltoall_expert_matmul, args, ((0, 1),), numerics=False)
    assert res.timeline.total_s > 0


# --- the ring variant (channels=2): the exchanges on the ring's two directions ----------------
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("ep", [2, 3, 4, 5, 8])
def test_ring_variant_matches_reference(ep, dtype, rng, make_tensor, assert_close, dtypes):
    """Odd rings (no opposite rank) and even ones (the opposite block half each way); the
    default ragged H and F, C = 10 slots (halves of 5)."""
    dt = dtypes[dtype]
    xs, ws = _inputs(rng, make_tensor, ep, dt)
    res = run_ranks(alltoall_expert_matmul, [(xs[r], ws[r]) for r in range(ep)],
                    kwargs={"groups": (tuple(range(ep)),), "channels": 2}, numerics=True, timeout_s=120.0)
    ref = alltoall_expert_matmul_reference(xs, ws)
    for r in range(ep):
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")


def test_ring_variant_on_a_permuted_ring(rng, make_tensor, assert_close, dtypes):
    """List order is ring order: rank ids out of order, two disjoint rings."""
    dt = dtypes["fp32"]
    groups = ((3, 0, 5, 1), (2, 7, 4, 6))
    xs, ws = _inputs(rng, make_tensor, 4, dt, s=1)
    xs, ws = xs + xs, ws + ws  # rank r uses inputs r % 4 in both rings
    args = [None] * 8
    for g in groups:
        for i, r in enumerate(g):
            args[r] = (xs[i], ws[i])
    res = run_ranks(alltoall_expert_matmul, args, kwargs={"groups": groups, "channels": 2}, numerics=True,
                    timeout_s=120.0)
    ref = alltoall_expert_matmul_reference(xs[:4], ws[:4])
    for g in groups:
        for i, r in enumerate(g):
            assert_close(res.outputs[r], ref[i], dt, f"rank {r}")


@pytest.mark.parametrize("ep", [3, 8])
def test_ring_collectives_alone_are_exact_all_to_alls(ep, rng, make_tensor, assert_exact, dtypes):
    dt = dtypes["bf16"]
    xs = [make_tensor(rng, (S, ep, EL, H, C), dt) for _ in range(ep)]
    ys = [make_tensor(rng, (S, ep, EL, C, F), dt) for _ in range(ep)]
    res = run_ranks(expert_alltoall, [(xs[r], ys[r]) for r in range(ep)],
                    kwargs={"groups": (tuple(range(ep)),), "channels": 2}, numerics=True, timeout_s=120.0)
    rx, ry = alltoall_reference(xs), alltoall_reference(ys)
    for r in range(ep):
        assert_exact(res.outputs[r][0], rx[r], f"rank {r} dispatch")
        assert_exact(res.outputs[r][1], ry[r], f"rank {r} combine")


def test_ring_variant_needs_even_slots(dtypes):
    dt = dtypes["fp32"]
    x, w = np.zeros((S, 2, EL, H, 5), dtype=dt), np.zeros((EL, H, F), dtype=dt)
    with pytest.raises(AssertionError, match="expected an even number of slots per core, got 5"):
        run_ranks(alltoall_expert_matmul, [(x, w), (x, w)], kwargs={"groups": ((0, 1),), "channels": 2},
                  numerics=True, timeout_s=60.0)


def test_channels_other_than_one_or_two_are_refused(dtypes):
    dt = dtypes["fp32"]
    x, w = np.zeros((S, 2, EL, H, C), dtype=dt), np.zeros((EL, H, F), dtype=dt)
    with pytest.raises(AssertionError, match="channels must be 1 .* or 2 .*got 4"):
        run_ranks(alltoall_expert_matmul, [(x, w), (x, w)], kwargs={"groups": ((0, 1),), "channels": 4},
                  numerics=True, timeout_s=60.0)
