"""check-map: the planned map passes; every planted fault is reported; bad files are one-line errors."""

from __future__ import annotations

import csv
import json

import pytest

from trnopt.optimizer.commands.checkmap import check, read_rank_map
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.model.placement import rank_map
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def write_layout(tmp_path, target_name="trn2u", model="llama3-70b", domains=2, lnc=2, **degrees):
    """A layout file like `trnopt solve --json` writes, for degrees placed fastest axes first."""
    target = load_target(target_name)
    axes = target.axes(lnc, domains)
    deg = {"tp": 8, "pp": 1, "dp": target.ranks(lnc, domains) // 8, **degrees}
    layout = Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"], zero=3, recompute="full", lnc=lnc, axes=axes,
                    placement=default_placement(axes, {"tp": deg["tp"], "dp": deg["dp"], "pp": deg["pp"]}))
    workload = Workload(load_model(model), Training(seq=4096, global_batch=512))
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"problem": problem_dict(target_name, model, workload, domains),
                                "layout": layout_dict(layout)}))
    return str(path), layout, target


def planned_rows(layout, target, lnc=True):
    rows = []
    for p in rank_map(layout, target):
        row = {"rank": p.rank, "instance": f"us{p.domain}-i{p.instance}", "chip": p.chip, "core": p.core,
               "ultraserver": f"us{p.domain}"}
        if lnc:
            row["lnc"] = layout.lnc
        rows.append(row)
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return str(path)


def swap_devices(rows, a, b):
    for key in ("instance", "chip", "core", "ultraserver"):
        rows[a][key], rows[b][key] = rows[b][key], rows[a][key]


def kinds(layout, target, path):
    return {f.kind for f in check(layout, target, read_rank_map(path))}


@pytest.fixture
def planned(tmp_path):
    path, layout, target = write_layout(tmp_path)  # TP8 on core4 x2: each TP group on 2 chips of one instance
    return tmp_path, path, layout, target, planned_rows(layout, target)


def test_planned_map_passes_as_csv_and_json(planned, capsys):
    tmp_path, lpath, layout, target, rows = planned
    csv_path = write_csv(tmp_path / "map.csv", rows)
    assert check(layout, target, read_rank_map(csv_path)) == []
    assert main(["check-map", "--layout", lpath, "--rank-map", csv_path]) == 0
    assert "OK" in capsys.readouterr().out
    json_path = tmp_path / "map.json"
    json_path.write_text(json.dumps({"lnc": 2, "ranks": [{k: v for k, v in r.items() if k != "lnc"} for r in rows]}))
    assert main(["check-map", "--layout", lpath, "--rank-map", str(json_path)]) == 0
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(rows))
    assert check(layout, target, read_rank_map(str(listed))) == []


def test_whole_instance_renamed_or_reordered_still_passes(planned):
    tmp_path, _, layout, target, rows = planned
    for r in rows:  # hosts named differently and given in another order: the slots are matched by ranks
        r["instance"] = "host-" + r["instance"][::-1]
    assert kinds(layout, target, write_csv(tmp_path / "m.csv", rows)) == set()


def test_tp_group_across_the_ring(planned, capsys):
    tmp_path, lpath, layout, target, rows = planned
    # rank 0 (TP group 0, instance 0) and rank 64 (TP group 8, instance 1) trade places
    swap_devices(rows, 0, 64)
    path = write_csv(tmp_path / "m.csv", rows)
    assert {"tp-across-ring", "tp-off-plan"} <= kinds(layout, target, path)
    assert main(["check-map", "--layout", lpath, "--rank-map", path]) == 1
    out = capsys.readouterr().out
    assert "[tp-across-ring] TP group 0 (ranks 0-7) spans 2 instances" in out
    assert "the UltraServer ring" in out


def test_tp_group_not_on_the_planned_chips(planned):
    tmp_path, _, layout, target, rows = planned
    # rank 0 (chip 0) and rank 8 (TP group 1, chip 2) trade places: same instance, other chips
    swap_devices(rows, 0, 8)
    found = check(layout, target, read_rank_map(write_csv(tmp_path / "m.csv", rows)))
    assert {f.kind for f in found} == {"tp-off-plan"}
    assert "rank 0 planned on domain 0 instance 0 chip 0, runs on us0-i0 chip 2" in found[0].message


def test_cores_swapped_within_a_chip_are_fine(planned):
    tmp_path, _, layout, target, rows = planned
    rows[0]["core"], rows[1]["core"] = rows[1]["core"], rows[0]["core"]
    assert kinds(layout, target, write_csv(tmp_path / "m.csv", rows)) == set()


def test_lnc_different_from_the_plan(planned):
    tmp_path, _, layout, target, rows = planned
    for r in rows:
        r["lnc"] = 1
    found = check(layout, target, read_rank_map(write_csv(tmp_path / "m.csv", rows)))
    assert [f.kind for f in found] == ["lnc"]
    assert "NEURON_LOGICAL_NC_CONFIG=2" in found[0].message and "--logical-nc-config=2" in found[0].message


def test_lnc_inferred_from_core_indices(planned):
    tmp_path, _, layout, target, rows = planned
    # an LNC=1 job: 8 logical cores per chip, so the same ranks fill half the chips
    for r in rows:
        del r["lnc"]
        local = r["chip"] * 4 + r["core"]
        r["chip"], r["core"] = local // 8, local % 8
    assert "lnc" in kinds(layout, target, write_csv(tmp_path / "m.csv", rows))


def test_ultraserver_scheduled_partially_and_outside_instance(planned):
    tmp_path, _, layout, target, rows = planned
    for r in rows:  # the scheduler gave domain 0 an instance of another UltraServer
        if r["instance"] == "us0-i3":
            r["ultraserver"] = "us9"
    found = check(layout, target, read_rank_map(write_csv(tmp_path / "m.csv", rows)))
    messages = [f"{f.kind}: {f.message}" for f in found]
    assert any(m.startswith("partial-ultraserver: UltraServer us0 is scheduled partially: 3 of its 4") for m in messages)
    assert any(m.startswith("outside-instance: domain 0 has instance us0-i3 from UltraServer us9") for m in messages)


def test_outside_instances_swapped_between_two_ultraservers(planned):
    tmp_path, _, layout, target, rows = planned
    for r in rows:
        if r["instance"] == "us0-i3":
            r["ultraserver"] = "us1"
        elif r["instance"] == "us1-i0":
            r["ultraserver"] = "us0"
    assert kinds(layout, target, write_csv(tmp_path / "m.csv", rows)) == {"outside-instance"}


def test_world_size_mismatch(planned):
    tmp_path, _, layout, target, rows = planned
    assert kinds(layout, target, write_csv(tmp_path / "m.csv", rows[:256])) == {"world-size"}


def test_without_ultraserver_column_membership_is_not_checked(planned, capsys):
    tmp_path, lpath, layout, target, rows = planned
    for r in rows:
        del r["ultraserver"]
    path = write_csv(tmp_path / "m.csv", rows)
    assert main(["check-map", "--layout", lpath, "--rank-map", path]) == 0
    assert "no ultraserver column" in capsys.readouterr().out


@pytest.mark.parametrize("edit, key, rule", [
    (lambda rows: rows[1].update(rank=0), "line 3.rank", "appears twice"),
    (lambda rows: rows[1].update(chip="two"), "line 3.chip", "must be an integer"),
    (lambda rows: rows[1].update(core=-1), "line 3.core", "must be >= 0"),
    (lambda rows: rows[1].update(instance=""), "line 3.instance", "missing required key"),
    (lambda rows: rows[1].update(core=0), "line 3.core", "already holds rank 0"),
    (lambda rows: rows[1].update(lnc="two"), "line 3.lnc", "must be an integer"),
])
def test_malformed_rank_map_is_one_line_exit_2(planned, capsys, edit, key, rule):
    tmp_path, lpath, _, _, rows = planned
    edit(rows)
    path = write_csv(tmp_path / "m.csv", rows)
    assert main(["check-map", "--layout", lpath, "--rank-map", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {key}: " in err and rule in err


def test_unknown_column_and_missing_ranks(planned, capsys):
    tmp_path, lpath, _, _, rows = planned
    rows[0]["host"] = "x"
    for r in rows[1:]:
        r["host"] = "x"
    path = write_csv(tmp_path / "m.csv", rows)
    assert main(["check-map", "--layout", lpath, "--rank-map", path]) == 2
    assert "line 2.host: unknown key" in capsys.readouterr().err
    gap = tmp_path / "gap.json"
    for r in rows:
        del r["host"]
    gap.write_text(json.dumps([r for r in rows if r["rank"] != 5]))
    assert main(["check-map", "--layout", lpath, "--rank-map", str(gap)]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["check-map", "--layout", lpath, "--rank-map", str(tmp_path / "none.csv")]) == 2


def test_rows_bytes_and_fields_are_bounded(tmp_path, monkeypatch):
    from trnopt.optimizer.commands import rankmapfile
    from trnopt.optimizer.errors import InputError

    monkeypatch.setattr(rankmapfile, "MAX_ROWS", 100)
    path = tmp_path / "m.csv"
    path.write_text("rank,instance,chip,core\n" + "".join(f"{r},i-{r // 4},0,{r % 4}\n" for r in range(101)))
    with pytest.raises(InputError, match="more than 100 rows"):
        read_rank_map(str(path))
    path.write_text("rank,instance,chip,core\n0," + "a" * 200_000 + ",0,0\n")
    with pytest.raises(InputError, match="not valid CSV"):
        read_rank_map(str(path))
    path.write_text("rank,instance,chip,core\n" + "1" * 5000 + ",a,0,0\n")
    with pytest.raises(InputError, match="line 2.rank: must be an integer"):
        read_rank_map(str(path))
    path.write_text("\ufeffrank,instance,chip,core\n0,a,0,0\n")
    assert read_rank_map(str(path)).device(0)[0] == "a"


def test_the_largest_maps_trnopt_writes_are_read(tmp_path):
    """A rank map beyond the old 1,048,576-row bound (2,097,152 ranks: llama3-8b on 32,768 trn2
    instances), as evaluate --rank-map writes it, passes check-map under 1 GiB."""
    import subprocess
    import sys

    layout, rank_map = tmp_path / "big.json", tmp_path / "big.csv"
    # Each command runs under a fresh parent that reports its one child's peak RSS on its last stderr
    # line: this worker's own RUSAGE_CHILDREN also holds whatever other tests ran before.
    peak = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(done.returncode)")
    trnopt = [sys.executable, "-c", peak, sys.executable, "-m", "trnopt.optimizer.commands.cli"]
    wrote = subprocess.run(trnopt + ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--instances", "32768",
                                     "--tp", "8", "--zero", "3", "--global-batch", "262144", "--json", str(layout),
                                     "--rank-map", str(rank_map)], check=True, capture_output=True, text=True,
                           timeout=900)
    done = subprocess.run(trnopt + ["check-map", "--layout", str(layout), "--rank-map", str(rank_map)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "2097152 ranks on 32768 instance(s)" in done.stdout and "OK:" in done.stdout
    for name, run in (("evaluate", wrote), ("check-map", done)):
        peak_kib = int(run.stderr.strip().splitlines()[-1])
        assert peak_kib < 2**20, f"{name}: {peak_kib / 2**10:.0f} MiB"


def test_a_fifo_as_the_rank_map_is_refused_without_opening_it(planned, capsys):
    import os

    tmp_path, lpath, _, _, _ = planned
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["check-map", "--layout", lpath, "--rank-map", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
