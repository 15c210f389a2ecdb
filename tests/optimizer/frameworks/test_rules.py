"""Framework rules: each structural rule a framework's code enforces refuses a layout in one line, exit 2."""

from __future__ import annotations

import json

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.frameworks.profile import NXD, TORCHTITAN
from trnopt.optimizer.frameworks.torchtitan import layers_per_stage
from trnopt.optimizer.model.rules import Rules, seq_problem, tp_problems
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model
from trnopt.optimizer.search.space import Space

MIXTRAL_ODD = """name = "mixtral-odd"
source = "test: Mixtral 8x7B with an expert FFN width of 1020"
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
vocab = 32000

[moe]
experts = 8
top_k = 2
expert_ffn = 1020
"""


def run(capsys, *argv):
    code = main(["evaluate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


# Llama 3 405B (128 heads, 8 KV heads, 126 layers) on one trn2u at LNC=2: 256 ranks
L405 = ("--target", "trn2u", "--model", "llama3-405b", "--ultraservers", 1)


def test_torchtitan_refuses_tp_past_the_kv_heads_and_nxd_replicates_them(capsys):
    err = refused(capsys, *L405, "--tp", 16, "--dp", 16, "--zero", 3)
    assert "tp=16 must divide the 8 KV heads" in err and "no KV-head replication" in err
    assert "torchtitan/models/llama3/infra/parallelize.py apply_tp" in err and "default --framework" in err
    code, _, err = run(capsys, *L405, "--tp", 16, "--dp", 16, "--zero", 1, "--framework", "nxd")
    assert code in (0, 1) and "error" not in err


def test_torchtitan_refuses_a_sequence_it_cannot_cut_into_2_tp_cp_pieces(capsys):
    # 8200 = 8 x 1025: cp=1 divides it, but torchtitan asserts seq % (tp x 2 x cp) == 0
    err = refused(capsys, "--target", "trn2", "--model", "llama3-8b", "--seq", 8200, "--tp", 8, "--dp", 8,
                  "--global-batch", 64, "--zero", 3)
    assert "2 x tp x cp = 2 x 8 x 1 = 16" in err and "parallel_dims.py seq_len_divisor" in err


def test_torchtitan_refuses_interleaved_stages_no_layers_per_stage_makes(capsys):
    # 126 layers + embedding + output = 128 effective; 24 stages: ceil(128 / n) is 26 (n=5) or 22 (n=6)
    err = refused(capsys, *L405, "--tp", 8, "--pp", 4, "--dp", 8, "--interleave", 6, "--zero", 3)
    assert "pp*interleave=24 pipeline stages" in err and "pipeline_parallel.py" in err
    assert layers_per_stage(126, 24) is None and layers_per_stage(126, 16) == 8


def test_routed_experts_divide_by_ep(capsys):
    err = refused(capsys, "--target", "trn2", "--model", "mixtral-8x7b", "--tp", 4, "--dp", 16, "--ep", 16,
                  "--zero", 3, "--global-batch", 64)
    assert "ep=16 must divide the 8 routed experts" in err


def test_torchtitan_refuses_uneven_expert_shards(capsys, tmp_path):
    model = tmp_path / "odd.toml"
    model.write_text(MIXTRAL_ODD, encoding="utf-8")
    err = refused(capsys, "--target", "trn2", "--model", model, "--tp", 8, "--dp", 8, "--zero", 3,
                  "--global-batch", 64)
    assert "routed experts' FFN width 1020" in err and "expert_parallel.py" in err


def test_layout_files_carry_their_framework_and_kernels_and_launch_refuse_what_it_cannot_run(capsys, tmp_path):
    code, out, _ = run(capsys, *L405, "--tp", 16, "--dp", 16, "--zero", 1, "--framework", "nxd", "--json", "-")
    doc = json.loads(out)
    assert doc["problem"]["framework"] == "nxd"
    path = tmp_path / "tp16.json"
    # the same TP16 with torchtitan's ZeRO-3, said to be for torchtitan
    path.write_text(json.dumps({"problem": {**doc["problem"], "framework": "torchtitan"},
                                "layout": {**doc["layout"], "zero": 3, "recompute": "op"}}))
    for argv in (["kernels", "--layout", path], ["launch", "--layout", path, "--scheduler", "torchrun",
                                                  "--out", tmp_path / "out"]):
        code = main([str(a) for a in argv])
        _, err = capsys.readouterr()
        assert code == 2 and "8 KV heads" in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "out").exists()


def test_rules_on_single_degrees():
    m405, dsv3 = load_model("llama3-405b"), load_model("deepseek-v3")
    assert [t for t in (1, 2, 4, 8, 16, 32, 64, 128) if not tp_problems(m405, t, TORCHTITAN.rules)] == [1, 2, 4, 8]
    assert [t for t in (1, 2, 4, 8, 16, 32, 64, 128) if not tp_problems(m405, t, NXD.rules)] == \
        [1, 2, 4, 8, 16, 32, 64, 128]
    assert not tp_problems(dsv3, 128, TORCHTITAN.rules)  # MLA: heads shard, there are no KV heads to replicate
    assert seq_problem(8192, 8, 16, TORCHTITAN.rules) is None and seq_problem(8192, 64, 128, TORCHTITAN.rules)
    assert seq_problem(8200, 8, 1, Rules()) is None


@pytest.mark.parametrize("layers", [4, 32, 61, 80, 126])
def test_stage_rule_matches_torchtitans_layers_per_stage(layers):
    rules = TORCHTITAN.rules
    for pp in range(2, 40):
        for v in (2, 3, 4, 6, 8):
            stages, effective = pp * v, layers + 2
            made = layers_per_stage(layers, stages) is not None and stages <= effective
            assert rules.stages_ok(layers, pp, v) == (made and effective // stages >= 1), (layers, pp, v)


def test_the_search_space_holds_each_frameworks_rules():
    w = Workload(load_model("llama3-405b"), Training())
    for framework, largest in ((TORCHTITAN, 8), (NXD, 128)):
        space = Space(Problem(w, load_target("trn2u"), 2, rules=framework.rules), 2)
        assert max(space.degrees["tp"]) == largest, framework.name
    tt = Space(Problem(w, load_target("trn2u"), 2, rules=TORCHTITAN.rules), 2)
    assert not tt.stages_ok(4, 6) and tt.stages_ok(4, 4)  # 24 stages of 126 layers: none; 16: 8 a stage
