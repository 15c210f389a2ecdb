"""Every collective against NumPy for 2, 4, 8, 16 and 64 ranks, with sub-groups."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import nki, ncc, nisa, nl
from trnopt.kernels.sim import run_ranks

RANKS = [2, 4, 8, 16, 64]


def layouts(n: int) -> list[list[list[int]]]:
    """One group of all ranks in a shuffled ring order, plus contiguous and strided halves."""
    order = list(np.random.default_rng(n).permutation(n))
    out = [[[int(r) for r in order]]]
    if n >= 4:
        out.append([list(range(0, n // 2)), list(range(n // 2, n))])
        out.append([list(range(0, n, 2)), list(range(1, n, 2))])
    return out


def cases() -> list[tuple[int, list[list[int]]]]:
    return [(n, g) for n in RANKS for g in layouts(n)]


def ids(case: tuple[int, list[list[int]]]) -> str:
    return f"{case[0]}ranks-{len(case[1])}groups"


def my_list(groups: list[list[int]], rank: int) -> list[int]:
    return next(g for g in groups if rank in g)


@nki.jit
def group_collective(x, groups, kind, out_rows, op=None):
    """Copies x into an internal buffer, runs the collective into another, returns it."""
    g = ncc.ReplicaGroup(groups)
    rows, cols = x.shape
    src = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray((out_rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    if kind == "all_gather":
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    elif kind == "reduce_scatter":
        ncc.reduce_scatter(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, op=op)
    elif kind == "all_reduce":
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=g, op=op)
    elif kind == "all_to_all":
        ncc.all_to_all(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    out = nl.ndarray((out_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def inputs(n: int, rows: int, cols: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(n * 7 + rows)
    return [rng.integers(-8, 8, size=(rows, cols)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_all_gather(case: tuple[int, list[list[int]]]) -> None:
    n, groups = case
    xs = inputs(n, 2)
    gsize = len(groups[0])
    res = run_ranks(group_collective, [(x,) for x in xs],
                    kwargs=dict(groups=groups, kind="all_gather", out_rows=2 * gsize))
    for r in range(n):
        np.testing.assert_array_equal(res.outputs[r], np.concatenate([xs[m] for m in my_list(groups, r)]))


@pytest.mark.parametrize("case", cases(), ids=ids)
@pytest.mark.parametrize("op", ["add", "maximum"])
def test_reduce_scatter(case: tuple[int, list[list[int]]], op: str) -> None:
    n, groups = case
    gsize = len(groups[0])
    xs = inputs(n, 2 * gsize)
    res = run_ranks(group_collective, [(x,) for x in xs],
                    kwargs=dict(groups=groups, kind="reduce_scatter", out_rows=2, op=getattr(nl, op)))
    red = {"add": np.add, "maximum": np.maximum}[op]
    for r in range(n):
        lst = my_list(groups, r)
        total = red.reduce([xs[m] for m in lst])
        k = lst.index(r)
        np.testing.assert_array_equal(res.outputs[r], total[2 * k:2 * k + 2])


@pytest.mark.parametrize("case", cases(), ids=ids)
@pytest.mark.parametrize("op", ["add", "minimum"])
def test_all_reduce(case: tuple[int, list[list[int]]], op: str) -> None:
    n, groups = case
    xs = inputs(n, 4)
    res = run_ranks(group_collective, [(x,) for x in xs],
                    kwargs=dict(groups=groups, kind="all_reduce", out_rows=4, op=getattr(nl, op)))
    red = {"add": np.add, "minimum": np.minimum}[op]
    for r in range(n):
        np.testing.assert_array_equal(res.outputs[r], red.reduce([xs[m] for m in my_list(groups, r)]))


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_all_to_all(case: tuple[int, list[list[int]]]) -> None:
    n, groups = case
    gsize = len(groups[0])
    xs = inputs(n, gsize)
    res = run_ranks(group_collective, [(x,) for x in xs],
                    kwargs=dict(groups=groups, kind="all_to_all", out_rows=gsize))
    for r in range(n):
        lst = my_list(groups, r)
        k = lst.index(r)
        np.testing.assert_array_equal(res.outputs[r], np.stack([xs[m][k] for m in lst]))


def list_positions(groups: list[list[int]]) -> np.ndarray:
    """[1, world] int32: each rank's position in its rank-list (a kernel input table)."""
    world = sum(len(g) for g in groups)
    table = np.zeros((1, world), np.int32)
    for g in groups:
        for k, r in enumerate(g):
            table[0, r] = k
    return table


def position_of(rank_reg, table):
    """Register holding the list position of the rank in ``rank_reg``: a dynamic load from the
    position table, as a compiled kernel would do it (a register cannot index a Python list)."""
    slot = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=slot, src=table.ap([[1, 1], [1, 1]], scalar_offset=rank_reg, indirect_dim=1))
    k = nisa.register_alloc()
    nisa.register_load(k, slot)
    return k


@nki.jit
def ring_all_gather(x, table, groups, channel=0):
    """All-gather by n-1 implicit permutes; chunk placement from current_processing_rank_id,
    its list position loaded into a register and used as a dynamic offset."""
    g = ncc.ReplicaGroup(groups)
    n = len(groups[0])
    rows, cols = x.shape
    out = nl.ndarray((n * rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    bufs = [nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x)
    for i in range(n):
        held = ncc.collective_permute_implicit_current_processing_rank_id(i, g, channel_id=channel)
        k = position_of(held, table)
        nisa.dma_copy(dst=out.ap([[cols, rows], [1, cols]], scalar_offset=k * rows, indirect_dim=0), src=bufs[i % 2])
        if i < n - 1:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[i % 2]]], dsts_by_channel=[[bufs[(i + 1) % 2]]],
                                            replica_group=g, channel_ids=[channel])
    return out


@pytest.mark.parametrize("case", cases(), ids=ids)
@pytest.mark.parametrize("channel", [0, 1])
def test_implicit_permute_ring_all_gather(case: tuple[int, list[list[int]]], channel: int) -> None:
    n, groups = case
    xs = inputs(n, 2)
    table = list_positions(groups)
    res = run_ranks(ring_all_gather, [(x, table) for x in xs], kwargs=dict(groups=groups, channel=channel))
    for r in range(n):
        np.testing.assert_array_equal(res.outputs[r], np.concatenate([xs[m] for m in my_list(groups, r)]))


@nki.jit
def one_permute_two_channels(x, groups):
    """One implicit permute step on channels 0 and 1; returns (from ch0, from ch1)."""
    g = ncc.ReplicaGroup(groups)
    rows, cols = x.shape
    src = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    d0 = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    d1 = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.collective_permute_implicit(srcs_by_channel=[[src], [src]], dsts_by_channel=[[d0], [d1]],
                                    replica_group=g, channel_ids=[0, 1])
    outs = []
    for d in (d0, d1):
        o = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=d)
        outs.append(o)
    return tuple(outs)


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_implicit_permute_follows_list_order_on_both_channels(case: tuple[int, list[list[int]]]) -> None:
    n, groups = case
    xs = inputs(n, 1)
    res = run_ranks(one_permute_two_channels, [(x,) for x in xs], kwargs=dict(groups=groups))
    for r in range(n):
        lst = my_list(groups, r)
        k = lst.index(r)
        from0, from1 = res.outputs[r]
        np.testing.assert_array_equal(from0, xs[lst[(k - 1) % len(lst)]])  # predecessor in the list
        np.testing.assert_array_equal(from1, xs[lst[(k + 1) % len(lst)]])  # odd channel: other way


@nki.jit
def ring_reduce_scatter(x, table, groups):
    """Reduce-scatter along the ring with collective_permute_implicit_reduce.

    At step i rank k adds its own chunk of the rank processed next and forwards; after n-1
    steps it holds the sum of every other rank's copy of its own chunk, placed by
    current_processing_rank_id (list positions loaded into registers from ``table``).
    """
    g = ncc.ReplicaGroup(groups)
    n = len(groups[0])
    rows, cols = x.shape
    c = rows // n
    xin = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=xin, src=x)
    acc = [nl.ndarray((c, cols), dtype=x.dtype, buffer=nl.private_hbm) for _ in range(2)]
    zero = nl.zeros((c, cols), dtype=x.dtype, buffer=nl.private_hbm)
    partial = zero
    chunk = [[cols, c], [1, cols]]
    for i in range(n - 1):
        # the chunk that travels: rank at list position (k - i - 1) owns the final sum
        j = position_of(ncc.collective_permute_implicit_current_processing_rank_id(i + 1, g), table)
        ncc.collective_permute_implicit_reduce(
            srcs0_by_channel=[[partial]], srcs1_by_channel=[[xin.ap(chunk, scalar_offset=j * c, indirect_dim=0)]],
            dsts_by_channel=[[acc[i % 2]]], replica_group=g, op=nl.add)
        partial = acc[i % 2]
    k = position_of(ncc.rank_id(), table)
    final = nl.ndarray((c, cols), dtype=x.dtype, buffer=nl.private_hbm)
    sb_a = nl.ndarray((c, cols), dtype=x.dtype, buffer=nl.sbuf)
    sb_b = nl.ndarray((c, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb_a, src=partial)
    nisa.dma_copy(dst=sb_b, src=xin.ap(chunk, scalar_offset=k * c, indirect_dim=0))
    nisa.tensor_tensor(dst=sb_a, data1=sb_a, data2=sb_b, op=nl.add)
    out = nl.ndarray((c, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=final, src=sb_a)
    nisa.dma_copy(dst=out, src=final)
    return out


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_implicit_permute_reduce_ring_reduce_scatter(case: tuple[int, list[list[int]]]) -> None:
    n, groups = case
    gsize = len(groups[0])
    xs = inputs(n, gsize)
    res = run_ranks(ring_reduce_scatter, [(x, list_positions(groups)) for x in xs], kwargs=dict(groups=groups))
    for r in range(n):
        lst = my_list(groups, r)
        k = lst.index(r)
        total = np.sum([xs[m] for m in lst], axis=0)
        np.testing.assert_array_equal(res.outputs[r], total[k:k + 1])


@nki.jit
def explicit_permute(x, pairs):
    rows, cols = x.shape
    src = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.zeros((rows, cols), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs)
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("n", RANKS)
def test_collective_permute_pairwise_swap(n: int) -> None:
    xs = inputs(n, 2)
    pairs = [(r, r ^ 1) for r in range(n)]
    res = run_ranks(explicit_permute, [(x,) for x in xs], kwargs=dict(pairs=pairs))
    for r in range(n):
        np.testing.assert_array_equal(res.outputs[r], xs[r ^ 1])


@nki.jit
def sbuf_all_gather(x, groups):
    """all_gather of SBUF tiles along the free dim (collective_dim=1)."""
    g = ncc.ReplicaGroup(groups)
    n = len(groups[0])
    p, f = x.shape
    src = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    dst = nl.ndarray((p, n * f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=1)
    out = nl.ndarray((p, n * f), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_sbuf_all_gather_on_free_dim() -> None:
    xs = inputs(4, 8)
    res = run_ranks(sbuf_all_gather, [(x,) for x in xs], kwargs=dict(groups=[[0, 1, 2, 3]]))
    for r in range(4):
        np.testing.assert_array_equal(res.outputs[r], np.concatenate(xs, axis=1))


def test_rank_id_and_bf16_all_reduce_rounds_once() -> None:
    import ml_dtypes

    xs = [np.full((2, 2), 1.0 + 2.0 ** -8 * r, dtype=ml_dtypes.bfloat16) for r in range(4)]
    res = run_ranks(group_collective, [(x,) for x in xs],
                    kwargs=dict(groups=[[0, 1, 2, 3]], kind="all_reduce", out_rows=2, op=nl.add))
    ref = np.sum([x.astype(np.float32) for x in xs], axis=0).astype(ml_dtypes.bfloat16)
    for out in res.outputs:
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("factor", [1.0, 8.0, 8 / 15])
def test_all_to_all_time_scales_with_bisection_factor(factor: float) -> None:
    """(n-1) * (S/n / B * bisection_factor + a); other collectives unaffected."""
    from trnopt.kernels.sim import LinkModel, TensorSpec

    n, rows, cols = 16, 64, 256
    link = LinkModel(100e9, 1e-6, bisection_factor=factor)
    specs = [(TensorSpec((rows, cols), np.float32),)] * n
    groups = [list(range(n))]
    res = run_ranks(group_collective, specs, numerics=False, link=link,
                    kwargs=dict(groups=groups, kind="all_to_all", out_rows=rows))
    (a2a,) = [i for i in res.timeline.cores[0].instructions if i.op == "all_to_all"]
    s = rows * cols * 4
    assert a2a.end_s - a2a.start_s == pytest.approx((n - 1) * (s / n / 100e9 * factor + 1e-6))
    res = run_ranks(group_collective, specs, numerics=False, link=link,
                    kwargs=dict(groups=groups, kind="reduce_scatter", out_rows=rows // n, op=nl.add))
    (rs,) = [i for i in res.timeline.cores[0].instructions if i.op == "reduce_scatter"]
    assert rs.end_s - rs.start_s == pytest.approx((n - 1) * (s / n / 100e9 + 1e-6))


def test_bisection_factor_validated_and_optional() -> None:
    from trnopt.kernels.sim import LinkModel

    assert LinkModel(1e9, 0.0) == LinkModel(1e9, 0.0, 1.0)
    with pytest.raises(ValueError, match="bisection_factor"):
        LinkModel(1e9, 0.0, bisection_factor=0)
