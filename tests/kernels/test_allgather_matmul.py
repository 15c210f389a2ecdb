"""allgather_matmul and allgather_ring in the multi-rank simulator, against the NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.allgather_matmul import _held, _slab_sends, allgather_matmul, allgather_ring
from trnopt.kernels.references import allgather_matmul_reference, allgather_reference
from trnopt.kernels.ring import channel_halves, gather_steps, ring_outlasts_matmul, ring_slabs
from trnopt.kernels.sim import TensorSpec, run_ranks

# Ragged everywhere: M_shard, K and N are not multiples of their tiles (128, 128, 512).
K, MS, N = 200, 100, 300


def _run(kernel, args, groups, numerics=True, **kw):
    return run_ranks(kernel, args, kwargs={"groups": groups, **kw}, numerics=numerics, timeout_s=120.0)


def _inputs(rng, make_tensor, tp, dtype, k=K, ms=MS, n=N, integer=False):
    xs = [make_tensor(rng, (k, ms), dtype, integer=integer) for _ in range(tp)]
    ws = [make_tensor(rng, (k, n), dtype, integer=integer) for _ in range(tp)]
    return xs, ws


def _check(tp, dt, channels, rng, make_tensor, assert_close, ms=MS, k=K, n=N):
    xs, ws = _inputs(rng, make_tensor, tp, dt, k=k, ms=ms, n=n)
    res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=channels)
    for r in range(tp):
        assert res.outputs[r].dtype == dt
        assert res.outputs[r].shape == (tp * ms, n)
        assert_close(res.outputs[r], allgather_matmul_reference(xs, ws[r]), dt, f"rank {r}")


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tp", [2, 4, 8, 16, pytest.param(32, marks=pytest.mark.slow),
                                pytest.param(64, marks=pytest.mark.slow)])
def test_matches_reference(tp, dtype, channels, rng, make_tensor, assert_close, dtypes):
    """The ragged default shape up to TP16; TP32 and TP64 (slow) on a smaller one."""
    shape = {} if tp <= 16 else dict(ms=36, k=130, n=96)
    _check(tp, dtypes[dtype], channels, rng, make_tensor, assert_close, **shape)


@pytest.mark.parametrize("ms,k,n", [(128, 256, 512), (129, 129, 513), (3, 5, 7), (300, 128, 1100)])
def test_tile_edges(ms, k, n, rng, make_tensor, assert_close, dtypes):
    """Exact multiples of the tiles, one past them, tiny, and several row/column tiles."""
    _check(4, dtypes["fp32"], 2, rng, make_tensor, assert_close, ms=ms, k=k, n=n)


@pytest.mark.parametrize("channels", [1, 2])
def test_exact_on_integer_data(channels, rng, make_tensor, assert_exact, dtypes):
    """Small integers: every FP32 partial sum is exact, so any misplaced chunk shows up bitwise."""
    dt = dtypes["fp32"]
    tp = 4
    xs, ws = _inputs(rng, make_tensor, tp, dt, integer=True)
    res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=channels)
    for r in range(tp):
        assert_exact(res.outputs[r], allgather_matmul_reference(xs, ws[r]), f"rank {r}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_exact_with_selection_weights(dtype, rng, make_tensor, assert_exact, dtypes):
    """W a 0/1 column selection: Y is the gathered X itself, no reduction, exact in BF16 too."""
    dt = dtypes[dtype]
    tp, n = 4, 150
    xs = [make_tensor(rng, (K, MS), dt) for _ in range(tp)]
    ws = []
    for r in range(tp):
        w = np.zeros((K, n), dtype=np.float32)
        w[rng.permutation(K)[:n], np.arange(n)] = 1.0
        ws.append(w.astype(dt))
    res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=2)
    for r in range(tp):
        assert_exact(res.outputs[r], allgather_matmul_reference(xs, ws[r]), f"rank {r}")


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_ring_alone_is_an_exact_all_gather(dtype, channels, rng, make_tensor, assert_exact, dtypes):
    dt, tp = dtypes[dtype], 8
    xs = [make_tensor(rng, (K, MS), dt) for _ in range(tp)]
    res = _run(allgather_ring, [(x,) for x in xs], (tuple(range(tp)),), channels=channels)
    for r in range(tp):
        assert_exact(res.outputs[r], allgather_reference(xs), f"rank {r}")


def test_ring_order_and_sub_groups(rng, make_tensor, assert_close, dtypes):
    """Two TP groups of 4 in one run, ring orders that are not sorted: shards follow list order."""
    dt = dtypes["fp32"]
    groups = ((3, 1, 0, 2), (6, 4, 7, 5))
    xs, ws = _inputs(rng, make_tensor, 8, dt)
    res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(8)], groups, channels=2)
    for g in groups:
        for r in g:
            assert_close(res.outputs[r], allgather_matmul_reference([xs[q] for q in g], ws[r]), dt, f"rank {r}")


def test_single_rank_is_a_plain_matmul(rng, make_tensor, assert_close, dtypes):
    dt = dtypes["bf16"]
    xs, ws = _inputs(rng, make_tensor, 1, dt)
    res = _run(allgather_matmul, [(xs[0], ws[0])], ((0,),))
    assert_close(res.outputs[0], allgather_matmul_reference(xs, ws[0]), dt)


@pytest.mark.parametrize("bad,msg", [
    ({"w": (K + 1, N)}, "contraction mismatch"),
    ({"channels": 3}, "channels must be 1, 2 or 4"),
    ({"pieces": 0}, "pieces must be >= 1"),
    ({"x": (K, 1), "channels": 2}, "cannot be split over 2 channels"),
])
def test_preconditions(bad, msg, dtypes):
    dt = dtypes["fp32"]
    x = np.zeros(bad.get("x", (K, MS)), dtype=dt)
    w = np.zeros(bad.get("w", (K, N)), dtype=dt)
    kw = {k: v for k, v in bad.items() if k in ("channels", "pieces")}
    with pytest.raises(AssertionError, match=msg):
        _run(allgather_matmul, [(x, w), (x, w)], ((0, 1),), **kw)


def test_production_tiles_fit_sbuf_and_psum(dtypes):
    """Llama-3-405B TP16 per-rank shapes (K 16384, M_shard 512, N_shard 1024) on 2 ranks,
    schedule only: every capacity and layout check of the simulator passes."""
    dt = dtypes["bf16"]
    args = [(TensorSpec((16384, 512), dt), TensorSpec((16384, 1024), dt))] * 2
    res = _run(allgather_matmul, args, ((0, 1),), numerics=False, channels=2)
    assert res.timeline.busy_s["Tensor"] > 0.9 * res.timeline.total_s


@pytest.mark.parametrize("tp,ms,k,n", [(4, 64, 256, 128), (8, 36, 130, 96)])
def test_four_channels_match_reference(tp, ms, k, n, rng, make_tensor, assert_close, dtypes):
    """Four channels (both directions of two rings, as a group of a whole node may use): the
    on-chip ring (K in whole tiles) and the HBM ring (ragged K)."""
    _check(tp, dtypes["bf16"], 4, rng, make_tensor, assert_close, ms=ms, k=k, n=n)


def test_four_channels_store_once_per_direction(dtypes):
    """With the rows of a ring direction's channels adjacent (`ring.gather_steps`), the
    on-chip ring stores each step's rows with one DMA per direction, not one per channel:
    both ways, one for the own shard, two for each of the tp/2 - 1 steps of whole shards
    and one for the opposite shard (its halves adjacent), tp in all."""
    tp, ms, k, n = 8, 64, 256, 128
    dt = dtypes["bf16"]
    args = [(TensorSpec((k, ms), dt), TensorSpec((k, n), dt))] * tp
    counts = {}
    for ch in (2, 4):
        res = run_ranks(allgather_matmul, args, kwargs={"groups": (tuple(range(tp)),), "channels": ch},
                        numerics=False)
        counts[ch] = sum(1 for i in res.timeline.cores[0].instructions if i.name == "ag_st")
    assert counts[4] == counts[2] == tp, counts


def test_channel_halves_put_a_direction_together():
    """Channels 0 and 2 (forward) take the first half of the rows, 1 and 3 (backward) the second."""
    assert channel_halves(128, 4, "t") == [(0, 32), (64, 32), (32, 32), (96, 32)]
    assert channel_halves(5, 2, "t") == [(0, 3), (3, 2)]


def test_hbm_ring_sends_from_the_input_at_either_lnc(rng, make_tensor, assert_close, dtypes):
    """The HBM ring (K not in whole tiles) sends step 0 from x_t itself at LNC 1 as at LNC 2:
    collective_permute_implicit has no private-HBM rule for its srcs, so there is no copy
    of the own rows (the simulator would refuse a shared-HBM src to all_gather at LNC 1),
    and the result is exact."""
    tp, dt = 4, dtypes["bf16"]
    xs, ws = _inputs(rng, make_tensor, tp, dt, ms=2 * MS)
    for lnc in (1, 2):
        res = run_ranks(allgather_matmul, [(xs[r], ws[r]) for r in range(tp)],
                        kwargs={"groups": (tuple(range(tp)),), "channels": 2}, lnc=lnc, timeout_s=120.0)
        copies = [i.name for c in res.timeline.cores for i in c.instructions
                  if i.engine == "DMA" and not i.name.startswith(("ag_ld", "ag_st"))]
        assert not copies, (lnc, copies)
        for r in range(tp):
            assert_close(res.outputs[r], allgather_matmul_reference(xs, ws[r]), dt, f"lnc {lnc} rank {r}")


def test_slab_sends_go_ahead_of_their_first_read_and_after_what_they_forward():
    """Calls [0], [1, 2], [3]: four slabs of two K blocks each, 8 iterations a call, two
    iterations ahead per remaining step. Every send of every step >= 1 is placed once, the
    send delivering step s's slab before the iteration that reads it (in its call, or in
    the tail of the call before), and a two-step call's second step after its first."""
    calls = [range(0, 1), range(1, 3), range(3, 4)]
    k_blocks = [(2 * b, [(256 * b + 128 * j, 128) for j in range(2)]) for b in range(8)]
    slabs = [(512 * j, 512) for j in range(4)]
    at = _slab_sends(calls, slabs, [8, 8, 8], k_blocks, 2, lambda s, k0, kl: (s, k0))
    placed = {item: (i, it) for i, pairs in enumerate(at) for it, item in pairs}
    assert sorted(placed) == [(s, k0) for s in (1, 2, 3) for k0, _ in slabs]
    call_of = {s: i for i, c in enumerate(calls) for s in c}
    for (s, k0), (i, it) in placed.items():
        read = 2 * (k0 // 512)  # the K block holding k0
        assert (i, it) < (call_of[s], read), (s, k0, i, it)
    assert placed[(1, 0)] == (0, 4) and placed[(2, 0)] == (0, 6) and placed[(3, 0)] == (1, 6)
    for k0, _ in slabs:
        assert placed[(1, k0)] < placed[(2, k0)]


@pytest.mark.parametrize("channels", [1, 2, 4])
@pytest.mark.parametrize("both_ways", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 5, 8, 9])
def test_gather_steps_deliver_every_shard_row_once(tp, both_ways, channels):
    """Every row of every other rank's shard arrives exactly once, each chunk is part of
    what its channel received the step before, and both ways take tp // 2 hops, not tp - 1."""
    base, rows = 3, 10
    steps = gather_steps(base, rows, tp, channels, both_ways)
    seen = {}
    for s, step in enumerate(steps):
        slots = sorted((ch.slot, ch.rows) for ch in step)
        assert all(a + n == b for (a, n), (b, _) in zip(slots, slots[1:])) and slots[0][0] == 0, (s, step)
        for ch in step:
            owner = (-s if ch.side == 0 else s) % tp
            for r in range(ch.offset, ch.offset + ch.rows):
                seen[(owner, r)] = seen.get((owner, r), 0) + 1
            if s:
                _held(steps, s - 1, ch)  # asserts the channel holds these rows
    assert seen == {(o, r): 1 for o in range(tp) for r in range(base, base + rows)}
    hops = tp // 2 if both_ways and channels > 1 and tp > 1 else tp - 1
    assert len(steps) - 1 == hops


@pytest.mark.parametrize("channels", [2, 4])
@pytest.mark.parametrize("tp,ms,k,n", [(2, 64, 256, 128), (3, 64, 256, 96), (5, 36, 130, 96), (8, 64, 256, 128)])
def test_both_ways_matches_reference(tp, ms, k, n, channels, rng, make_tensor, assert_close, assert_exact,
                                     dtypes):
    """Whole shards both ways, on chip (K in whole tiles) and through HBM (ragged K), odd
    and even rings, against the reference; the ring alone gathers exactly."""
    dt = dtypes["bf16"]
    xs, ws = _inputs(rng, make_tensor, tp, dt, k=k, ms=ms, n=n)
    groups = (tuple(range(tp)),)
    res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(tp)], groups, channels=channels, both_ways=True)
    alone = _run(allgather_ring, [(x,) for x in xs], groups, channels=channels, both_ways=True)
    for r in range(tp):
        assert_close(res.outputs[r], allgather_matmul_reference(xs, ws[r]), dt, f"rank {r}")
        assert_exact(alone.outputs[r], allgather_reference(xs), f"rank {r}")


def test_on_chip_ring_goes_both_ways_with_half_the_hops(dtypes):
    """Where the ring fits on chip the plan runs whole shards both ways: tp // 2 ring steps
    (the first and the last two in two K halves) instead of tp - 1, for the fused kernel and the
    ring alone that measures it."""
    tp, ms, k, n = 8, 64, 256, 128
    dt = dtypes["bf16"]
    args = [(TensorSpec((k, ms), dt), TensorSpec((k, n), dt))] * tp
    kw = {"groups": (tuple(range(tp)),), "channels": 2}
    fused = run_ranks(allgather_matmul, args, kwargs=kw, numerics=False)
    alone = run_ranks(allgather_ring, [(a[0],) for a in args], kwargs={**kw, "n": n}, numerics=False)
    halves = run_ranks(allgather_ring, [(a[0],) for a in args], kwargs=kw, numerics=False)

    def permutes(res):
        return [i.name for i in res.timeline.cores[0].instructions if i.engine == "CC0"]
    assert len(set(permutes(fused))) == tp // 2 and len(permutes(fused)) == tp // 2 + 3
    assert len(permutes(alone)) == tp // 2
    assert len(permutes(halves)) == tp - 1


def test_matmul_bound_ring_loads_its_shard_within_the_first_call(rng, make_tensor, assert_close, dtypes):
    """Where a step's matmul outlasts its transfer, the own shard's K blocks load between
    the first call's weight loads (the first weight load is issued before the shard's last
    block) and each first send after the loads it reads: the result matches the reference.
    Where the ring outlasts the matmul, the whole shard loads first."""
    dt = dtypes["bf16"]
    groups = (tuple(range(4)),)

    def order(ms, k, n):
        xs, ws = _inputs(rng, make_tensor, 4, dt, k=k, ms=ms, n=n)
        res = _run(allgather_matmul, [(xs[r], ws[r]) for r in range(4)], groups, channels=2)
        for r in range(4):
            assert_close(res.outputs[r], allgather_matmul_reference(xs, ws[r]), dt, f"rank {r}")
        names = [i.name for i in res.timeline.cores[0].instructions]
        return names.index("ag_ld_w"), max(i for i, nm in enumerate(names) if nm == "ag_ld_shard")

    # k 2048: two K blocks; 64 rows a side per step, 256 KiB a channel: ~2.5 us on the link
    assert not ring_outlasts_matmul(64 * 2048 * 2, 128, 2048, 512)  # 16 x 512 cycles: 3.4 us
    first_w, last_shard = order(64, 2048, 512)
    assert first_w < last_shard
    assert ring_outlasts_matmul(64 * 2048 * 2, 128, 2048, 64)
    first_w, last_shard = order(64, 2048, 64)
    assert first_w > last_shard


def test_ring_slabs_keep_their_hop_latencies_within_half_the_matmuls_slack():
    """Llama 3 70B at TP16, LNC 1 (512 rows a shard, K 8192, 512 columns): a step's matmul
    is 4 x 64 x 512 cycles = 54.6 us. On one channel the 8 MiB chunk takes 32.8 us of the
    256 GB/s link, leaving 21.8 us: 7 slabs (10.5 us of hop latency), not the 16 of
    512 KiB that took the step past its matmul. On two channels each takes 4 MiB (16.4 us,
    38.2 us left): 8 slabs of 512 KiB, the size rule. A ring that outlasts the matmul goes
    in one slab."""
    assert ring_slabs(512 * 8192 * 2, 512, 8192, 512) == 7
    assert ring_slabs(256 * 8192 * 2, 512, 8192, 512) == 8
    assert ring_slabs(128 * 8192 * 2, 256, 8192, 256, programs=2) == 1  # 70B TP32 LNC 2: 16.4 us of a shared link > 13.7 us
