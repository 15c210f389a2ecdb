"""Timeline sanity: documented durations, dependency order, concurrent engines."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import nki, ncc, nisa, nl
from trnopt.kernels.sim import LinkModel, rates, run_ranks


def instrs(res, op, rank=0):
    return [i for i in res.timeline.cores[rank].instructions if i.op == op]


@nki.jit
def one_matmul(m, n):
    st = nl.ndarray((128, m), dtype=nl.bfloat16, buffer=nl.sbuf)
    mv = nl.ndarray((128, n), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=st, value=1.0)
    nisa.memset(dst=mv, value=1.0)
    ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv)


@pytest.mark.parametrize("m, n, cycles", [(128, 512, 512), (32, 16, 32), (128, 32, 64), (8, 4, 8)])
def test_matmul_alone_takes_documented_cycles(m: int, n: int, cycles: int) -> None:
    res = run_ranks(one_matmul, [()], kwargs=dict(m=m, n=n))
    (mm,) = instrs(res, "nc_matmul")
    assert mm.end_s - mm.start_s == pytest.approx(cycles / 2.4e9)
    assert res.timeline.busy_s["Tensor"] == pytest.approx(cycles / 2.4e9)
    # it waits for its operands (memsets on the Vector engine)
    assert mm.start_s >= max(i.end_s for i in instrs(res, "memset")) - 1e-15


@nki.jit
def one_dma(x):
    sb = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x)


def test_dma_alone_takes_fixed_costs_plus_bytes_over_bandwidth() -> None:
    x = np.zeros((128, 1024), np.float32)
    res = run_ranks(one_dma, [(x,)])
    # 128 partition rows of 4 KiB: 128 chunks over 16 engines at 23 B/ns each (trn2)
    data = (x.nbytes / 23e9 + 128 * rates.DMA_CHUNK_S) / 16
    expected = rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S + data
    assert res.timeline.total_s == pytest.approx(expected)
    assert res.timeline.busy_s["DMA"] == pytest.approx(data)


@nki.jit
def one_permute(x, with_matmul=False):
    g = ncc.ReplicaGroup([[0, 1]])
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=a, value=0.0)
    if with_matmul:
        st = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        mv = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=st, value=1.0)
        nisa.memset(dst=mv, value=1.0)
        for _ in range(8):
            ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=st, moving=mv)
    ncc.collective_permute_implicit(srcs_by_channel=[[a]], dsts_by_channel=[[b]], replica_group=g)


LINK = LinkModel(bandwidth_Bps=100e9, latency_s=2e-6)


def test_transfer_alone_takes_bytes_over_bandwidth_plus_latency() -> None:
    x = np.zeros((128, 2048), np.float32)
    res = run_ranks(one_permute, [(x,), (x,)], link=LINK)
    (cp,) = instrs(res, "collective_permute_implicit")
    assert cp.engine == "CC0"
    assert cp.end_s - cp.start_s == pytest.approx(x.nbytes / 100e9 + 2e-6)
    assert res.timeline.exposed_comm_s == pytest.approx(x.nbytes / 100e9 + 2e-6)


def test_independent_matmul_and_transfer_overlap() -> None:
    x = np.zeros((128, 2048), np.float32)
    res = run_ranks(one_permute, [(x,), (x,)], link=LINK, kwargs=dict(with_matmul=True))
    (cp,) = instrs(res, "collective_permute_implicit")
    mms = instrs(res, "nc_matmul")
    mm_start, mm_end = mms[0].start_s, mms[-1].end_s
    assert cp.start_s < mm_end and mm_start < cp.end_s  # they overlap in time
    t_mm, t_cc = mm_end - mm_start, cp.end_s - cp.start_s
    assert res.timeline.total_s < res.timeline.busy_s["Vector"] + t_mm + t_cc
    # the transfer is hidden at least while the Tensor engine works
    assert 0 < res.timeline.exposed_comm_s <= t_cc - t_mm + 1e-12


def test_link_per_channel_and_summary() -> None:
    x = np.zeros((128, 256), np.float32)
    res = run_ranks(one_permute, [(x,), (x,)], link={0: LinkModel(50e9, 1e-6)})
    (cp,) = instrs(res, "collective_permute_implicit")
    assert cp.end_s - cp.start_s == pytest.approx(x.nbytes / 50e9 + 1e-6)
    s = res.timeline.summary()
    assert "kernel time" in s and "CC0" in s and "exposed comm" in s


def test_default_link_is_documented_trn2_figure() -> None:
    assert rates.DEFAULT_LINK.bandwidth_Bps == pytest.approx(256e9)
    assert 1e-6 <= rates.DEFAULT_LINK.latency_s <= 2e-6


@nki.jit
def chained(x):
    """DMA in, copy, DMA out: a chain of true dependencies runs back to back."""
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.tensor_copy(dst=b, src=a)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=b)
    return out


def test_dependencies_order_instructions() -> None:
    x = np.ones((128, 64), np.float32)
    res = run_ranks(chained, [(x,)])
    d1, d2 = instrs(res, "dma_copy")
    (c,) = instrs(res, "tensor_copy")
    assert d1.end_s <= c.start_s and c.end_s <= d2.start_s + rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S


@nki.jit
def disjoint_halves(x):
    """Two DMAs into disjoint halves of one tile, then two copies each reading one half."""
    p, f = x.shape
    a = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    h = f // 2
    nisa.dma_copy(dst=a[:, 0:h], src=x[:, 0:h])
    nisa.tensor_copy(dst=b[:, 0:h], src=a[:, 0:h])
    nisa.dma_copy(dst=a[:, h:f], src=x[:, h:f])
    nisa.tensor_copy(dst=b[:, h:f], src=a[:, h:f])


def test_disjoint_slices_do_not_serialize() -> None:
    x = np.ones((128, 8192), np.float32)
    res = run_ranks(disjoint_halves, [(x,)])
    d1, d2 = instrs(res, "dma_copy")
    c1, c2 = instrs(res, "tensor_copy")
    assert c1.start_s < d2.end_s  # first copy only waits for the first half
    assert c2.start_s >= d2.end_s


@nki.jit
def blocked_then_ready(x, n_ready):
    """A store that waits on a long Vector chain, then ``n_ready`` loads whose data is ready."""
    p, f = x.shape
    slow = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf, name="slow")
    nisa.memset(dst=slow, value=0.0)
    for _ in range(20):
        nisa.tensor_scalar(dst=slow, data=slow, op0=nl.add, operand0=1.0)
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=slow, name="blocked")
    keep = []  # distinct live tiles: no memory reuse between the loads
    for i in range(n_ready):
        keep.append(nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf, name=f"t{i}"))
        nisa.dma_copy(dst=keep[-1], src=x, name=f"ready{i}")
    return out


def _dma(res, name):
    (d,) = [i for i in res.timeline.cores[0].instructions if i.name == name]
    return d


def test_dma_waiting_for_data_blocks_only_its_own_queue() -> None:
    """queues are independent and in order; the bandwidth is shared."""
    x = np.zeros((128, 512), np.float32)
    assert rates.DMA_QUEUES == 4
    res = run_ranks(blocked_then_ready, [(x,)], kwargs=dict(n_ready=4))
    blocked = _dma(res, "blocked")
    vector_end = max(i.end_s for i in res.timeline.cores[0].instructions if i.engine == "Vector")
    assert blocked.start_s >= vector_end  # it waits for its data
    transfer = (x.nbytes / 23e9 + 128 * rates.DMA_CHUNK_S) / 16
    fixed = rates.DMA_DESCRIPTOR_S + rates.DMA_SEMAPHORE_TO_START_S
    # ready0..2 run on queues 1..3 right away, one after the other on the shared bandwidth
    ends = sorted(_dma(res, f"ready{i}").end_s for i in range(3))
    assert ends == pytest.approx([fixed + transfer, fixed + 2 * transfer, fixed + 3 * transfer])
    assert ends[-1] < blocked.start_s
    # ready3 is behind the blocked DMA on queue 0 (in-order queue)
    assert _dma(res, "ready3").end_s == pytest.approx(blocked.end_s + transfer)
    # DMA busy time is bytes over bandwidth: the data phases never overlap
    ivs = sorted(res.timeline.cores[0].intervals["DMA"])
    assert all(a[1] <= b[0] + 1e-15 for a, b in zip(ivs, ivs[1:]))
    assert res.timeline.busy_s["DMA"] == pytest.approx(5 * transfer)


def test_ready_dma_fills_the_bandwidth_gap_before_a_waiting_one() -> None:
    """A later ready DMA on another queue may use the bandwidth before an earlier issued
    DMA that waits (out of issue order), but never at the same time."""
    x = np.zeros((128, 4096), np.float32)
    res = run_ranks(blocked_then_ready, [(x,)], kwargs=dict(n_ready=1))
    blocked, ready = _dma(res, "blocked"), _dma(res, "ready0")
    assert ready.end_s <= blocked.start_s + 1e-15


@nki.jit
def fresh_tile_per_iteration(x, keep):
    """Each iteration loads into a new SBUF tile ``t`` and reads it 8 times on the Scalar
    engine. Rebinding ``t`` frees the tile of two iterations back (the previous one is
    still referenced while the new one is allocated), whose memory the new tile reuses."""
    p, f = x.shape
    live = []
    s = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf, name="s")
    for i in range(6):
        t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf, name=f"t{i}")
        nisa.dma_copy(dst=t, src=x, name=f"load{i}")
        for j in range(8):
            nisa.activation(dst=s, op=nl.exp, data=t, name=f"use{i}")
        if keep:
            live.append(t)


def test_freed_tile_memory_keeps_its_hazards() -> None:
    """a tile allocated where a freed one lived cannot be written before the freed
    tile's last reader is done (write-after-read on the reused SBUF range)."""
    x = np.zeros((128, 1024), np.float32)
    reused = run_ranks(fresh_tile_per_iteration, [(x,)], kwargs=dict(keep=False))
    fresh = run_ranks(fresh_tile_per_iteration, [(x,)], kwargs=dict(keep=True))

    def last(res, name):
        return max(i.end_s for i in res.timeline.cores[0].instructions if i.name == name)

    transfer = (x.nbytes / 23e9 + 128 * rates.DMA_CHUNK_S) / 16
    # t is rebound each iteration: 2 tiles of the site live at once, so the compiler's
    # rotation gives it ROTATION_BUFFERS x 2 = 4 slots and tile i reuses tile i-4's memory
    assert rates.ROTATION_BUFFERS == 2
    for i in (4, 5):
        # memory reused: load i (data phase) starts after the last read of tile i-4
        assert last(reused, f"load{i}") - transfer >= last(reused, f"use{i - 4}") - 1e-15
        # every tile alive (distinct memory): the load does not wait for them
        assert last(fresh, f"load{i}") < last(reused, f"load{i}")
    for i in range(4):  # the first four tiles take fresh slots: timed as if all stayed alive
        assert last(reused, f"load{i}") == pytest.approx(last(fresh, f"load{i}"))
    assert reused.timeline.total_s >= fresh.timeline.total_s


@nki.jit
def gather_and_load(x, y, tp):
    """An all_gather and an independent DMA load of y, issued together."""
    g = ncc.ReplicaGroup([list(range(tp))])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray((tp * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    t = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=y, name="load")


def test_collective_traffic_takes_the_cores_dma_bandwidth() -> None:
    """The bytes an all_gather sends ((n-1)/n of its result) are booked on the DMA bandwidth
    that compute loads share: DMA busy time counts them, and the independent load of y must
    find a free interval (it cannot start before the bandwidth is free)."""
    from trnopt.kernels.sim import TensorSpec, rates

    tp, rows, cols = 4, 128, 2048
    xs = [(TensorSpec((rows, cols), np.float32), TensorSpec((128, 2048), np.float32))] * tp
    res = run_ranks(gather_and_load, xs, numerics=False, kwargs=dict(tp=tp), symmetric=False)
    core = res.timeline.cores[0]
    sent = (tp - 1) * rows * cols * 4
    moved = rows * cols * 4 + 128 * 2048 * 4
    # chunks: the HBM-to-HBM staging copy is one contiguous piece, the load 128 partition rows
    chunk_s = (1 + 128) * rates.DMA_CHUNK_S / 16
    assert core.busy["DMA"] == pytest.approx((moved + sent) / rates.DMA_BANDWIDTH_BPS + chunk_s)
    dma = sorted(iv for iv in core.intervals["DMA"])
    for (a0, a1), (b0, b1) in zip(dma, dma[1:]):
        assert a1 <= b0 + 1e-15  # time-multiplexed: never two data phases at once


def test_a_long_transfer_runs_in_the_gaps_between_short_ones() -> None:
    """A data phase needs its bytes / bandwidth of the shared DMA bandwidth, not one free
    interval that long: booked after two short transfers that leave gaps, a long one
    takes the gaps (earliest first) and ends when it has had its time."""
    from trnopt.kernels.sim.timeline import CoreTimeline

    tl = CoreTimeline(0)
    us = 1e-6
    short = int(1 * us * rates.DMA_BANDWIDTH_BPS)  # 1 us of bandwidth each
    tl.dma_traffic(2 * us, short, "x", "a")  # busy [2, 3)
    tl.dma_traffic(5 * us, short, "x", "b")  # busy [5, 6)
    end = tl.dma_traffic(0.0, int(6 * us * rates.DMA_BANDWIDTH_BPS), "x", "long")
    assert end == pytest.approx(8 * us)  # [0, 2) + [3, 5) + [6, 8)
    ivs = sorted(tl.intervals["DMA"])
    assert all(a[1] <= b[0] + 1e-15 for a, b in zip(ivs, ivs[1:]))
    assert tl.busy["DMA"] == pytest.approx(8 * us)


def test_collective_traffic_is_paced_over_its_link_time() -> None:
    """A transfer slower on its link than on the DMA reads its bytes over the link time in
    pieces, so a compute DMA booked after it still finds bandwidth before it ends."""
    from trnopt.kernels.sim.timeline import TRAFFIC_PIECES, CoreTimeline

    tl = CoreTimeline(0)
    us = 1e-6
    nbytes = int(4 * us * rates.DMA_BANDWIDTH_BPS)  # 4 us of DMA bandwidth over a 16 us link time
    end = tl.dma_traffic(0.0, nbytes, "cc", "step", span=16 * us)
    starts = sorted(a for a, _ in tl.intervals["DMA"])
    assert len(starts) == TRAFFIC_PIECES
    assert starts == pytest.approx([i * 16 * us / TRAFFIC_PIECES for i in range(TRAFFIC_PIECES)])
    assert end == pytest.approx(14 * us + 4 * us / TRAFFIC_PIECES)
    _, load_end = tl.dma(int(1 * us * rates.DMA_BANDWIDTH_BPS), 0.0, "dma_copy", "load")
    assert load_end < end
