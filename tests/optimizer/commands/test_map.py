"""trnopt map: the text grid and the PNG picture of the domain."""

from __future__ import annotations

import json
import math

import pytest

from trnopt.optimizer.commands import map as mapview
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

DIMS = ("tp", "cp", "ep", "dp", "pp")


def layout_file(tmp_path, target_name, model, domains=1, lnc=2, **rows):
    """Write a layout file (as `trnopt solve --json` does) from placement rows dim -> {axis: factor}."""
    target = load_target(target_name)
    axes = target.axes(lnc, domains)
    placement = tuple(tuple(rows.get(d, {}).get(a.name, 1) for a in axes) for d in DIMS)
    deg = {d: 1 for d in DIMS}
    for d in DIMS:
        for f in rows.get(d, {}).values():
            deg[d] *= f
    layout = Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"], lnc=lnc, axes=axes, placement=placement, zero=3,
                    recompute="full")  # fits the HBM: map reads only layouts that can run
    workload = Workload(load_model(model), Training(seq=4096, global_batch=math.lcm(256, layout.dp)))
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"problem": problem_dict(target_name, model, workload, domains),
                                "layout": layout_dict(layout)}))
    return str(path), layout, target


def test_text_map_of_a_trn2_ultraserver(tmp_path, capsys):
    # TP8 over the 4 cores of a chip and 2 chips along x; 4 pipeline stages along y
    path, layout, target = layout_file(tmp_path, "trn2u", "llama3-70b", tp={"core": 4, "x": 2},
                                       dp={"x": 2, "ring": 4}, pp={"y": 4})
    assert main(["map", "--layout", path]) == 0
    out = capsys.readouterr().out
    assert "on 1 x trn2u" in out and "instance = position on the ring" in out
    assert out.count("  instance ") == 4
    lines = out.splitlines()
    grid = lines[lines.index("  instance 0:") + 1: lines.index("  instance 0:") + 6]
    assert grid[0].split() == ["y\\x", "0", "1", "2", "3"]
    # row y=0: chips x=0,1 hold TP group 0 and x=2,3 group 1, all pipeline stage 0; y=3 is stage 3
    assert grid[1].split() == ["0", "T0", "s0", "T0", "s0", "T1", "s0", "T1", "s0"]
    assert grid[4].split()[2::2] == ["s3"] * 4
    assert "check: every TP group stays inside one instance" in out


def test_text_map_of_trn3_servers_and_domain_limit(tmp_path, capsys):
    path, layout, target = layout_file(tmp_path, "trn3-gen2", "llama3-8b", domains=3, tp={"core": 4},
                                       dp={"switch": 144, "efa": 3})
    assert main(["map", "--layout", path, "--domains", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("  instance ") == 2 * 36
    assert "row\\col" in out and "chip number = 2 * row + column" in out
    assert "1 more domain(s) not drawn" in out


def test_geometry_helpers():
    assert mapview.near_square_columns(16) == 4
    assert mapview.near_square_columns(36) == 6
    assert mapview.chip_columns(load_target("trn2u")) == 4
    assert mapview.chip_columns(load_target("trn3-gen1")) == 4
    assert mapview.instance_columns(load_target("trn3-gen2")) == 6


def test_png_map_is_written_once(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _, _ = layout_file(tmp_path, "trn2u", "llama3-70b", domains=2, tp={"core": 4, "x": 2},
                             dp={"x": 2, "y": 4, "ring": 4, "efa": 2})
    png = tmp_path / "map.png"
    assert main(["map", "--layout", path, "--png", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert main(["map", "--layout", path, "--png", str(png)]) == 2   # never overwrites
    assert "pass --force" in capsys.readouterr().err
    assert png.read_bytes() == data
    assert main(["map", "--layout", path, "--png", str(png), "--force"]) == 0


def test_png_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path, _, _ = layout_file(tmp_path, "trn2u", "llama3-70b", tp={"core": 4}, dp={"x": 4, "y": 4, "ring": 4})
    assert main(["map", "--layout", path, "--png", str(tmp_path / "m.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'trnopt[plot]'" in err
    assert not (tmp_path / "m.png").exists()


def test_bad_layout_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["map", "--layout", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"trnopt: error: {bad}: layout: missing")
