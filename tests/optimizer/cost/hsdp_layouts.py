"""One layout with and without HSDP, for the memory and step-time tests."""

import dataclasses

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def hsdp_pair():
    """TP16 x PP9 x DP16 of llama3-70b on 4 trn3-gen2: dp over 4 chips of each server and the 4 servers,
    plain FSDP and HSDP (4 replicas of 4-way shards)."""
    t = load_target("trn3-gen2")
    axes = t.axes(2, 4)
    factors = {"tp": {"core": 4, "switch": 4}, "dp": {"switch": 4, "efa": 4}, "pp": {"switch": 9}}
    rows = tuple(tuple(factors.get(d, {}).get(a.name, 1) for a in axes) for d in DIMS)
    plain = Layout(tp=16, pp=9, dp=16, axes=axes, placement=rows, zero=3, recompute="none", lnc=2)
    w = Workload(load_model("llama3-70b"), Training(seq=1024, global_batch=1024))
    return w, t, plain, dataclasses.replace(plain, dp_replicate=4)
