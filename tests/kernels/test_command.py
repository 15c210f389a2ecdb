"""`trnopt kernels` end to end, and the measured overlap table the cost model reads."""

from __future__ import annotations

import json
import math

import pytest

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.commands.args import load_runnable_layout
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.layoutfile import layout_dict, problem_dict
from trnopt.optimizer.cost.overlap import OverlapTable, measured, parse_table, tp_hidden
from trnopt.optimizer.cost.steptime import step_time
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


@pytest.fixture(scope="module")
def solved_layout(tmp_path_factory):
    """A solved layout (llama3-8b on one trn2: TP inside a chip), as `trnopt solve --json` writes it;
    a deterministic budget gives the layout an idle machine finds, whatever the load, and one
    instance keeps the simulated TP group small."""
    path = tmp_path_factory.mktemp("solve") / "layout.json"
    assert main(["solve", "--target", "trn2", "--model", "llama3-8b", "--instances", "1", "--time-limit", "900",
                 "--deterministic-limit", "60", "--top", "0", "--json", str(path)]) == 0
    return path


def hand_layout(tmp_path, target_name: str, tp: dict[str, int], name: str = "layout.json", domains: int = 2,
                model: str = "llama3-405b"):
    """TP as given, the rest DP, ZeRO-3 with full recompute, on two domains: a layout that fits the HBM."""
    target = load_target(target_name)
    axes = target.axes(2, domains)
    tp_row = tuple(tp.get(a.name, 1) for a in axes)
    dp_row = tuple(a.size // f for a, f in zip(axes, tp_row))
    rows = tuple({"tp": tp_row, "dp": dp_row}.get(d, (1,) * len(axes)) for d in DIMS)
    t = math.prod(tp_row)
    layout = Layout(tp=t, pp=1, dp=math.prod(a.size for a in axes) // t, axes=axes, placement=rows, lnc=2,
                    zero=3, recompute="full")
    wl = Workload(load_model(model), Training())
    path = tmp_path / name
    path.write_text(json.dumps({"problem": problem_dict(target_name, model, wl, domains),
                                "layout": layout_dict(layout)}))
    return path


def test_kernels_on_the_solved_layout_layout(solved_layout, capsys):
    capsys.readouterr()
    assert main(["kernels", "--layout", str(solved_layout), "--shape", "scaled"]) == 0
    out = capsys.readouterr().out
    assert "kernel plan:" in out and "check: every hop is one link" in out
    assert out.count(" OK ") == 4 and "WRONG" not in out
    assert "T_mm us" in out and "hidden" in out


def test_kernels_json_to_stdout(solved_layout, capsys):
    capsys.readouterr()
    assert main(["kernels", "--layout", str(solved_layout), "--shape", "scaled", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    tp = doc["plan"]["tp"]
    ranks = doc["plan"]["ranks"]
    assert tp["count"] * tp["size"] == ranks and len(tp["first_group"]) == tp["size"]
    assert {r["kernel"] for r in doc["overlap"]["rows"]} == {"allgather_matmul", "matmul_reduce_scatter"}
    assert all(c["ok"] for c in doc["checks"])


def test_kernels_report_the_row_the_cost_model_reads(tmp_path, capsys):
    """A 405B layout at LNC 2 with TP8 over two chips: the report's "cost model uses" column
    is the table's row for that target, LNC and model width (not the least over widths),
    and the kernels ran at LNC 2."""
    path = hand_layout(tmp_path, "trn2u", {"core": 4, "x": 2})
    capsys.readouterr()
    assert main(["kernels", "--layout", str(path), "--shape", "scaled", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["lnc"] == 2 and doc["plan"]["shape_class"] == "hidden16384"
    table = measured()
    for r in doc["overlap"]["rows"]:
        want = table.fraction(r["kernel"], 8, "torus", target="trn2u", lnc=2, shape_class="hidden16384")
        assert r["cost_model_fraction"] == want, r


def test_solve_charges_tp_after_the_simulated_overlap(solved_layout):
    # the layout's own target, LNC and model width select the rows (optimizer/cost/overlap.py)
    from trnopt.optimizer.cost.overlap import shape_class
    doc = json.loads(solved_layout.read_text())
    step = doc["step_breakdown_s"]
    table = measured()
    target, lnc = load_target(doc["problem"]["target"]), doc["layout"]["lnc"]
    axes = target.axes(lnc, doc["problem"]["domains"])
    span = tuple((a, doc["layout"]["placement"]["tp"].get(a.name, 1)) for a in axes
                 if doc["layout"]["placement"]["tp"].get(a.name, 1) > 1)
    frac = tp_hidden(table, span, target.name, lnc, shape_class(load_model(doc["problem"]["model"]).hidden))
    assert step["tp_raw"] > 0 and 0 < frac <= 1
    assert step["tp"] == pytest.approx(step["tp_raw"] * (1 - frac))


def test_kernels_run_the_ring_expert_exchange_on_a_torus_ep_group(tmp_path, capsys):
    # Mixtral with EP4 along one torus ring of a trn2: the plan picks the ring variant and
    # the command runs it on all four ranks against the reference
    target = load_target("trn2")
    axes = target.axes(2, 1)
    ep_row = tuple({"x": 4}.get(a.name, 1) for a in axes)
    dp_row = tuple(a.size // e for a, e in zip(axes, ep_row))
    rows = tuple({"ep": ep_row, "dp": dp_row}.get(d, (1,) * len(axes)) for d in DIMS)
    ranks = math.prod(a.size for a in axes)
    layout = Layout(tp=1, pp=1, dp=ranks, ep=4, axes=axes, placement=rows, lnc=2, zero=3, recompute="full")
    wl = Workload(load_model("mixtral-8x7b"), Training())
    path = tmp_path / "moe.json"
    path.write_text(json.dumps({"problem": problem_dict("trn2", "mixtral-8x7b", wl, 1), "layout": layout_dict(layout)}))
    assert main(["kernels", "--layout", str(path), "--shape", "scaled"]) == 0
    out = capsys.readouterr().out
    assert "2 channel(s), the ring's two directions" in out
    assert "alltoall_expert_matmul  EP4 ring" in out and " OK " in out and "WRONG" not in out
    assert "E_local 2" in out  # Mixtral's 8 experts over EP4: the check runs the plan's two per rank
    assert "overlap: no TP kernels in this plan (TP = 1)\n\n" in out  # and no empty table under it


def test_kernels_on_a_tp_group_across_the_trn2u_ring(tmp_path, capsys):
    # cores to DP: TP4 across the 4 instances (70B: 405B at TP4 does not fit the HBM)
    path = hand_layout(tmp_path, "trn2u", {"ring": 4}, model="llama3-70b")
    capsys.readouterr()
    assert main(["kernels", "--layout", str(path), "--shape", "scaled", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["tp"]["link_class"] == "ring" and doc["plan"]["tp"]["one_hop"]
    assert all(c["ok"] for c in doc["checks"])


def test_kernels_run_with_the_target_chips_sbuf(tmp_path, monkeypatch):
    """On Trn3 (256 KiB of SBUF per partition, not Trn2's 224) the command measures and checks
    the kernels with the target chip's SBUF, as the overlap table was measured."""
    from types import SimpleNamespace

    import trnopt.kernels.sim as sim
    from trnopt.kernels import command, overlap

    seen = []

    def fake_measure(*args, **kw):
        seen.append(kw["sbuf_bytes"])
        return SimpleNamespace(t_mm=1.0, t_cc=1.0, t_f=1.0, hidden_fraction=1.0, speedup=2.0)
    run = sim.run_ranks

    def recorded_run(*args, **kw):
        seen.append(kw["sbuf_bytes_per_partition"])
        return run(*args, **kw)
    monkeypatch.setattr(overlap, "measure", fake_measure)
    monkeypatch.setattr(sim, "run_ranks", recorded_run)
    target, workload, layout, _ = load_runnable_layout(str(hand_layout(tmp_path, "trn3-gen1", {"core": 4})))
    plan = command.kernel_plan(workload, layout, target)
    command.overlap_rows(plan, "full")
    checks = command.check_tp(plan.tp, "allgather_matmul", plan.lnc, plan.sbuf_bytes)
    assert all(c.ok for c in checks) and len(checks) == 2
    assert seen == [target.chip.sbuf_bytes_per_partition] * 4 and seen[0] == 256 * 1024


def test_full_shape_table_says_where_it_came_from(solved_layout, capsys):
    capsys.readouterr()
    assert main(["kernels", "--layout", str(solved_layout), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "symmetric fast mode" in doc["overlap"]["source"]
    assert doc["overlap"]["rows"] and all(r["cost_model_source"] and r["source"] for r in doc["overlap"]["rows"])


def test_wrong_result_exits_1(solved_layout, capsys, monkeypatch):

    from trnopt.kernels import allgather_matmul as ag
    real = ag.allgather_matmul_reference
    monkeypatch.setattr(ag, "allgather_matmul_reference", lambda *a, **k: -real(*a, **k))
    capsys.readouterr()
    assert main(["kernels", "--layout", str(solved_layout), "--shape", "scaled"]) == 1
    assert "WRONG" in capsys.readouterr().out


@pytest.mark.parametrize("text,key", [
    ("{not json", "-"),
    ('{"problem": {"target": "trn2u", "model": "llama3-405b", "domains": 1}}', "layout"),
    ('{"problem": {"target": "trn2u", "model": "llama3-405b"}, "layout": {}}', "problem.domains"),
    ('{"problem": {"target": "trn2u", "model": "llama3-405b", "domains": 1}, "layout": {"tp": 4}}', "layout.lnc"),
])
def test_malformed_layout_is_one_line_exit_2(tmp_path, capsys, text, key):
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert main(["kernels", "--layout", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and f": {key}:" in err


def test_never_overwrites_json(solved_layout, tmp_path, capsys):
    out = tmp_path / "plan.json"
    out.write_text("mine")
    assert main(["kernels", "--layout", str(solved_layout), "--shape", "scaled", "--json", str(out)]) == 2
    assert out.read_text() == "mine"


# -- the measured table ---------------------------------------------------------------------------
def table(rows):
    return parse_table({"version": 1, "rows": [
        {"kernel": k, "tp": t, "link_class": c, "channels": 2, "shape": {}, "t_mm": 1, "t_cc": 1, "t_f": 1,
         "hidden_fraction": f} for k, t, c, f in rows]}, "t.json")


def test_lookup_rule_exact_nearest_none_and_clamp():
    t = table([("allgather_matmul", 4, "torus", 0.9), ("allgather_matmul", 16, "torus", 0.5),
               ("allgather_matmul", 64, "torus", -3.0), ("matmul_reduce_scatter", 4, "torus", 1.2)])
    assert t.fraction("allgather_matmul", 4, "torus") == 0.9
    assert t.fraction("allgather_matmul", 2, "torus") == 0.9          # nearest: 4
    assert t.fraction("allgather_matmul", 8, "torus") == 0.5          # tie 4 / 16: the smaller
    assert t.fraction("allgather_matmul", 128, "torus") == 0.0        # nearest 64, clamped from -3
    assert t.fraction("matmul_reduce_scatter", 4, "torus") == 1.0     # clamped
    assert t.fraction("allgather_matmul", 4, "ring") == 0.0           # nothing on that class
    assert t.fraction("allgather_matmul", 1, "torus") == 0.0
    assert t.tp_fraction(4, "torus") == pytest.approx(0.95)
    assert t.source_of("allgather_matmul", 8, "torus").startswith("nearest")


def test_tp_hidden_is_degree_aware():
    t = table([("allgather_matmul", 4, "torus", 0.9), ("matmul_reduce_scatter", 4, "torus", 0.7),
               ("allgather_matmul", 16, "torus", 0.2), ("matmul_reduce_scatter", 16, "torus", 0.4)])
    assert isinstance(t, OverlapTable)
    x = load_target("trn2").axes(2, 1)[1]
    assert tp_hidden(t, ((x, 4), (load_target("trn2").axes(2, 1)[2], 4))) == pytest.approx(0.3)  # TP16
    assert tp_hidden(t, ((x, 4),)) == pytest.approx(0.8)      # degree-aware: TP4
    assert tp_hidden({"torus": 0.5}, ((x, 4),)) == 0.5         # a plain dict, as step_time reads it
    assert tp_hidden(None, ((x, 4),)) == 0.0


def test_step_time_with_the_shipped_table():
    t = measured()
    assert t.doc["version"] == 1 and "benchmarks/overlap_table.py" in t.doc["command"]
    assert {"core", "torus", "ring", "switch"} <= {r["link_class"] for r in t.rows}
    for r in t.rows:
        assert r["t_cc"] > 0 and r["t_mm"] > 0 and r["t_f"] > 0
        assert r["hidden_fraction"] == pytest.approx(1 - (r["t_f"] - r["t_mm"]) / r["t_cc"])
    target = load_target("trn2u")
    axes = target.axes(2, 1)
    rows = tuple({"tp": (4, 1, 1, 1, 1), "dp": (1, 4, 4, 4, 1)}.get(d, (1,) * 5) for d in DIMS)
    layout = Layout(tp=4, pp=1, dp=64, axes=axes, placement=rows, lnc=2, zero=3, recompute="full")
    wl = Workload(load_model("llama3-405b"), Training())
    plain, withov = step_time(wl, layout, target), step_time(wl, layout, target, t)
    # the rows of the layout's own target, LNC and model width
    hidden = t.tp_fraction(4, "core", target="trn2u", lnc=2, shape_class="hidden16384")
    assert hidden != t.tp_fraction(4, "core")  # the smallest over every target's rows differs
    assert withov.tp_raw == plain.tp_raw and withov.tp == pytest.approx(plain.tp * (1 - hidden))


@pytest.mark.parametrize("doc,key", [
    ([], "-"), ({"version": 9, "rows": []}, "version"), ({"version": 1}, "rows"),
    ({"version": 1, "rows": [{"kernel": "x"}]}, "rows[0].tp"),
])
def test_malformed_table(doc, key):
    with pytest.raises(InputError, match=f": {key.replace('[', '.').replace(']', '.')}"):
        parse_table(doc, "t.json")
