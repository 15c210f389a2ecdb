"""The search scores each interleave depth with that depth's default schedule (1F1B, Interleaved1F1B);
that is its choice of schedule. These tests are the referee that the choice is the best one each
framework runs: at every depth, every other schedule the framework accepts costs at least as much
time and memory, on the one cost model, over pipeline depths and micro-batch counts."""

from dataclasses import replace

import pytest

from trnopt.optimizer.cost.memory import memory_per_chip
from trnopt.optimizer.cost.steptime import step_time
from trnopt.optimizer.frameworks.profile import PROFILES
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.schedules import default_schedule, schedule_problem
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def layouts():
    """llama3-8b on 32 trn1 nodes at PP 2, 4 and 8, with 4 to 128 micro-batches a step."""
    t = load_target("trn1")
    axes = t.axes(1, 32 // t.instances_per_domain)
    for pp in (2, 4, 8):
        dp = 1024 // (8 * pp)
        for batch in (4 * dp, 32 * dp, 128 * dp):
            w = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=batch))
            yield t, w, Layout(tp=8, pp=pp, dp=dp, axes=axes, lnc=1, zero=1, recompute="full",
                               placement=default_placement(axes, {"tp": 8, "dp": dp, "pp": pp}))


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("interleave", [1, 2, 4])
def test_the_default_schedule_of_each_depth_is_the_best_the_framework_runs(name, interleave):
    profile = PROFILES[name]
    chosen = default_schedule(interleave)
    if interleave > 1 and not profile.interleaved:
        pytest.skip(f"{name} runs no interleaved stages")
    assert chosen in profile.schedules
    others = [s for s in profile.schedules if s != chosen and schedule_problem(s, interleave) is None]
    for t, w, lay in layouts():
        base = replace(lay, interleave=interleave)
        time, memory = step_time(w, base, t).total, memory_per_chip(w, base, t).total
        for other in others:
            alt = replace(base, schedule=other)
            assert step_time(w, alt, t).total >= time * (1 - 1e-12), (other, lay.describe())
            assert memory_per_chip(w, alt, t).total >= memory * (1 - 1e-12), (other, lay.describe())


def test_a_framework_offering_zero_bubble_would_need_the_search_to_choose():
    """Where the zero-bubble schedules run (not under torch.compile), ZBVZeroBubble beats the depth's
    default: the referee above would fail for such a profile, so the search would have to choose."""
    for t, w, lay in layouts():
        base = replace(lay, interleave=2)
        assert step_time(w, replace(base, schedule="ZBVZeroBubble"), t).total < step_time(w, base, t).total
