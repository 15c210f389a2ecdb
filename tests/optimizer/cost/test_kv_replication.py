"""TP past the KV head count (NxD's kv_size_multiplier): the replicas' memory and time, by hand."""

import pytest

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost import memory, steptime, terms
from trnopt.optimizer.cost.memory import kv_replica_params, memory_per_chip
from trnopt.optimizer.cost.steptime import step_terms, step_time
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

W405 = Workload(load_model("llama3-405b"), Training())
EXTRA_TP64 = 29_595_009_024  # 126 layers x 2 (K, V) x 16384 hidden x 128 head dim x (64 - 8) replicated heads


def seed(tp: int = 64, dp: int = 2, zero: int = 1, batch: int = 1024) -> tuple:
    """TP x PP4 x DP on two trn2u at LNC=2 (512 ranks, 4 a chip), full recompute."""
    t = load_target("trn2u")
    axes = t.axes(2, 2)
    lay = Layout(tp=tp, pp=4, dp=dp, axes=axes, placement=default_placement(axes, {"tp": tp, "pp": 4, "dp": dp}),
                 zero=zero, recompute="full", lnc=2)
    return t, lay, Workload(W405.model, Training(global_batch=batch))


def clear_trees():
    """Drop the cached step-time trees (those under an overlap table and those under none)."""
    steptime._step_terms.cache_clear()
    steptime._overlap_free.cache_clear()


@pytest.fixture(autouse=True)
def fresh_step_terms():
    """The step-time trees are cached by workload: none built while patched may outlive its test."""
    clear_trees()
    yield
    clear_trees()


def without_replicas(monkeypatch):
    monkeypatch.setattr(memory, "kv_replica_params", lambda model, tp: 0)
    monkeypatch.setattr(terms, "kv_replica_params", lambda model, tp: 0)
    clear_trees()


def test_replicated_parameters_by_hand():
    assert 126 * 2 * 16384 * 128 * (64 - 8) == EXTRA_TP64
    assert kv_replica_params(W405.model, 64) == EXTRA_TP64
    assert kv_replica_params(W405.model, 8) == 0  # TP8 shards the 8 KV heads: nothing replicated
    assert kv_replica_params(load_model("deepseek-v3"), 128) == 0  # MLA has no KV heads to replicate


def test_memory_charges_every_replica_its_weights_gradients_and_optimizer_state(monkeypatch):
    t, lay, w = seed()
    charged = memory_per_chip(w, lay, t)
    without_replicas(monkeypatch)
    plain = memory_per_chip(w, lay, t)
    per_rank = EXTRA_TP64 // (64 * 4)          # tp 64 x pp 4: 115,605,504 replicated parameters a rank
    assert per_rank == 115_605_504
    # 4 ranks a chip; ZeRO-1: BF16 weights and gradients whole, FP32 master + Adam (12 B) over dp 2
    assert charged.weights - plain.weights == pytest.approx(2 * per_rank * 4)         # 924,844,032 B
    assert charged.gradients - plain.gradients == pytest.approx(2 * per_rank * 4)
    assert charged.optimizer - plain.optimizer == pytest.approx(12 * per_rank / 2 * 4)  # 2,774,532,096 B
    assert charged.activations == plain.activations


def test_optimizer_step_reads_the_replicas_state(monkeypatch):
    t, lay, w = seed()
    charged = step_time(w, lay, t)
    without_replicas(monkeypatch)
    plain = step_time(w, lay, t)
    # Adam reads and writes 16 B of state (2 x 16) and the norm and clipping pass the BF16 gradient 3 times
    # (3 x 2): 38 B a parameter; ZeRO-1 shards the state, so a rank steps EXTRA / 512 ranks, 4 ranks sharing
    # a chip's HBM bandwidth
    expected = 38 * 4 * (EXTRA_TP64 / 512) / t.chip.hbm_bandwidth
    assert charged.optimizer - plain.optimizer == pytest.approx(expected)


def test_kv_gradient_all_reduce_once_per_layer_and_micro_batch(monkeypatch):
    t, lay, w = seed()
    charged = step_time(w, lay, t).tp
    t2, lay2, w2 = seed(batch=2048)
    charged2 = step_time(w2, lay2, t2).tp
    t8, lay8, w8 = seed(tp=8, dp=16)
    tp8 = step_time(w8, lay8, t8).tp
    without_replicas(monkeypatch)
    extra = charged - step_time(w, lay, t).tp
    extra2 = charged2 - step_time(w2, lay2, t2).tp
    assert extra > 0
    assert extra2 == pytest.approx(2 * extra)  # twice the micro-batches, twice the all-reduces
    assert step_time(w8, lay8, t8).tp == tp8   # TP8 replicates nothing


def _node(expr, name):
    """The node of a factor tree called ``name``."""
    if getattr(expr, "name", "") == name:
        return expr
    for child in (getattr(expr, "items", ()) or ()) + tuple(getattr(expr, k) for k in ("a", "b", "num", "den")
                                                            if hasattr(expr, k)):
        found = _node(child, name)
        if found is not None:
            return found
    return None


def test_dp_gradient_bytes_grow_by_the_replicas(monkeypatch):
    t, lay, w = seed()
    point = f.decisions(lay, w)
    charged = _node(step_terms(w, t, lay.axes, lay.lnc, None)["dp"], "dp_comm").value(point)
    without_replicas(monkeypatch)
    plain = _node(step_terms(w, t, lay.axes, lay.lnc, None)["dp"], "dp_comm").value(point)
    dense = w.model.total_params()  # a dense model: every parameter's gradient is in the dense bucket
    latency = _node(step_terms(w, t, lay.axes, lay.lnc, None)["dp"], "dp_comm_dense_lat").value(point)
    # the bandwidth part grows by E / P_dense; the per-collective fixed cost does not
    assert charged - plain == pytest.approx((plain - latency) * EXTRA_TP64 / dense)
