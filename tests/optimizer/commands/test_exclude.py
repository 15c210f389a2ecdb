"""`solve --exclude` end to end: the answer on what is left, its rank map, map, check-map, the layout
file and the launch files, and bad names refused."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.layoutfile import read_layout

TARGETS = Path(__file__).resolve().parents[3] / "targets" / "machines"
SOLVE = ["solve", "--target", "trn2u", "--model", "llama3-8b", "--ultraservers", "2", "--top", "0"]


@pytest.fixture(scope="module", params=["trn2u", "any-count"])
def solved(request, tmp_path_factory):
    """One solve with instance 2 of UltraServer 1 excluded: its JSON, rank map and launch files; on trn2u,
    and on trn2u with a runtime that joins any count of instances (its plan keeps lines of 3 round the hole)."""
    out = tmp_path_factory.mktemp("exclude")
    target = "trn2u"
    if request.param == "any-count":
        target = str(out / "any.toml")
        text = open(TARGETS / "trn2u.toml").read()
        open(target, "w").write("\n".join(line for line in text.splitlines() if not line.startswith("domain_instances")
                                          and "a partial plan keeps these" not in line))
    solve = [*SOLVE[:2], target, *SOLVE[3:]]
    assert main([*solve, "--exclude", "d1i2", "--json", str(out / "l.json"), "--rank-map", str(out / "m.csv")]) == 0
    assert main(["launch", "--layout", str(out / "l.json"), "--scheduler", "torchrun", "--out", str(out / "L")]) == 0
    return out


def test_the_answer_is_proven_on_what_is_left_and_the_file_records_the_exclusion(solved):
    data = json.loads((solved / "l.json").read_text())
    assert data["problem"]["exclude"] == ["d1i2"] and data["problem"]["domains"] == 2
    assert data["status"] == "OPTIMAL"
    target, workload, layout = read_layout(str(solved / "l.json"))
    assert target.remaining.excluded == ("d1i2",) and target.instances_per_domain == data["problem"][
        "instances_per_domain"]
    # the reader rebuilds the same machine: the layout scores as the solve said
    step = Problem(workload, target, layout.domains).evaluate(layout).step.total
    assert step == pytest.approx(data["step_time_s"])


def _kept(target) -> set[tuple[int, int]]:
    """The whole machine's (domain, instance) of every instance the plan runs on."""
    rem = target.remaining
    return {(d, i) for d, row in zip(rem.domains, rem.instances) for i in row}


def test_the_rank_map_has_ranks_only_on_the_chips_left_and_check_map_accepts_it(solved, capsys):
    rows = list(csv.DictReader(io.StringIO((solved / "m.csv").read_text())))
    target, _, layout = read_layout(str(solved / "l.json"))
    assert {r["instance"] for r in rows} == {f"d{d}i{i}" for d, i in _kept(target)} and (1, 2) not in _kept(target)
    assert len(rows) == layout.ranks == len(_kept(target)) * 16 * layout.ranks_per_chip
    capsys.readouterr()
    assert main(["check-map", "--layout", str(solved / "l.json"), "--rank-map", str(solved / "m.csv")]) == 0
    assert "OK" in capsys.readouterr().out
    # the launch's expected map puts ranks on the same instances, and check-map accepts it too
    expected = list(csv.DictReader(io.StringIO((solved / "L" / "expected-rank-map.csv").read_text())))
    assert {r["instance"] for r in expected} == {f"us{d}-node{i}" for d, i in _kept(target)}
    assert main(["check-map", "--layout", str(solved / "l.json"), "--rank-map",
                 str(solved / "L" / "expected-rank-map.csv")]) == 0
    nodes = csv.DictReader(io.StringIO((solved / "L" / "nodes.csv").read_text()))
    assert {(int(r["ultraserver"]), int(r["position"])) for r in nodes} == _kept(target)


def test_map_draws_the_whole_machines_instances_around_the_hole(solved, capsys):
    target, _, _ = read_layout(str(solved / "l.json"))
    capsys.readouterr()
    assert main(["map", "--layout", str(solved / "l.json")]) == 0
    text = capsys.readouterr().out
    assert "excluded d1i2" in text
    drawn, domain = set(), None
    for line in text.splitlines():
        if line.startswith("domain "):
            domain = int(line.split()[1])
        elif line.startswith("  instance "):
            drawn.add((domain, int(line.split()[1].rstrip(":"))))
    assert drawn == _kept(target)


def test_a_lost_instance_is_planned_as_the_runtime_joins_instances(solved):
    """Neuron joins 4, 2 or 1 instances into an UltraServer (3 whole ones, or pairs of neighbours);
    a runtime that joins any count keeps the lines of 3 round the hole, the ring's positions 3, 0, 1."""
    target, _, _ = read_layout(str(solved / "l.json"))
    if target.domain_instances:
        assert target.instances_per_domain == 4 or all(abs(a - b) in (1, 3) for a, b in target.remaining.instances)
    else:
        assert target.remaining.instances == ((0, 1, 2), (3, 0, 1)) and not target.domain_axes[-1].closed


def test_exports_run_on_what_is_left(solved, capsys):
    assert main([*SOLVE, "--exclude", "d0i0c3", "--format", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "64 chips" in out  # one whole UltraServer or two pairs: the chip's instance is out
    # --format env numbers the nodes as the launch's nodes.csv does: the whole machine's positions
    target = json.loads((solved / "l.json").read_text())["problem"]["target"]
    assert main([*SOLVE[:2], target, *SOLVE[3:], "--exclude", "d1i2", "--format", "env"]) == 0
    env = capsys.readouterr().out
    table = env[env.index("TRNOPT_NODE_TABLE='") + 19:].split("'")[0].splitlines()
    nodes = [f"{r['ultraserver']} {r['position']}"
             for r in csv.DictReader(io.StringIO((solved / "L" / "nodes.csv").read_text()))]
    assert table == nodes and "1 2" not in table


@pytest.mark.parametrize("names, rule", [
    ("d2i0", "no domain 2"), ("d0i7", "no instance 7"), ("d0i1,d0i1", "named twice"), ("us0-node1", "is not d<domain>"),
    ("d0i0,d0i1,d0i2,d0i3,d1i0,d1i1,d1i2,d1i3", "leave no healthy instance"),
])
def test_bad_names_are_one_line_naming_the_flag(names, rule, capsys):
    assert main([*SOLVE, "--exclude", names]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exclude" in err[0] and rule in err[0], err


def test_exclude_needs_the_whole_machine(capsys):
    assert main(["solve", "--target", "trn2u", "--model", "llama3-8b", "--exclude", "d0i1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exclude" in err[0] and "--ultraservers" in err[0]


def test_same_json_under_a_slow_clock(tmp_path, monkeypatch, capsys):
    """Every candidate is searched by work, not wall time: a clock 20 times fast changes nothing."""
    import time

    from trnopt.optimizer.search import clock

    case = ["solve", "--target", "trn2u", "--model", "mixtral-8x22b", "--ultraservers", "2", "--exclude", "d0i2",
            "--time-limit", "600"]
    assert main([*case, "--json", str(tmp_path / "a.json")]) == 0
    real = time.perf_counter
    start = real()
    monkeypatch.setattr(clock, "CLOCK", lambda: start + 20 * (real() - start))
    assert main([*case, "--json", str(tmp_path / "b.json")]) == 0
    first = (tmp_path / "a.json").read_bytes()
    assert json.loads(first)["status"] == "OPTIMAL" and (tmp_path / "b.json").read_bytes() == first


def test_k8s_runs_whole_ultraservers_and_refuses_a_cut_ring_in_one_line(solved, capsys):
    """A plan of whole UltraServers is a JobSet as any other (valid Kubernetes Jobs, pods on node ids 0-3);
    a plan on some of an UltraServer's instances is refused, nothing written."""
    target, _, layout = read_layout(str(solved / "l.json"))
    out = solved / "K"
    code = main(["launch", "--layout", str(solved / "l.json"), "--scheduler", "k8s", "--out", str(out)])
    if target.instances_per_domain != target.remaining.whole_instances:
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "--scheduler" in err and "d1i2" in err
        assert "whole UltraServers only" in err and not out.exists()
        return
    assert code == 0
    yaml = pytest.importorskip("yaml")
    kv = pytest.importorskip("kubernetes_validate")
    text = (out / "jobset.yaml").read_text()
    assert "d1i2 excluded" in text
    jobs = yaml.safe_load(text)["spec"]["replicatedJobs"]
    assert len(jobs) == layout.domains * 4
    nodes = set()
    for job in jobs:
        # a JobSet's replicated job template is a batch/v1 JobTemplateSpec (jobset.x-k8s.io/v1alpha2)
        kv.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]},
                     "spec": job["template"]["spec"]}, kv.latest_version(), strict=True)
        pod = job["template"]["spec"]["template"]
        nodes.add((pod["metadata"]["labels"]["trnopt/domain"],
                   pod["spec"]["nodeSelector"]["neuron.amazonaws.com/ultraserver-node-id-4"]))
    assert nodes == {(str(d), str(i)) for d in range(layout.domains) for i in range(4)}
