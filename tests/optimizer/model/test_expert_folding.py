"""Expert parallelism folded over TP (expert TP 1): the layouts that ran are expressible, the
rank map's EP groups are the ones the cost model times, and the framework rules hold."""

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks.profile import NXD, TORCHTITAN
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.placement import expert_groups, rank_map
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def layout(gpus, tp, pp, dp, ep, etp=None, cp=1, target="h100"):
    t = load_target(target)
    axes = t.axes(1, gpus // t.chips_per_domain)
    fold = tp // (etp or tp)
    ep_dp = max(1, ep // fold)
    if dp % ep_dp:  # a layout the rules refuse: tile the axes anyway, so that Layout's own rule speaks
        ep_dp = 1
    return Layout(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, cp=cp, axes=axes, lnc=1, zero=1,
                  placement=default_placement(axes, {"tp": tp, "cp": cp, "ep": ep_dp, "dp": dp // ep_dp, "pp": pp}))


def test_deepseek_tp2_ep64_with_expert_tp_1_is_expressible():
    # the layout the old rule refused: EP 64 over TP 2 x DP 32 on 1,024 GPUs
    lay = layout(1024, tp=2, pp=16, dp=32, ep=64, etp=1)
    assert (lay.ep_fold, lay.ep_dp, lay.edp, lay.expert_tp) == (2, 32, 1, 1)
    assert sum(n for _, n in lay.ep_span()) and lay.placement_degree("ep") == 32
    assert "expert TP 1" in lay.describe()
    with pytest.raises(InputError, match="divisor of data parallelism 32"):
        layout(1024, tp=2, pp=16, dp=32, ep=64)  # experts TP-split: EP must come out of DP


@pytest.mark.parametrize("kwargs, rule", [
    (dict(tp=4, pp=16, dp=32, ep=64, etp=2), "expert TP must be 1 or tp=4"),
    (dict(tp=8, pp=16, dp=16, ep=4, etp=1), "multiple of tp=8"),
    (dict(tp=2, pp=16, dp=8, ep=64, etp=1), "ep / tp = 32 must divide data parallelism 8"),
])
def test_fold_rules(kwargs, rule):
    gpus = kwargs["tp"] * kwargs["pp"] * kwargs["dp"]
    with pytest.raises(InputError, match=rule):
        layout(gpus, **kwargs)


def test_fold_with_context_parallelism_is_refused():
    with pytest.raises(InputError, match="cp > 1"):
        layout(1024, tp=2, pp=8, dp=32, ep=64, etp=1, cp=2)


def test_expert_groups_of_the_rank_map_span_the_ep_span():
    lay = layout(128, tp=2, pp=2, dp=32, ep=16, etp=1)
    t = load_target("h100")
    places = rank_map(lay, t)
    found = expert_groups(lay, places)
    assert len(found) == lay.ranks // lay.ep and all(len(g) == lay.ep for g in found)
    span = dict((a.name, n) for a, n in lay.ep_span())
    for g in found:
        # the group's ranks cover exactly the span's positions on each axis it spans
        nodes = {p.domain for p in g}
        assert len(nodes) == span.get("infiniband", 1)
        assert len(g) // len(nodes) == span.get("nvswitch", 1)
        # a group holds every tp coordinate: the TP ranks hold different experts
        assert {p.coords["tp"] for p in g} == {0, 1}
    # experts-TP = TP keeps one tp coordinate per group
    plain = layout(128, tp=2, pp=2, dp=32, ep=16)
    assert all(len({p.coords["tp"] for p in g}) == 1 for g in expert_groups(plain, rank_map(plain, t)))


def test_framework_rules_on_the_fold():
    w = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    lay = layout(1024, tp=2, pp=16, dp=32, ep=64, etp=1)
    assert not [k for k, _ in lay.workload_problems(w, TORCHTITAN.rules) if k == "etp"]
    assert ("etp" in [k for k, _ in lay.workload_problems(w, NXD.rules)])


@pytest.mark.parametrize("name, total_b, active_b", [
    ("deepseek-v3", 671, 37), ("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141, 39)])
def test_moe_presets_match_their_published_counts(name, total_b, active_b):
    """DeepSeek-V3 report (671B total, 37B active), Mixtral paper Table 1 (46.7B / 12.9B),
    Mistral's 8x22B release (141B / 39B). DeepSeek's 37B leaves out part of what a token
    touches (the count here has the embedding and the output layer: 37.55B), hence 2%."""
    m = load_model(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params() / 1e9 == pytest.approx(active_b, rel=0.02)


def test_a_folded_layout_file_reads_back(tmp_path):
    import json

    from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict, read_layout
    lay = layout(1024, tp=2, pp=16, dp=32, ep=64, etp=1, target="h800")
    w = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"problem": problem_dict("h800", "deepseek-v3", w, lay.domains),
                                "layout": layout_dict(lay)}))
    _, _, back = read_layout(str(path))
    assert back == lay
    plain = dict(layout_dict(lay))
    del plain["etp"]  # the same degrees with experts TP-split: EP 64 is then not carved out of DP 32
    path.write_text(json.dumps({"problem": problem_dict("h800", "deepseek-v3", w, lay.domains), "layout": plain}))
    with pytest.raises(InputError, match="layout.ep"):
        read_layout(str(path))


def test_describe_names_the_lnc_only_on_neuron_targets():
    # LNC is a Neuron runtime setting: a GPU layout that printed "LNC=1" would name a knob it lacks
    gpu = layout(64, tp=8, pp=1, dp=8, ep=1)
    assert "LNC" not in gpu.describe(), gpu.describe()
    trn = load_target("trn2")
    axes = trn.axes(2, 1)
    lay = Layout(tp=4, pp=1, dp=16, axes=axes, lnc=2, zero=1,
                 placement=default_placement(axes, {"tp": 4, "cp": 1, "ep": 1, "dp": 16, "pp": 1}))
    assert lay.describe().endswith("LNC=2)"), lay.describe()
