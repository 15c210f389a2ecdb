"""trnopt calibrate: planted link rates, latencies and compute utilisation come back within 2%."""

from __future__ import annotations

import importlib.util
import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from trnopt.optimizer.commands.calibrate import with_links
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost import nccom as N
from trnopt.optimizer.cost.evaluate import evaluate
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

_spec = importlib.util.spec_from_file_location("nccom_tables", Path(__file__).parents[1] / "cost" / "nccom_tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

# planted per link class of trn2u: achievable share of the datasheet bandwidth, latency per hop
PLANTED = {("x", "y"): (0.62, 4e-6), ("ring",): (0.71, 9e-6), ("efa",): (0.55, 40e-6)}
RUNS = (("all_reduce", 64, 1), ("all_gather", 64, 1), ("all_reduce", 256, 4), ("reduce_scatter", 256, 4),
        ("all_reduce", 512, 8))


def _planted_target():
    t = load_target("trn2u")
    for names, (a, lat) in PLANTED.items():
        t = with_links(t, names, achievable=a, latency=lat)
    return t


def _write_runs(directory: Path) -> Path:
    """nccom-test tables of the planted machine: alpha and beta from the cost model's formula on it."""
    planted = _planted_target()
    directory.mkdir()
    for op, ranks, nodes in RUNS:
        shape = N.parse(tables.table(op, ranks, nodes, 1e-4, 1e-10), "shape.txt")
        beta, alpha = N.model_time(planted, shape)
        (directory / f"{op}_r{ranks}_N{nodes}.txt").write_text(tables.table(op, ranks, nodes, alpha, beta))
    (directory / "one-chip.txt").write_text(tables.table("all_reduce", 4, 1, 20e-6, 1e-12))
    return directory


def test_calibrate_recovers_planted_link_rates_and_latencies(tmp_path, capsys):
    runs = _write_runs(tmp_path / "nccom")
    out = tmp_path / "my-trn2u.toml"
    assert main(["calibrate", "--target", "trn2u", "--nccom", str(runs), "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "one-chip.txt" in report and "not used" in report
    cal = load_target(str(out))
    by_name = {a.name: a for a in (*cal.domain_axes, cal.scale_out)}
    errors = {}
    for names, (a, lat) in PLANTED.items():
        for n in names:
            assert by_name[n].achievable == pytest.approx(a, rel=0.02), n
            assert by_name[n].latency == pytest.approx(lat, rel=0.02), n
            errors[n] = (by_name[n].achievable / a - 1, by_name[n].latency / lat - 1)
    # datasheet bandwidths are kept; the fraction carries the measurement
    assert by_name["ring"].bandwidth == load_target("trn2u").domain_axes[2].bandwidth
    record = tomllib.loads(out.read_text())["calibration"]
    assert record["constants"]["axes.ring.achievable"] == "measured"
    assert record["constants"]["scale_out.latency_us"] == "measured"
    assert record["constants"]["efficiency.matmul"] == "source file"
    assert len(record["runs"]) == len(RUNS) + 1
    assert all(r["rms_rel_error"] < 0.02 for r in record["runs"])
    # the file is a copy of the target's with its comments: the datasheet sources are still there
    assert "Trn2 architecture page" in out.read_text()


def test_recalibrating_a_calibrated_file_replaces_its_record(tmp_path):
    runs = _write_runs(tmp_path / "nccom")
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    assert main(["calibrate", "--target", "trn2u", "--nccom", str(runs), "--out", str(first)]) == 0
    assert main(["calibrate", "--target", str(first), "--nccom", str(runs), "--out", str(second)]) == 0
    text = second.read_text()
    assert text.splitlines().count("[calibration]") == 1
    assert text.split("\n[calibration]")[0].count("\nachievable = ") == 4  # x, y, ring, efa: replaced, not added
    assert load_target(str(second)).scale_out.achievable == pytest.approx(0.55, rel=0.02)


def test_calibrate_fits_compute_utilisation_from_a_step_time(tmp_path):
    target = load_target("trn2")
    workload = Workload(load_model("llama3-8b"), Training(seq=2048, global_batch=64))
    axes = target.axes(2, 1)
    lay = Layout(tp=4, pp=1, dp=16, axes=axes, placement=default_placement(axes, {"tp": 4, "dp": 16}), zero=1)
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"problem": problem_dict("trn2", "llama3-8b", workload, 1),
                                  "layout": layout_dict(lay)}))
    eff = target.efficiency
    planted = replace(target, efficiency=replace(eff, matmul=eff.matmul * 0.8, elementwise=eff.elementwise * 0.8))
    seconds = evaluate(workload, lay, planted).step.total
    runs = tmp_path / "nccom"
    runs.mkdir()
    shape = N.parse(tables.table("all_reduce", 64, 1, 1e-4, 1e-10), "s.txt")
    beta, alpha = N.model_time(target, shape)  # links exactly at the datasheet
    (runs / "allr_r64_N1.txt").write_text(tables.table("all_reduce", 64, 1, alpha, beta * 1.05))
    out = tmp_path / "cal.toml"
    assert main(["calibrate", "--target", "trn2", "--nccom", str(runs), "--step-time", str(layout),
                 repr(seconds), "--out", str(out)]) == 0
    cal = load_target(str(out))
    assert cal.efficiency.matmul == pytest.approx(eff.matmul * 0.8, rel=0.02)
    record = tomllib.loads(out.read_text())["calibration"]
    assert record["step_time"]["modelled_after_s"] == pytest.approx(seconds, rel=0.01)
    assert record["constants"]["efficiency.matmul"] == "measured"


def test_calibrate_rejects_a_malformed_table_with_file_line_rule(tmp_path, capsys):
    good = tables.table("all_reduce", 64, 1, 300e-6, 2e-11).splitlines()
    broken = tmp_path / "allr.txt"
    broken.write_text("\n".join(good[:5] + [good[5].replace("uint8", "int9")] + good[6:]) + "\n")
    out = tmp_path / "x.toml"
    assert main(["calibrate", "--target", "trn2u", "--nccom", str(broken), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"trnopt: error: {broken}:6: unknown type 'int9'; one of {', '.join(N.DTYPE_BYTES)}\n"
    assert not out.exists()


def test_calibrate_never_overwrites_without_force(tmp_path, capsys):
    runs = _write_runs(tmp_path / "nccom")
    out = tmp_path / "cal.toml"
    out.write_text("keep me")
    assert main(["calibrate", "--target", "trn2u", "--nccom", str(runs), "--out", str(out)]) == 2
    assert out.read_text() == "keep me" and "--force" in capsys.readouterr().err
    assert main(["calibrate", "--target", "trn2u", "--nccom", str(runs), "--out", str(out), "--force"]) == 0
    load_target(str(out))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_calibrate_refuses_a_fifo_instead_of_blocking_on_it(tmp_path, capsys):
    fifo = tmp_path / "runs.txt"
    os.mkfifo(fifo)  # reading it would block for ever: it must be refused before it is opened
    assert main(["calibrate", "--target", "trn2", "--nccom", str(fifo), "--out", str(tmp_path / "t.toml")]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and len(err.strip().splitlines()) == 1
