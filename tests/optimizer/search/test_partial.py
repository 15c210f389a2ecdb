"""Planning on a partial machine (--exclude): the candidate machines, their links, and the search
refereed by brute force over every candidate of small machines."""

import itertools
from dataclasses import replace

import pytest

from trnopt.optimizer.cost.collectives import axis_bandwidth
from trnopt.optimizer.cost.evaluate import objective_value
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.partial import candidates, parse_names, physical
from trnopt.optimizer.model.target import load_target, parse_target
from trnopt.optimizer.model.workload import Training, Workload, parse_model
from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.search.driver import score_layout
from trnopt.optimizer.search.partial import on_candidate, solve_partial
from trnopt.optimizer.search.space import Space

from test_framework_search import _trn2_like


def small_target(kind: str, instances: int = 4) -> object:
    """Instances of 2 one-core chips (a 2-chip torus), ``instances`` of them per domain on a ``kind`` axis."""
    data = _trn2_like()
    data["chip"]["physical_cores"] = 1  # one rank a chip: a brute force of every candidate stays small
    data["axes"] = [data["axes"][0], {"name": "ring", "size": instances, "kind": kind, "bandwidth_gbs": 64,
                                      "latency_us": 1.5}]
    return parse_target(data, "test")


def any_count(name: str):
    """A target as the file gives it, on a runtime that joins any count of instances into a domain."""
    return replace(load_target(name), domain_instances=())


def test_a_trn2_ultraserver_runs_as_4_2_or_1_nodes():
    t = load_target("trn2u")
    assert t.domain_instances == (4, 2, 1)
    whole, pairs = candidates(t, 4, parse_names(t, 4, "d2i3"))
    assert (whole.instances_per_domain, whole.remaining.domains) == (4, (0, 1, 3))
    assert (pairs.instances_per_domain, pairs.remaining.domains) == (2, (0, 1, 2, 3))
    assert (pairs.domain_axes[-1].size, pairs.domain_axes[-1].closed) == (2, False)  # two neighbours: a line


def test_a_ring_with_a_hole_is_a_line_and_a_lost_domain_is_the_other_candidate():
    t = any_count("trn2u")
    names = parse_names(t, 4, "d2i3")
    whole, line = candidates(t, 4, names)
    assert (whole.instances_per_domain, whole.remaining.domains) == (4, (0, 1, 3))
    assert whole.domain_axes[-1].closed and whole.domain_axes[-1].size == 4
    assert (line.instances_per_domain, line.remaining.domains) == (3, (0, 1, 2, 3))
    ring = line.domain_axes[-1]
    assert (ring.size, ring.kind, ring.closed) == (3, "ring", False)
    # domain 2 keeps its three healthy instances, the others their first three
    assert line.remaining.instances == ((0, 1, 2),) * 4
    # the whole ring of 3 left gets a line's bandwidth: half the closed ring's
    assert axis_bandwidth(ring, 3) == axis_bandwidth(t.domain_axes[-1], 4) / 2
    assert axis_bandwidth(ring, 3) == axis_bandwidth(t.domain_axes[-1], 3)


def test_the_run_wraps_round_the_ring_and_a_chip_takes_its_instance_out():
    t = any_count("trn2u")
    cands = candidates(t, 2, parse_names(t, 2, "d0i1c5"))
    line = next(c for c in cands if c.instances_per_domain == 3)
    assert line.remaining.instances[0] == (2, 3, 0)  # instances 2, 3, 0 are neighbours on the ring
    assert physical(line, 0, 2) == (0, 0)
    # two holes opposite each other leave runs of one on domain 0
    cands = candidates(t, 2, parse_names(t, 2, "d0i0,d0i2"))
    assert [(c.instances_per_domain, c.remaining.domains) for c in cands] == [(4, (1,)), (1, (0, 1))]


def test_a_switch_keeps_any_healthy_instances():
    t = load_target("trn3-gen1")
    cands = candidates(t, 2, parse_names(t, 2, "d1i0,d1i2"))
    assert [(c.instances_per_domain, c.remaining.domains) for c in cands] == [(4, (0,)), (2, (0, 1))]
    assert cands[1].domain_axes[-1].size == 32 and cands[1].domain_axes[-1].closed
    assert cands[1].remaining.instances[1] == (1, 3)


@pytest.mark.parametrize("text, rule", [
    ("d4i0", "no domain 4"), ("d0i4", "no instance 4"), ("d0i0c16", "no chip 16"), ("d0i1,d0i1", "named twice"),
    ("us0/i1", "is not d<domain>i<instance>"), ("d0i1,d0i1c3", "excluded whole"),
    ("d0i0,d0i1,d0i2,d0i3,d1i0,d1i1,d1i2,d1i3", "leave no healthy instance"),
])
def test_bad_names_name_the_flag_and_the_rule(text, rule):
    t = load_target("trn2u")
    with pytest.raises(InputError) as exc:
        candidates(t, 2, parse_names(t, 2, text))
    assert exc.value.source == "--exclude" and rule in str(exc.value)


def _problem(target, domains, moe, objective):
    model = {"name": "tiny", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 1024, "vocab": 1000}
    if moe:
        model["moe"] = {"experts": 4, "top_k": 1, "expert_ffn": 512}
    return Problem(Workload(parse_model(model, "test"), Training(seq=2048, global_batch=12)), target, domains,
                   headroom=0.1, objective=objective, instance_blocks=True)


CASES = [(kind, names, *model) for kind, names, model in itertools.product(
    ["ring", "switch"], ["d1i2", "d0i0c1", "d0i1,d1i3", "d1i0,d1i1,d1i2,d1i3"],
    [(False, "step-time"), (True, "goodput")])]


@pytest.mark.parametrize("kind, names, moe, objective", CASES)
def test_search_on_a_partial_machine_equals_brute_force_over_every_candidate(kind, names, moe, objective):
    target = small_target(kind)
    problem = _problem(target, 2, moe, objective)
    cands = candidates(target, 2, parse_names(target, 2, names))
    forced = {c: brute_force(on_candidate(problem, c)).best for c in cands}
    reference = [(objective_value(e, objective), c, e) for c, e in forced.items() if e is not None]
    result, answers = solve_partial(problem, cands, time_limit=60, workers=1)
    assert result.status == "OPTIMAL"
    expected, ref_target, ref = min(reference, key=lambda x: x[0])
    got = objective_value(result.best, objective)
    sub = result.problem
    _, rounding = score_layout(Space(sub, result.best.layout.lnc), result.best.layout)
    _, ref_rounding = score_layout(Space(on_candidate(problem, ref_target), ref.layout.lnc), ref.layout)
    assert expected * (1 - 1e-12) <= got <= expected + rounding + ref_rounding, (
        result.best.layout.describe(), ref.layout.describe())
    # a candidate is infeasible exactly when brute force finds nothing on it
    for a in answers:
        assert (a.score is None) == (forced[a.target] is None)
    assert result.best.layout.ranks == sub.target.ranks(result.best.layout.lnc, sub.domains)



def test_where_instances_are_not_blocks_of_the_slowest_axis_only_whole_domains_go():
    t = replace(load_target("trn2"), chips_per_instance=2)  # 8 instances of 2 chips across both torus axes
    whole = ",".join(f"d1i{i}" for i in range(8))
    assert [(c.instances_per_domain, c.remaining.domains, c.domain_axes) for c in candidates(t, 2, parse_names(
        t, 2, whole))] == [(8, (0,), t.domain_axes)]
    with pytest.raises(InputError, match="only whole domains can be excluded"):
        candidates(t, 2, parse_names(t, 2, "d1i3"))
