"""Launch files: they parse, the scripts run, and the rank map they imply passes check-map (a wrong order fails)."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from trnopt.optimizer.commands import checkmap
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import launch as L
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import build, deepseek_trn3_gen2, llama8b_trn2, llama405b_trn2u_x2

yaml = pytest.importorskip("yaml")
BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash not installed")

SHAPES = {
    "llama3-405b": (llama405b_trn2u_x2, Training(seq=8192, global_batch=1024)),
    "deepseek-v3": (deepseek_trn3_gen2, Training(seq=4096, global_batch=1024)),
    "llama3-8b": (llama8b_trn2, Training(seq=8192, global_batch=256)),
}


def _launch(model: str, scheduler: str = "torchrun") -> L.Launch:
    shape, training = SHAPES[model]
    target, lay = shape()
    return L.plan(Workload(load_model(model), training), target, lay, scheduler, "python -m torchtitan.train",
                  "layout.json")


def _write(files: dict[str, str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
        if name.endswith((".sh", ".sbatch")):
            (out / name).chmod(0o755)
    return out


def _check(launch: L.Launch, text: str, tmp_path: Path) -> list[checkmap.Finding]:
    path = tmp_path / "map.csv"
    path.write_text(text)
    return checkmap.check(launch.layout, launch.target, checkmap.read_rank_map(str(path)))


@pytest.mark.parametrize("scheduler", L.SCHEDULERS)
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_files_parse_and_state_their_assumptions(model, scheduler):
    launch = _launch(model, scheduler)
    files = L.launch_files(launch)
    lay = launch.layout
    assert {"env.sh", "worker.sh", "run-node.sh", "nodes.csv", "ranks.csv", "expected-rank-map.csv", "job.toml",
            "README.txt"} <= set(files)
    env = files["env.sh"]
    assert f"export NEURON_LOGICAL_NC_CONFIG={lay.lnc}" in env and f"--logical-nc-config={lay.lnc}" in env
    assert "export FI_PROVIDER=efa" in env and "export FI_EFA_USE_DEVICE_RDMA=1" in env
    assert "FI_EFA_FORK_SAFE=1" in env and '"amzn:2"' in env  # Amazon Linux 2 only
    assert "not documented explicitly" in files["worker.sh"] and "not documented explicitly" in files["README.txt"]
    tomllib.loads(files["job.toml"])
    rows = list(csv.DictReader(io.StringIO(files["ranks.csv"])))
    assert len(rows) == lay.ranks and sorted(int(r["rank"]) for r in rows) == list(range(lay.ranks))
    if BASH:
        for name, text in files.items():
            if name.endswith((".sh", ".sbatch")):
                r = subprocess.run([BASH, "-n"], input=text, capture_output=True, text=True)
                assert r.returncode == 0, (name, r.stderr)
    if scheduler == "k8s":
        spec = yaml.safe_load(files["jobset.yaml"])["spec"]
        assert len(spec["replicatedJobs"]) == launch.nodes and spec["failurePolicy"]["maxRestarts"] >= 1
        pod = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        key = f"neuron.amazonaws.com/ultraserver-server-id-{launch.target.instances_per_domain}"
        if launch.ultraserver:
            assert pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
                "topologyKey"] == key
    if scheduler == "slurm":
        sbatch = files["job.sbatch"]
        assert f"#SBATCH --nodes={launch.nodes}" in sbatch and "#SBATCH --requeue" in sbatch
        assert (f"#SBATCH --segment={launch.target.instances_per_domain}" in sbatch) is launch.ultraserver


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_check_map_passes_on_the_rank_map_the_launch_implies(model, tmp_path):
    launch = _launch(model)
    assert _check(launch, L.launch_files(launch)["expected-rank-map.csv"], tmp_path) == []


def test_a_wrong_node_order_fails_check_map(tmp_path):
    launch = _launch("llama3-405b")
    # node ranks handed out alternating between the two UltraServers instead of as nodes.csv says
    wrong = {n: (n % 2, n // 2) for n in range(launch.nodes)}
    findings = _check(launch, L.implied_rank_map(launch, wrong), tmp_path)
    assert findings and {f.kind for f in findings} == {"outside-instance"}


def test_a_launch_without_the_core_binding_fails_check_map(tmp_path):
    launch = _launch("llama3-8b")
    assert launch.binding.bound
    per_chip = launch.layout.ranks_per_chip
    rows = ((r, "node0", r // per_chip, r % per_chip, 2) for r in range(launch.layout.ranks))  # torchrun's default
    kinds = {f.kind for f in _check(launch, L._csv(("rank", "instance", "chip", "core", "lnc"), rows), tmp_path)}
    assert kinds == {"tp-off-plan"}


def test_a_layout_torchrun_cannot_produce_is_refused():
    target, _ = llama405b_trn2u_x2()
    lay = build(target, 2, {"tp": {"ring": 4}, "dp": {"core": 4, "x": 4, "y": 4, "efa": 2}}, recompute="full")
    workload = Workload(load_model("llama3-405b"), Training(seq=8192, global_batch=1024))
    with pytest.raises(InputError, match="consecutive ranks") as err:
        L.plan(workload, target, lay, "slurm", "python -m torchtitan.train", "layout.json")
    assert err.value.source == "layout.json"


@needs_bash
def test_workers_bind_their_cores_and_record_the_planned_map(tmp_path):
    launch = _launch("llama3-8b")
    out = _write(L.launch_files(launch), tmp_path / "launch")
    env = {"PATH": os.environ["PATH"], "GROUP_RANK": "0", "TRNOPT_RANK_MAP_DIR": str(tmp_path / "map"),
           "TRNOPT_INSTANCE": "i-0abc"}
    for local in range(launch.nproc):
        r = subprocess.run([str(out / "worker.sh"), "sh", "-c", "echo $NEURON_RT_VISIBLE_CORES"],
                           env=env | {"LOCAL_RANK": str(local), "RANK": str(local)}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) == launch.binding.local_core[local]
    rows = "".join((tmp_path / "map" / f"rank-{r}.csv").read_text() for r in range(launch.nproc))
    assert _check(launch, "rank,instance,chip,core,ultraserver,lnc\n" + rows, tmp_path) == []


@needs_bash
def test_node_rank_script_follows_nodes_csv_and_refuses_a_partial_ultraserver(tmp_path):
    launch = _launch("llama3-405b", "slurm")
    out = _write(L.launch_files(launch), tmp_path / "launch")
    hosts = [f"ip-{i}" for i in range(8)]
    # two UltraServers, hosts listed in no particular order; node ids are the ring positions
    topo = {h: ("us-b", (1, 3, 0, 2)[i // 2]) if i % 2 else ("us-a", (2, 0, 3, 1)[i // 2]) for i, h in enumerate(hosts)}
    (tmp_path / "hosts").write_text("\n".join(hosts) + "\n")
    (tmp_path / "topo").write_text("# host ultraserver node\n" + "".join(f"{h} {u} {p}\n" for h, (u, p) in topo.items()))
    planned = {(int(r["ultraserver"]), int(r["position"])): int(r["node_rank"])
               for r in csv.DictReader(io.StringIO((out / "nodes.csv").read_text()))}
    masters = set()
    for h, (u, p) in topo.items():
        r = subprocess.run([BASH, str(out / "node-rank.sh"), str(tmp_path / "hosts"), str(tmp_path / "topo"), h],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rank, master, us, topo0 = r.stdout.split()
        assert int(rank) == planned[({"us-a": 0, "us-b": 1}[u], p)] and us == u
        assert topo[topo0] == ("us-a", 0)  # NEURON_GLOBAL_TOPOID0_HOST: UltraServer 0 of the job, node id 0
        masters.add(master)
    assert len(masters) == 1 and topo[masters.pop()] == ("us-a", 0)
    (tmp_path / "hosts").write_text("\n".join(hosts[:7]) + "\n")  # us-b has only 3 of its 4 instances
    r = subprocess.run([BASH, str(out / "node-rank.sh"), str(tmp_path / "hosts"), str(tmp_path / "topo"), hosts[0]],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "UltraServer us-b is scheduled partially: 3 of 4" in r.stderr
    (tmp_path / "topo").write_text("".join(f"{h} {u} 0\n" for h, (u, p) in topo.items()))  # two node 0s
    (tmp_path / "hosts").write_text("\n".join(hosts) + "\n")
    r = subprocess.run([BASH, str(out / "node-rank.sh"), str(tmp_path / "hosts"), str(tmp_path / "topo"), hosts[0]],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "are both UltraServer" in r.stderr


@needs_bash
def test_run_node_starts_torchrun_with_the_static_rendezvous(tmp_path):
    launch = _launch("llama3-405b")
    out = _write(L.launch_files(launch), tmp_path / "launch")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text("#!/bin/sh\necho \"$@\"\n")
    (fake / "torchrun").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "MASTER_ADDR": "head",
           "NEURON_RT_ULTRASERVER_SERVER_ID": "00000000000000a1"}  # no /sys/class/neuron_device here
    r = subprocess.run([str(out / "run-node.sh"), "5"], env=env | {"NEURON_RT_ULTRASERVER_NODE_ID": "1"},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    args = r.stdout.split()
    assert "--node-rank=5" in args and "--nnodes=8" in args and "--nproc-per-node=64" in args
    assert "--master-addr=head" in args and "--no-python" in args and args[-2:] == ["--job.config_file",
                                                                                    f"{out}/job.toml"]
    # node rank 5 is UltraServer 1 position 1: an instance that knows it is node 2 refuses it
    r = subprocess.run([str(out / "run-node.sh"), "5"], env=env | {"NEURON_RT_ULTRASERVER_NODE_ID": "2"},
                       capture_output=True, text=True)
    assert r.returncode == 1 and "planned at UltraServer position 1" in r.stderr


def test_a_jobset_kubernetes_cannot_store_is_refused_before_any_file_is_built():
    # 256 UltraServers = 1,024 node ranks: one replicated job each passes etcd's 1.5 MiB object limit
    target = load_target("trn2u")
    lay = build(target, 256, {"tp": {"core": 4, "x": 2}, "dp": {"x": 2, "y": 4, "ring": 4, "efa": 256}},
                recompute="full")  # TP8: torchtitan shards the 8 KV heads, it cannot replicate them
    w = Workload(load_model("llama3-405b"), Training(seq=8192, global_batch=8192))
    with pytest.raises(InputError, match="1.5 MiB a Kubernetes object may hold"):
        L.plan(w, target, lay, "k8s", "python -m torchtitan.train", "layout.json")
    assert L.plan(w, target, lay, "slurm", "python -m torchtitan.train", "layout.json").nodes == 1024
