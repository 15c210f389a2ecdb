"""A layout file of a partial machine (--exclude) records the exclusion; every reader rebuilds the same machine."""

import json

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.layoutfile import layout_dict, partial_dict, problem_dict, read_layout
from trnopt.optimizer.model.partial import candidates, parse_names
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def partial_file(tmp_path, **change) -> tuple[str, object, Layout]:
    whole = load_target("trn2u")
    target = next(c for c in candidates(whole, 2, parse_names(whole, 2, "d1i1,d1i2,d0i3c7"))
                  if c.instances_per_domain == 2)
    axes = target.axes(2, len(target.remaining.domains))
    layout = Layout(tp=4, pp=2, dp=32, lnc=2, axes=axes, zero=3,
                    placement=default_placement(axes, {"tp": 4, "cp": 1, "ep": 1, "dp": 32, "pp": 2}))
    workload = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=64))
    problem = {**problem_dict("trn2u", "llama3-8b", workload, 2), **partial_dict(target), **change}
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"problem": problem, "layout": layout_dict(layout)}))
    return str(path), target, layout


def test_the_partial_machine_reads_back_the_same(tmp_path):
    path, target, layout = partial_file(tmp_path)
    problem = json.loads(open(path).read())["problem"]
    assert (problem["domains"], problem["exclude"], problem["instances_per_domain"]) == (
        2, ["d0i3c7", "d1i1", "d1i2"], 2)
    read, _, back = read_layout(path)
    assert read == target and back == layout
    # domain 1 keeps the pair 3, 0: neighbours round the ring
    assert not read.domain_axes[-1].closed and read.remaining.instances == ((0, 1), (3, 0))


@pytest.mark.parametrize("change, key, rule", [
    ({"exclude": ["d1i9"]}, "problem.exclude", "no instance 9"),
    ({"exclude": "d1i2"}, "problem.exclude", "non-empty list"),
    ({"exclude": ["d1i2", "d1i2"]}, "problem.exclude", "named twice"),
    ({"instances_per_domain": 3}, "problem.instances_per_domain", "leaves no plan of 3 instance(s)"),
    ({"instances_per_domain": 5}, "problem.instances_per_domain", "must be <= 4"),
])
def test_a_broken_record_names_the_key(tmp_path, change, key, rule):
    path, _, _ = partial_file(tmp_path, **change)
    with pytest.raises(InputError) as err:
        read_layout(path)
    assert err.value.source == path and err.value.key == key and rule in str(err.value), str(err.value)
