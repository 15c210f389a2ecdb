"""trnopt launch end to end: writes the files, never overwrites, and check-map passes on the map they imply."""

from __future__ import annotations

import json
import os

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def _layout_file(tmp_path, rows, name="layout.json"):
    """A layout on two trn2u (HSDP, 2 replicas): llama3-70b, which fits the HBM (check-map reads only such)."""
    target = load_target("trn2u")
    axes = target.axes(2, 2)
    placement = tuple(tuple(rows.get(d, {}).get(a.name, 1) for a in axes) for d in DIMS)
    tp = 1
    for f in rows["tp"].values():
        tp *= f
    lay = Layout(tp=tp, pp=1, dp=512 // tp, axes=axes, placement=placement, zero=3, recompute="full",
                 dp_replicate=2)
    workload = Workload(load_model("llama3-70b"), Training(seq=8192, global_batch=1024))
    path = tmp_path / name
    path.write_text(json.dumps({"problem": problem_dict("trn2u", "llama3-70b", workload, 2),
                                "layout": layout_dict(lay)}))
    return path


def test_launch_writes_the_files_and_refuses_to_overwrite(tmp_path, capsys):
    layout = _layout_file(tmp_path, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4, "ring": 4, "efa": 2}})
    out = tmp_path / "run"
    assert main(["launch", "--layout", str(layout), "--scheduler", "slurm", "--out", str(out)]) == 0
    assert "no binding needed" in capsys.readouterr().out
    names = set(os.listdir(out))
    assert {"job.sbatch", "node-rank.sh", "run-node.sh", "worker.sh", "env.sh", "job.toml",
            "expected-rank-map.csv", "README.txt"} <= names
    assert os.access(out / "run-node.sh", os.X_OK) and os.access(out / "job.sbatch", os.X_OK)
    # the rank map the launch implies passes check-map
    assert main(["check-map", "--layout", str(layout), "--rank-map", str(out / "expected-rank-map.csv")]) == 0
    capsys.readouterr()
    # never overwrite: a non-empty --out needs --force; a file in the way is refused
    (out / "env.sh").write_text("mine")
    assert main(["launch", "--layout", str(layout), "--scheduler", "k8s", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and (out / "env.sh").read_text() == "mine"
    assert main(["launch", "--layout", str(layout), "--scheduler", "k8s", "--out", str(out), "--force"]) == 0
    assert (out / "jobset.yaml").exists() and (out / "env.sh").read_text() != "mine"
    assert main(["launch", "--layout", str(layout), "--scheduler", "torchrun", "--out", str(layout)]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["launch", "--layout", str(layout), "--scheduler", "torchrun", "--out", str(empty)]) == 0


def test_launch_refuses_a_placement_torchrun_cannot_produce(tmp_path, capsys):
    layout = _layout_file(tmp_path, {"tp": {"ring": 4}, "dp": {"core": 4, "x": 4, "y": 4, "efa": 2}})
    out = tmp_path / "run"
    assert main(["launch", "--layout", str(layout), "--scheduler", "torchrun", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no node order or core binding places it" in err
    assert not out.exists()
