"""solve --format nxd|env: NxD Training YAML keys carry the solved degrees; env lines land every rank."""

from __future__ import annotations

import json
import shutil
import subprocess
import pytest

from trnopt.optimizer.frameworks import export
from trnopt.optimizer.frameworks.launch import node_numbering
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost.evaluate import evaluate
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.placement import rank_map
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

yaml = pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def solved_nxd(tmp_path_factory):
    """One small solve, printed as NxD YAML with the same answer written as JSON."""
    out = tmp_path_factory.mktemp("nxd") / "layout.json"
    args = ["solve", "--target", "trn2", "--model", "llama3-8b", "--instances", "1", "--seq", "2048",
            "--global-batch", "64", "--time-limit", "5", "--format", "nxd", "--json", str(out)]
    return args, out


def test_nxd_output_parses_as_yaml_and_carries_the_solved_degrees(solved_nxd, capsys):
    args, out = solved_nxd
    assert main(args) == 0
    captured = capsys.readouterr()
    cfg = yaml.safe_load(captured.out)
    lay = json.loads(out.read_text())["layout"]
    assert ("NxD Training offers only zero1" in captured.err) is (lay["zero"] > 1)
    ds = cfg["distributed_strategy"]
    assert ds["tensor_model_parallel_size"] == lay["tp"]
    assert ds["pipeline_model_parallel_size"] == lay["pp"]
    assert ds["virtual_pipeline_model_parallel_size"] == lay["interleave"]
    assert ds["zero1"] is (lay["zero"] >= 1)
    assert ds["sequence_parallel"] is (lay["tp"] > 1)
    assert cfg["data"] == {"micro_batch_size": lay["micro_batch"], "global_batch_size": 64}
    assert cfg["trainer"]["lnc"] == lay["lnc"]
    assert cfg["trainer"]["num_nodes"] == 1
    assert cfg["trainer"]["devices"] == 16 * 8 // lay["lnc"]
    assert cfg["model"]["encoder_seq_length"] == 2048
    granularity = {"none": None, "selective": "selective", "full": "full"}[lay["recompute"]]
    assert cfg["model"]["activations_checkpoint_granularity"] == granularity
    assert cfg["exp_manager"]["checkpoint_callback_params"]["every_n_train_steps"] >= 1
    assert set(cfg) == {"trainer", "exp_manager", "distributed_strategy", "data", "model"}


def _layout(target, lnc=2, domains=1, **rows):
    """A layout from explicit placement rows: dim -> {axis name: factor}."""
    axes = target.axes(lnc, domains)
    dims = ("tp", "cp", "ep", "dp", "pp")
    placement = tuple(tuple(rows.get(d, {}).get(a.name, 1) for a in axes) for d in dims)
    deg = {d: 1 for d in dims}
    for d in dims:
        for f in rows.get(d, {}).values():
            deg[d] *= f
    return Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"] * deg["ep"], ep=deg["ep"], zero=1, recompute="selective", lnc=lnc, axes=axes,
                  placement=placement)


def test_nxd_keys_for_moe_cp_interleave_and_zero3():
    target = load_target("trn2u")
    workload = Workload(load_model("mixtral-8x7b"), Training(seq=4096, global_batch=256))
    base = _layout(target, tp={"core": 4}, ep={"x": 4, "y": 2}, dp={"y": 2}, pp={"ring": 4})
    lay = Layout(tp=4, pp=4, dp=16, ep=8, zero=3, recompute="none", interleave=2, lnc=2, axes=base.axes,
                 placement=base.placement)
    assert lay.workload_problems(workload) == []
    e = evaluate(workload, lay, target)
    text = export.nxd_yaml(workload, target, e, 0.10)
    cfg = yaml.safe_load(text)
    ds = cfg["distributed_strategy"]
    assert ds["expert_model_parallel_size"] == 8
    assert ds["virtual_pipeline_model_parallel_size"] == 2
    assert ds["zero1"] is True
    assert cfg["model"]["activations_checkpoint_granularity"] is None
    assert "WARNING: trnopt chose ZeRO-3 but NxD Training offers only zero1" in text
    assert cfg["trainer"] == {"devices": 64, "num_nodes": 4, "lnc": 2}


def test_env_lines_when_torchrun_order_is_the_plan():
    target = load_target("trn2u")
    workload = Workload(load_model("llama3-70b"), Training(seq=4096, global_batch=512))
    lay = _layout(target, domains=2, tp={"core": 4, "x": 2}, dp={"x": 2, "y": 4, "ring": 4, "efa": 2})
    text = export.env_script(workload, target, lay)
    assert "export NEURON_LOGICAL_NC_CONFIG=2\n" in text
    assert "--logical-nc-config=2" in text
    assert "export WORLD_SIZE=512\n" in text
    assert "export TRNOPT_NNODES=8\n" in text and "export TRNOPT_NPROC_PER_NODE=64\n" in text
    assert "export TRNOPT_RANK_REMAP=0" in text and "TRNOPT_RANK_TABLE" not in text
    assert export.torchrun_order_holds(export.rank_table(lay, target, node_numbering(lay, target)))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
def test_env_lines_remap_ranks_when_stages_share_an_instance(tmp_path):
    target = load_target("trn2u")
    workload = Workload(load_model("llama3-8b"), Training(seq=4096, global_batch=256))
    # pipeline stages on the torus y axis: every instance holds ranks of all 4 stages
    lay = _layout(target, tp={"core": 4}, dp={"x": 4, "ring": 4}, pp={"y": 4})
    text = export.env_script(workload, target, lay)
    assert "export TRNOPT_RANK_REMAP=1" in text
    table = export.rank_table(lay, target, node_numbering(lay, target))
    assert not export.torchrun_order_holds(table)
    assert sorted(r for row in table for r in row) == list(range(lay.ranks))
    env_file = tmp_path / "trnopt-env.sh"
    env_file.write_text(text)
    places = {(p.domain * 4 + p.instance, p.chip * 4 + p.core): p.rank for p in rank_map(lay, target)}
    for node, local in [(0, 0), (0, 5), (1, 17), (3, 63), (2, 40)]:
        out = subprocess.run(["bash", "-c", f'GROUP_RANK={node} LOCAL_RANK={local}; source "{env_file}"; '
                              'echo "$RANK $NEURON_LOGICAL_NC_CONFIG $WORLD_SIZE"'],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == [str(places[(node, local)]), "2", "256"]


def test_unknown_format_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["solve", "--format", "yaml"])
    assert "invalid choice" in capsys.readouterr().err
