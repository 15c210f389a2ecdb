"""Layout files are read strictly and checked against their machine, model and batch."""

import json

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import DIMS, Layout, default_placement
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict, read_layout
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def layout_json(global_batch: int = 64) -> dict:
    target = load_target("trn2")
    axes = target.axes(2, 1)
    deg = {"tp": 4, "cp": 1, "ep": 1, "dp": 16, "pp": 1}
    layout = Layout(tp=4, pp=1, dp=16, lnc=2, axes=axes, placement=default_placement(axes, deg), zero=3)
    workload = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=global_batch))
    return {"problem": problem_dict("trn2", "llama3-8b", workload, 1), "layout": layout_dict(layout)}


def rule(tmp_path, data) -> InputError:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    with pytest.raises(InputError) as err:
        read_layout(str(path))
    assert err.value.source == str(path) and str(err.value).isprintable()
    return err.value


def test_the_written_layout_reads_back(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout_json()))
    target, workload, layout = read_layout(str(path))
    assert (layout.tp, layout.dp, layout.zero, workload.training.global_batch) == (4, 16, 3, 64)


@pytest.mark.parametrize("value", [4.9, "4", True, None, -4, 0, 10**30])
def test_integers_are_json_integers_in_range(tmp_path, value):
    data = layout_json()
    data["layout"]["tp"] = value
    assert rule(tmp_path, data).key == "layout.tp"


def test_unknown_keys_are_named_with_the_closest(tmp_path):
    data = layout_json()
    data["layout"]["placement"]["tp"]["cores"] = 4
    err = rule(tmp_path, data)
    assert err.key == "layout.placement.tp.cores" and "did you mean 'core'" in err.rule
    data = layout_json()
    data["layout"]["placement"]["tq"] = {}
    assert rule(tmp_path, data).key == "layout.placement.tq"


def test_negative_placement_factor(tmp_path):
    data = layout_json()
    data["layout"]["placement"]["dp"]["x"] = -4
    assert rule(tmp_path, data).key == "layout.placement.dp.x"


def test_layout_must_run_its_model_and_batch(tmp_path):
    data = layout_json()
    data["layout"].update(tp=64, dp=1)
    data["layout"]["placement"] = {"tp": {"core": 4, "x": 4, "y": 4}}
    assert "32 attention heads" in rule(tmp_path, data).rule
    assert "global batch 1000" in rule(tmp_path, layout_json(global_batch=1000)).rule


def test_missing_model_names_the_key_and_the_model(tmp_path):
    data = layout_json()
    data["problem"]["model"] = "gone.toml"
    err = rule(tmp_path, data)
    assert err.key == "problem.model" and "gone.toml" in err.rule and "file not found" in err.rule


@pytest.mark.parametrize("text,key", [('{"problem": 5, "layout": {}}', "problem"), ("[]", "layout"),
                                      ('{"layout": {"tp": Infinity}}', "-")])
def test_malformed_documents(tmp_path, text, key):
    assert rule(tmp_path, text).key == key


def test_directory_is_not_a_layout(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        read_layout(str(tmp_path))


def test_lnc_zero_and_three_are_refused(tmp_path):
    for lnc in (0, 3):
        data = layout_json()
        data["layout"]["lnc"] = lnc
        assert rule(tmp_path, data).key == "layout.lnc"


def test_every_dimension_key_is_known():
    assert set(layout_json()["layout"]["placement"]) == set(DIMS)
