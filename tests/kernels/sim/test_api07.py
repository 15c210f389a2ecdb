"""The NKI 0.7 functions added to the simulator, each against NumPy from its reference page."""

from __future__ import annotations

import numpy as np
import pytest

from trnopt.kernels.nki_api import ncc, nisa, nki, nl
from trnopt.kernels.sim import ConstraintError, run_ranks


def one(kernel, *args, **kwargs):
    return nki.simulate(kernel)(*args, **kwargs)


@nki.jit
def tile_math(a, b):
    """nl functions on tiles: load, elementwise, reductions, broadcast, where, store."""
    x, y = nl.load(a), nl.load(b)
    outs = []
    for t in (nl.add(x, y), nl.multiply(x, 2.0), nl.maximum(x, y), nl.exp(x), nl.gelu(x), nl.gelu_apprx_sigmoid(x),
              nl.sum(x, axis=1, keepdims=True), nl.max(x, axis=[1]), nl.where(nl.greater(x, y), x, y),
              nl.broadcast_to(nl.sum(x, axis=1, keepdims=True), x.shape), nl.softmax(x, axis=1),
              nl.rms_norm(x, y, axis=1, n=x.shape[1])):
        o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=t)
        outs.append(o)
    return tuple(outs)


def test_nl_functions_on_tiles() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)
    from math import erf
    gelu = 0.5 * a * (1 + np.vectorize(erf)(a / np.sqrt(2)))
    e = np.exp(a - a.max(1, keepdims=True))
    want = [a + b, 2 * a, np.maximum(a, b), np.exp(a), gelu, a / (1 + np.exp(-1.702 * a)), a.sum(1, keepdims=True),
            a.max(1), np.where(a > b, a, b), np.broadcast_to(a.sum(1, keepdims=True), a.shape),
            e / e.sum(1, keepdims=True), a / np.sqrt((a * a).sum(1, keepdims=True) / 16 + 1e-6) * b]
    for i, (got, w) in enumerate(zip(one(tile_math, a, b), want)):
        np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-6, err_msg=f"output {i}")


@nki.jit
def tile_matmul(x, y):
    xt, yt = nl.load(x), nl.load(y)
    ps = nl.matmul(xt, yt, transpose_x=True)
    tp = nl.transpose(yt)
    o1 = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o2 = nl.ndarray(tp.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    s1 = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    s2 = nl.ndarray(tp.shape, dtype=y.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s1, src=ps)
    nisa.tensor_copy(dst=s2, src=tp)
    nl.store(o1, value=s1)
    nl.store(o2, value=s2)
    return o1, o2


def test_nl_matmul_and_transpose_go_through_psum() -> None:
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    y = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) / 7
    mm, tr = one(tile_matmul, x, y)
    np.testing.assert_allclose(mm, x.T @ y, rtol=1e-6)
    np.testing.assert_array_equal(tr, y.T)


@nki.jit
def vector_ops(x, y):
    p, f = x.shape
    xs, ys = nl.load(x), nl.load(y)
    outs = {}

    def out(key, shape, dtype=nl.float32):
        t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
        outs[key] = t
        return t
    nisa.tensor_reduce(dst=out("reduce", (p, 1)), op=nl.add, data=xs, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=out("neg_max", (p,)), op=nl.maximum, data=xs, axis=1, negate=True)
    nisa.tensor_tensor_scan(dst=out("scan", (p, f)), data0=xs, data1=ys, initial=0.0, op0=nl.multiply, op1=nl.add)
    nisa.iota(dst=out("iota", (p, f), nl.int32), pattern=[[1, f]], offset=3, channel_multiplier=100)
    nisa.affine_select(dst=out("causal", (p, f)), pattern=[[-1, f]], channel_multiplier=1, on_true_tile=xs,
                       on_false_value=-9.0, cmp_op=nl.greater_equal)
    nisa.max8(dst=out("max8", (p, 8)), src=xs)
    nisa.scalar_tensor_tensor(dst=out("stt", (p, f)), data=xs, op0=nl.multiply, operand0=3.0, op1=nl.subtract,
                              operand1=ys)
    nisa.tensor_scalar_cumulative(dst=out("cum", (p, f)), src=xs, op0=nl.multiply, op1=nl.add, imm0=2.0)
    nisa.bn_stats(dst=out("stats", (p, 6)), data=xs)
    nisa.bn_aggr(dst=out("aggr", (p, 2)), data=outs["stats"])
    nisa.reciprocal(dst=out("recip", (p, f)), data=ys)
    res = {}
    for k, t in outs.items():
        o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(o, value=t)
        res[k] = o
    return tuple(res[k] for k in sorted(res))


def test_vector_engine_instructions() -> None:
    rng = np.random.default_rng(1)
    p, f = 4, 16
    x = rng.standard_normal((p, f)).astype(np.float32)
    y = rng.uniform(0.5, 2, (p, f)).astype(np.float32)
    scan = np.zeros_like(x)
    prev = np.zeros(p, np.float32)
    for i in range(f):
        prev = x[:, i] * prev + y[:, i]
        scan[:, i] = prev
    cols, rows = np.arange(f)[None, :], np.arange(p)[:, None]
    want = {"reduce": x.sum(1, keepdims=True), "neg_max": -x.max(1), "scan": scan,
            "iota": 3 + 100 * rows + cols, "causal": np.where(rows - cols >= 0, x, -9.0),
            "max8": -np.sort(-x, axis=1)[:, :8], "stt": 3 * x - y, "cum": np.cumsum(2 * x, axis=1),
            "aggr": np.stack([x.mean(1), x.var(1)], axis=1), "recip": 1 / y}
    outs = one(vector_ops, x, y)
    keys = sorted(["reduce", "neg_max", "scan", "iota", "causal", "max8", "stt", "cum", "stats", "aggr", "recip"])
    got = dict(zip(keys, outs))
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=k)
    even, odd = x[:, 0::2], x[:, 1::2]
    np.testing.assert_allclose(got["stats"][:, [0, 1, 3, 4]],
                               np.stack([np.full(p, 8.0), even.mean(1), np.full(p, 8.0), odd.mean(1)], 1), rtol=1e-5)


@nki.jit
def find_and_count(x):
    xs = nl.load(x)
    vals = nl.ndarray((x.shape[0], 8), dtype=nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.max8(dst=vals, src=xs)
    nisa.nc_find_index8(dst=idx, data=xs, vals=vals)
    o = nl.ndarray(idx.shape, dtype=nl.uint32, buffer=nl.shared_hbm)
    nl.store(o, value=idx)
    return o


def test_find_index8_locates_the_max8_values() -> None:
    x = np.random.default_rng(2).permutation(64).astype(np.float32).reshape(2, 32)
    idx = one(find_and_count, x)
    np.testing.assert_array_equal(idx, np.argsort(-x, axis=1)[:, :8])


@nki.jit
def nonzeros(x):
    p, t = 128, x.shape[1]
    src = nl.ndarray((p, t), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=src, value=0.0)
    nisa.dma_copy(dst=src[0:1, :], src=x)
    dst = nl.ndarray((p, t + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.nonzero_with_count(dst=dst, src=src, index_offset=10, padding_val=-1)
    o = nl.ndarray((1, t + 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=dst[0:1, :])
    return o


def test_nonzero_with_count_reads_every_16th_partition() -> None:
    x = np.array([[0, 1, 1, 0, 0, 1, 0, 0]], np.float32)
    np.testing.assert_array_equal(one(nonzeros, x), [[11, 12, 15, -1, -1, -1, -1, -1, 3]])


@nki.jit
def dma_transposes(x):
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=x)
    t = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=s)
    o = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def test_dma_transpose() -> None:
    import ml_dtypes
    x = np.arange(16 * 8).reshape(16, 8).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(one(dma_transposes, x), x.T)


@nki.jit
def a2a_v(x, meta, split):
    g = ncc.ReplicaGroup([[0, 1]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    zero = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=dst, src=zero)
    m = nl.ndarray(meta.shape, dtype=meta.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=m, src=meta)
    if split:
        prep = ncc.all_to_all_v_prepare(srcs=[src], dsts=[dst], replica_group=g, metadata_tensor=m)
        ncc.all_to_all_v_trigger(prep)
    else:
        ncc.all_to_all_v(srcs=[src], dsts=[dst], replica_group=g, metadata_tensor=m)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("split", [False, True])
def test_all_to_all_v_with_and_without_prepare_trigger(split) -> None:
    """Rank 0 sends 2 elements to itself and 3 to rank 1; rank 1 sends 1 to rank 0 and 4 to
    itself; each rank packs what it receives in rank-list order."""
    x0, x1 = np.arange(1, 9, dtype=np.float32), np.arange(11, 19, dtype=np.float32)
    m0 = np.array([[2, 3], [0, 2]], np.uint32)  # counts to ranks 0, 1; displacements
    m1 = np.array([[1, 4], [0, 1]], np.uint32)
    res = run_ranks(a2a_v, [(x0, m0), (x1, m1)], kwargs=dict(split=split))
    np.testing.assert_array_equal(res.outputs[0], [1, 2, 11, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(res.outputs[1], [3, 4, 5, 12, 13, 14, 15, 0])


@nki.jit
def two_prepares(x, meta):
    g = ncc.ReplicaGroup([[0]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_to_all_v_prepare(srcs=[src], dsts=[src], replica_group=g, metadata_tensor=meta)
    ncc.all_gather_v_prepare(srcs=[src], dsts=[src], replica_group=g, metadata_tensor=meta)


def test_prepares_share_one_slot() -> None:
    with pytest.raises(ConstraintError, match="prepares share one slot"):
        one(two_prepares, np.zeros(4, np.float32), np.zeros((2, 1), np.uint32))


def test_replica_group_from_partition_op() -> None:
    rg = ncc.ReplicaGroup.from_partition_op
    assert rg(8, ncc.rg_partition_op.div, 4) == ncc.ReplicaGroup([[0, 1, 2, 3], [4, 5, 6, 7]])
    assert rg(8, ncc.rg_partition_op.mod, 4) == ncc.ReplicaGroup([[0, 4], [1, 5], [2, 6], [3, 7]])
    assert rg(8, ncc.rg_partition_op.bitwise_and, 0) == ncc.ReplicaGroup([list(range(8))])


def test_collectives_return_instructions() -> None:
    from trnopt.kernels.sim.instruction import NkiInstruction

    @nki.jit
    def ag(x):
        g = ncc.ReplicaGroup([[0, 1]])
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
        dst = nl.ndarray((2 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
        i1 = nisa.dma_copy(dst=src, src=x)
        i2 = ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
        assert isinstance(i1, NkiInstruction) and isinstance(i2, NkiInstruction)
        assert i2.depends_on(i1) is i2 and i2.end_s > i2.start_s >= i1.end_s

    run_ranks(ag, [(np.ones((2, 2), np.float32),)] * 2)


def test_nki_objects_take_their_fields_as_keywords() -> None:
    from dataclasses import dataclass

    @dataclass
    class Params(nl.NKIObject):
        section_idx = None
        offset = 0

    p = Params(section_idx=3)
    assert (p.section_idx, p.offset) == (3, 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        Params(nope=1)


def test_nc_version_follows_the_platform_target(monkeypatch) -> None:
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert nisa.get_nc_version() is nisa.nc_version.gen3
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert nisa.get_nc_version() is nisa.nc_version.gen4
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ConstraintError, match="expected one of"):
        nisa.get_nc_version()
