"""matmul_reduce_scatter and reduce_scatter_ring in the multi-rank simulator, against the NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.matmul_reduce_scatter import matmul_reduce_scatter, reduce_scatter_ring
from trnopt.kernels.references import matmul_reduce_scatter_reference, reduce_scatter_reference
from trnopt.kernels.sim import TensorSpec, run_ranks

# Ragged: K_shard, M_shard and N are not multiples of their tiles (128, 128, 512).
K, MS, N = 150, 100, 600


def _run(kernel, args, groups, numerics=True, **kw):
    return run_ranks(kernel, args, kwargs={"groups": groups, **kw}, numerics=numerics, timeout_s=120.0)


def _inputs(rng, make_tensor, tp, dtype, k=K, ms=MS, n=N, integer=False):
    xs = [make_tensor(rng, (k, tp * ms), dtype, integer=integer) for _ in range(tp)]
    ws = [make_tensor(rng, (k, n), dtype, integer=integer) for _ in range(tp)]
    return xs, ws


def _check(tp, dt, channels, rng, make_tensor, assert_close, ms=MS, k=K, n=N, pieces=4):
    xs, ws = _inputs(rng, make_tensor, tp, dt, k=k, ms=ms, n=n)
    res = _run(matmul_reduce_scatter, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),),
               channels=channels, pieces=pieces)
    ref = matmul_reduce_scatter_reference(xs, ws)
    for r in range(tp):
        assert res.outputs[r].dtype == dt
        assert res.outputs[r].shape == (ms, n)
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tp", [2, 4, 8, 16, pytest.param(32, marks=pytest.mark.slow),
                                pytest.param(64, marks=pytest.mark.slow)])
def test_matches_reference(tp, dtype, channels, rng, make_tensor, assert_close, dtypes):
    """The ragged default shape up to TP16; TP32 and TP64 (slow) on a smaller one."""
    shape = {} if tp <= 16 else dict(ms=20, k=130, n=520)
    _check(tp, dtypes[dtype], channels, rng, make_tensor, assert_close, **shape)


@pytest.mark.parametrize("ms,k,n,pieces", [(128, 128, 512, 1), (129, 257, 1025, 3), (3, 5, 7, 4),
                                           (260, 64, 2100, 8)])
def test_tile_edges_and_pieces(ms, k, n, pieces, rng, make_tensor, assert_close, dtypes):
    _check(4, dtypes["fp32"], 2, rng, make_tensor, assert_close, ms=ms, k=k, n=n, pieces=pieces)


@pytest.mark.parametrize("channels", [1, 2])
def test_exact_on_integer_data(channels, rng, make_tensor, assert_exact, dtypes):
    """Small integers: all FP32 sums (matmul and ring) are exact, so the result is bitwise."""
    dt, tp = dtypes["fp32"], 4
    xs, ws = _inputs(rng, make_tensor, tp, dt, integer=True)
    res = _run(matmul_reduce_scatter, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=channels)
    ref = matmul_reduce_scatter_reference(xs, ws)
    for r in range(tp):
        assert_exact(res.outputs[r], ref[r], f"rank {r}")


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_ring_alone_matches_reduce_scatter(dtype, channels, rng, make_tensor, assert_close, dtypes):
    dt, tp = dtypes[dtype], 8
    ps = [make_tensor(rng, (tp * MS, N), dt) for _ in range(tp)]
    res = _run(reduce_scatter_ring, [(p,) for p in ps], (tuple(range(tp)),), channels=channels)
    ref = reduce_scatter_reference(ps)
    for r in range(tp):
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")


def test_ring_order_and_sub_groups(rng, make_tensor, assert_close, dtypes):
    """Two groups of 4 with unsorted ring orders: list position i gets rows i*M_shard.."""
    dt = dtypes["fp32"]
    groups = ((2, 0, 3, 1), (5, 7, 4, 6))
    xs, ws = _inputs(rng, make_tensor, 8, dt)
    res = _run(matmul_reduce_scatter, [(xs[r], ws[r]) for r in range(8)], groups, channels=2)
    for g in groups:
        ref = matmul_reduce_scatter_reference([xs[q] for q in g], [ws[q] for q in g])
        for i, r in enumerate(g):
            assert_close(res.outputs[r], ref[i], dt, f"rank {r}")


def test_single_rank_is_a_plain_matmul(rng, make_tensor, assert_close, dtypes):
    dt = dtypes["bf16"]
    xs, ws = _inputs(rng, make_tensor, 1, dt)
    res = _run(matmul_reduce_scatter, [(xs[0], ws[0])], ((0,),))
    assert_close(res.outputs[0], matmul_reduce_scatter_reference(xs, ws)[0], dt)


@pytest.mark.parametrize("bad,msg", [
    ({"w": (K + 1, N)}, "contraction mismatch"),
    ({"x": (K, 2 * MS + 1)}, "must split evenly"),
    ({"channels": 0}, "channels must be 1, 2 or 4"),
    ({"pieces": 0}, "pieces must be >= 1"),
])
def test_preconditions(bad, msg, dtypes):
    dt = dtypes["fp32"]
    x = np.zeros(bad.get("x", (K, 2 * MS)), dtype=dt)
    w = np.zeros(bad.get("w", (K, N)), dtype=dt)
    kw = {k: v for k, v in bad.items() if k in ("channels", "pieces")}
    with pytest.raises(AssertionError, match=msg):
        _run(matmul_reduce_scatter, [(x, w), (x, w)], ((0, 1),), **kw)


def test_production_tiles_fit_sbuf_and_psum(dtypes):
    """Llama-3-405B TP16 per-rank shapes (K_shard 1024, M 8192 -> M_shard 512 over 16, N 16384)
    cut to 2 ranks (M 1024), schedule only: every capacity and layout check passes."""
    dt = dtypes["bf16"]
    args = [(TensorSpec((1024, 1024), dt), TensorSpec((1024, 16384), dt))] * 2
    res = _run(matmul_reduce_scatter, args, ((0, 1),), numerics=False, channels=2)
    assert res.timeline.busy_s["Tensor"] > 0.8 * res.timeline.total_s


# --- a long BF16 ring: FP32 running sums on request, BF16 (one rounding per hop) by default ----------
LONG_TP, LONG_MS, LONG_N = 128, 2, 8


def _long_ring_partials(tp=LONG_TP, ms=LONG_MS, n=LONG_N):
    """Per list position, the [tp * ms, n] partial of every rank: 1.0 everywhere except 256.0
    at the rank half a ring away from a chunk's owner, which both ring directions (channel 0
    forward, channel 1 backward) reach after half of the hops. With BF16 running sums,
    256 + 63 rounds to 320 and every later + 1 is a tie that rounds back to 320 (BF16 steps
    by 2 there); the exact sum is 256 + 127 = 383 (384 in BF16)."""
    out = []
    for r in range(tp):
        p = np.ones((tp * ms, n), dtype=np.float32)
        for q in range(tp):
            if r == (q + tp // 2) % tp:
                p[q * ms:(q + 1) * ms] = 256.0
        out.append(p)
    return out


def _long_ring_results(kernel, dt, sum_dtype):
    ps = _long_ring_partials()
    if kernel is reduce_scatter_ring:
        args = [(p.astype(dt),) for p in ps]
        ref = reduce_scatter_reference([a[0] for a in args])
    else:
        # K = 1: x_t row r is the partial's column 0, w is ones, so X_r @ W_r is the partial
        args = [(p[:, :1].T.copy().astype(dt), np.ones((1, LONG_N), dtype=dt)) for p in ps]
        ref = matmul_reduce_scatter_reference([a[0] for a in args], [a[1] for a in args])
    kw = {"sum_dtype": sum_dtype} if sum_dtype is not None else {}
    res = _run(kernel, args, (tuple(range(LONG_TP)),), channels=2, **kw)
    return res.outputs, ref


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [matmul_reduce_scatter, reduce_scatter_ring], ids=["fused", "ring_alone"])
def test_long_bf16_ring_with_fp32_sums(kernel, assert_close, dtypes):
    """TP128 ring at a tiny shape: BF16 inputs with ``sum_dtype=float32``, the running sums
    travel in FP32 and are rounded once, at the end, so data sensitive to per-hop rounding
    comes out within the BF16 tolerance."""
    dt = dtypes["bf16"]
    outs, ref = _long_ring_results(kernel, dt, np.dtype(np.float32))
    for r in range(LONG_TP):
        assert outs[r].dtype == dt
        assert_close(outs[r], ref[r], dt, f"rank {r}")


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [matmul_reduce_scatter, reduce_scatter_ring], ids=["fused", "ring_alone"])
def test_long_ring_default_rounds_every_hop(kernel, dtypes):
    """By default the running sums travel in the inputs' dtype, as a library reduce-scatter's
    do: rounded to BF16 at every hop, which the data above exposes (320 instead of 384)."""
    dt = dtypes["bf16"]
    outs, ref = _long_ring_results(kernel, dt, None)
    got = np.asarray(outs[0], dtype=np.float64)
    assert np.all(got == 320.0), got
    assert np.all(np.asarray(ref[0], dtype=np.float64) == 384.0)


# --- the on-chip ring (large TP degrees: small chunks, resident weight) ----------------------------
@pytest.mark.parametrize("tp,ms,k,n,channels", [(4, 64, 128, 4096, 2), (3, 100, 256, 5000, 1), (4, 256, 128, 4096, 2),
                                                (8, 16, 128, 8192, 2)])
def test_on_chip_ring_matches_reference(tp, ms, k, n, channels, rng, make_tensor, assert_close, dtypes):
    """Shapes the on-chip ring takes (one or two 128-row tiles per chunk, ragged N and one
    channel among them): it matches the reference, and the plan says it was taken."""
    from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
    assert sbuf_ring_plan(ms, k, n, tp, channels, 2, 4, 224 * 1024) is not None
    _check(tp, dtypes["bf16"], channels, rng, make_tensor, assert_close, ms=ms, k=k, n=n)


def test_on_chip_ring_keeps_the_partials_out_of_hbm(dtypes, monkeypatch):
    """At 405B's TP64 shape (cut to 4 ranks) the on-chip ring's DMA moves the sums it sends
    and the operands, nothing more: no partial is stored and read back (x is read once per
    column block)."""
    from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
    from trnopt.kernels.sim import rates
    # bytes only: the DMA's per-chunk cost (tests/kernels/sim/test_clock.py) left out
    monkeypatch.setattr(rates, "DMA_CHUNK_S", 0.0)
    dt = dtypes["bf16"]
    tp, ms, k, n = 4, 128, 256, 16384
    blocks = sbuf_ring_plan(ms, k, n, tp, 2, 2, 2, 224 * 1024).blocks
    args = [(TensorSpec((k, tp * ms), dt), TensorSpec((k, n), dt))] * tp
    res = _run(matmul_reduce_scatter, args, (tuple(range(tp)),), numerics=False, channels=2)
    core = res.timeline.cores[0]
    names = {i.name for i in core.instructions if i.engine == "DMA"}
    assert names == {"rs_ld_x", "rs_ld_w", "rs_st"}, names
    sent = (tp - 1) * ms * n * 2  # BF16 sums (the data's dtype), every step but the last
    operands = blocks * tp * ms * k * 2 + k * n * 2 + ms * n * 2  # the store reads the BF16 sums
    assert core.busy["DMA"] == pytest.approx((sent + operands) / 368e9, rel=0.01)


@pytest.mark.parametrize("tp,ms,k,n,channels", [(2, 256, 256, 4096, 2), (2, 512, 128, 2048, 2),
                                                (4, 256, 256, 4096, 1), (3, 256, 256, 4096, 2)])
def test_on_chip_ring_in_column_blocks(tp, ms, k, n, channels, rng, make_tensor, assert_close, dtypes):
    """A tight SBUF budget: the ring runs in column blocks, one after the other (halves of
    one and of two whole tiles); a block's last additions wait until the next block's
    first step, while that block's sums already cross."""
    from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
    sbuf, dt = 64 * 1024, dtypes["bf16"]
    plan = sbuf_ring_plan(ms, k, n, tp, channels, 2, 4, sbuf)
    assert plan is not None and plan.blocks >= 2, plan
    xs, ws = _inputs(rng, make_tensor, tp, dt, k=k, ms=ms, n=n)
    res = _run(matmul_reduce_scatter, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=channels,
               sbuf_bytes=sbuf)
    ref = matmul_reduce_scatter_reference(xs, ws)
    for r in range(tp):
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")


@pytest.mark.parametrize("tp,ms,k,n", [(4, 64, 128, 1024), (8, 20, 130, 520)])
def test_four_channels_match_reference(tp, ms, k, n, rng, make_tensor, assert_close, dtypes):
    """Four channels (both directions of two rings, as a group of a whole node may use):
    the on-chip ring (whole 128-row K tiles) and the HBM ring (ragged K)."""
    _check(tp, dtypes["bf16"], 4, rng, make_tensor, assert_close, ms=ms, k=k, n=n)


@pytest.mark.parametrize("both_ways", [True, False], ids=["both_ways", "halves"])
def test_on_chip_ring_adds_in_the_collective(both_ways, dtypes):
    """One permute per step and channel (two for a block's last send), the reduction done by
    the collective: step 0 sends the partials alone, every later step but the last partial
    + received sum; only the last step adds on an engine (its own chunk, at evacuation,
    once per side the sums come from)."""
    from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
    from trnopt.kernels.ring import step_width
    from trnopt.kernels.tiling import tile_spans, unit_pieces
    dt = dtypes["bf16"]
    tp, ms, k, n = 5, 128, 256, 4096
    plan = sbuf_ring_plan(ms, k, n, tp, 2, 2, 2, 224 * 1024, both_ways)
    assert plan.sides == (2 if both_ways else 1)
    assert len(plan.steps) == (tp // 2 + 1 if both_ways else tp)
    args = [(TensorSpec((k, tp * ms), dt), TensorSpec((k, n), dt))] * tp
    ins = _run(matmul_reduce_scatter, args, (tuple(range(tp)),), numerics=False, channels=2,
               both_ways=both_ways).timeline.cores[0].instructions
    # the last send of a block goes in two column pieces where it is not step 0
    reduces = sum(len(plan.steps) - 2 + (len(plan.steps) > 2 and len(tile_spans(nb, plan.cols)) > 1)
                  for _, nb in unit_pieces(n, plan.cols, plan.blocks))
    for ch in ("CC0", "CC1"):
        ops = [i.op for i in ins if i.engine == ch]
        assert ops.count("collective_permute_implicit") == plan.blocks, ops
        assert ops.count("collective_permute_implicit_reduce") == reduces, ops
    banks = sum(len(tile_spans(gn, 512)) for _, nb in unit_pieces(n, plan.cols, plan.blocks)
                for _, gn in tile_spans(nb, plan.cols))  # PSUM banks a row tile evacuates per ring
    adds = [i for i in ins if i.name == "rs_evac_add"]
    copies = [i for i in ins if i.name == "rs_evac"]
    assert len(adds) == plan.sides * banks  # one 128-row tile of own rows
    assert len(copies) == banks * sum(-(-step_width(st) // 128) for st in plan.steps[:-1])


@pytest.mark.parametrize("tp,ms,k,n,channels", [(2, 64, 128, 600, 2), (3, 64, 128, 600, 2), (4, 64, 256, 600, 2),
                                                (5, 128, 128, 1100, 2), (6, 32, 128, 600, 4), (8, 16, 128, 520, 4)])
def test_both_ways_matches_reference(tp, ms, k, n, channels, rng, make_tensor, assert_close, dtypes):
    """Both ways on chip, each chunk's sum half from each side (the opposite chunk split in
    rows when tp is even, with zeros where a side sends none of a chunk's rows): the fused
    kernel and the ring alone match their references, the plan takes both ways by itself,
    and the ring alone, told the contraction size, runs the same schedule."""
    from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
    dt = dtypes["bf16"]
    plan = sbuf_ring_plan(ms, k, n, tp, channels, 2, 2, 224 * 1024)
    assert plan is not None and plan.sides == 2
    assert bool(plan.zero_spans(ms)) == (tp % 2 == 0)
    _check(tp, dt, channels, rng, make_tensor, assert_close, ms=ms, k=k, n=n)
    ps = [make_tensor(rng, (tp * ms, n), dt) for _ in range(tp)]
    res = _run(reduce_scatter_ring, [(p,) for p in ps], (tuple(range(tp)),), channels=channels, k=k)
    ref = reduce_scatter_reference(ps)
    for r in range(tp):
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")
    steps = {i.name for i in res.timeline.cores[0].instructions if i.engine == "CC0"}
    assert len(steps) == len(plan.steps) - 1, steps


@pytest.mark.parametrize("kernel", [matmul_reduce_scatter, reduce_scatter_ring], ids=["fused", "ring_alone"])
def test_both_ways_rounds_half_as_often(kernel, dtypes):
    """A 64-rank ring of BF16 partials all 5.0: one way the running sum passes 256, where
    BF16 steps by 2, and its odd sums round (the sum comes out off 320); both ways each
    side's sum stays within 32 x 5 = 160, exact, and the owner's FP32 additions give
    exactly 320."""
    dt = dtypes["bf16"]
    tp, ms, n = 64, 2, 8
    if kernel is reduce_scatter_ring:
        args = [(np.full((tp * ms, n), 5.0, dtype=dt),)] * tp
    else:  # K = 128 (the on-chip ring's whole tiles): only row 0 of X and W is non-zero
        x = np.zeros((128, tp * ms), dtype=dt)
        w = np.zeros((128, n), dtype=dt)
        x[0], w[0] = 1.0, 5.0
        args = [(x, w)] * tp
    out = {}
    for both_ways in (True, False):
        res = _run(kernel, args, (tuple(range(tp)),), channels=2, both_ways=both_ways)
        out[both_ways] = np.asarray(res.outputs[0], dtype=np.float64)
    assert np.all(out[True] == 320.0), out[True]
    assert np.any(out[False] != 320.0), out[False]


@pytest.mark.parametrize("channels", [1, 2])
def test_a_slab_goes_on_only_once_all_its_rows_are_stored(channels, rng, make_tensor, assert_close, dtypes):
    """2,048 rows a chunk and K in two blocks: two row groups of the HBM ring per column group,
    each slab sent in row pieces spread over the next group's K blocks. A piece sent before
    the second row group's stores would read rows of the send buffer nothing has written."""
    dt, tp = dtypes["fp32"], 2
    xs, ws = _inputs(rng, make_tensor, tp, dt, k=2048, ms=2048, n=1024)
    res = _run(matmul_reduce_scatter, [(xs[r], ws[r]) for r in range(tp)], (tuple(range(tp)),), channels=channels)
    ref = matmul_reduce_scatter_reference(xs, ws)
    for r in range(tp):
        assert_close(res.outputs[r], ref[r], dt, f"rank {r}")
