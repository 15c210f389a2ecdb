"""solve --format torchtitan: a torchtitan 0.2.x job config whose degrees are the layout's."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.frameworks import torchtitan as T
from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import build, deepseek_trn3_gen2, llama8b_trn2, llama405b_trn2u_x2

SHAPES = {
    "llama3-405b": (llama405b_trn2u_x2, Training(seq=8192, global_batch=1024)),
    "deepseek-v3": (deepseek_trn3_gen2, Training(seq=4096, global_batch=1024)),
    "llama3-8b": (llama8b_trn2, Training(seq=8192, global_batch=256)),
}


def _parse_overrides(args: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for a in args:
        assert a.startswith("--")
        key, eq, value = a[2:].partition("=")
        section, _, name = key.partition(".")
        if not eq:  # a boolean flag: --section.key or --section.no-key
            value, name = ("false", name[3:].replace("-", "_")) if name.startswith("no-") else ("true", name)
        out.setdefault(section, {})[name] = value
    return out


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_job_config_parses_and_its_degrees_multiply_to_the_world_size(model):
    shape, training = SHAPES[model]
    target, lay = shape()
    workload = Workload(load_model(model), training)
    assert lay.workload_problems(workload) == []
    text = T.job_toml(workload, target, lay)
    cfg = tomllib.loads(text)
    assert "torchtitan 0.2.2" in text.splitlines()[0]
    par = cfg["parallelism"]
    assert T.world_size(cfg) == lay.ranks
    assert par["tensor_parallel_degree"] == lay.tp and par["pipeline_parallel_degree"] == lay.pp
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == lay.dp
    assert par["data_parallel_replicate_degree"] == lay.dp_replicate
    assert cfg["compile"] == {"enable": True, "backend": "neuron"}
    assert cfg["training"]["seq_len"] == training.seq and cfg["training"]["global_batch_size"] == training.global_batch
    micro = lay.micro_batches(workload)
    if lay.pp > 1:  # one step runs all micro-batches through the pipeline
        assert cfg["training"]["local_batch_size"] == training.global_batch // lay.dp
        assert cfg["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == micro
        assert par["pipeline_parallel_schedule"] == "1F1B"
    else:  # gradient accumulation: global = local x dp x accumulation steps
        assert training.global_batch == cfg["training"]["local_batch_size"] * lay.dp * micro
    mode = {"none": "none", "op": "selective", "full": "full"}[lay.recompute]
    assert cfg["activation_checkpoint"]["mode"] == mode
    assert ("selective_ac_option" in cfg["activation_checkpoint"]) is (lay.recompute == "op")
    # the overrides say the same as the file
    over = _parse_overrides(T.overrides(workload, target, lay))
    for section, keys in cfg.items():
        for key, value in keys.items():
            if (section, key) == ("job", "description"):
                continue
            expect = ("true" if value else "false") if isinstance(value, bool) else str(value)
            assert over[section][key] == expect, (section, key)
    assert "WARNING" not in text


def test_moe_sets_expert_degrees_and_the_model_preset():
    target, lay = deepseek_trn3_gen2()
    workload = Workload(load_model("deepseek-v3"), Training(seq=4096, global_batch=1024))
    cfg = tomllib.loads(T.job_toml(workload, target, lay, fsdp="fsdp2"))
    assert cfg["model"] == {"name": "deepseek_v3", "flavor": "671B"}
    simple = tomllib.loads(T.job_toml(workload, target, lay))  # the default: SimpleFSDP
    assert simple["model"] == {"name": "simple_fsdp.deepseek_v3", "flavor": "671B"}
    assert simple["job"]["custom_config_module"] == T.SIMPLE_FSDP_CONFIG
    assert cfg["parallelism"]["expert_parallel_degree"] == 8
    assert cfg["parallelism"]["expert_tensor_parallel_degree"] == lay.tp
    assert cfg["parallelism"]["data_parallel_shard_degree"] % 8 == 0  # EP is the inner part of dp_shard


def test_interleaved_pipeline_gets_the_stage_count_torchtitan_derives():
    target, _ = llama405b_trn2u_x2()
    lay = build(target, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}}, interleave=2)
    workload = Workload(load_model("llama3-70b"), Training(seq=8192, global_batch=256))
    par = tomllib.loads(T.job_toml(workload, target, lay))["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    per = par["pipeline_parallel_layers_per_stage"]
    assert math.ceil((80 + 1 + 1) / per) == 4 * 2  # torchtitan's virtual stage count
    assert T.layers_per_stage(126, 8) is not None and T.layers_per_stage(3, 100) is None


def test_a_layout_torchtitan_cannot_run_is_written_with_its_warnings():
    target, lay = llama405b_trn2u_x2()
    across = build(target, 2, {"tp": {"ring": 4}, "dp": {"core": 4, "x": 4, "y": 4, "efa": 2}})
    workload = Workload(load_model("llama3-405b"), Training(seq=8192, global_batch=1024))
    text = T.job_toml(workload, target, replace(across, zero=1))
    tomllib.loads(text)
    warnings = [line for line in text.splitlines() if line.startswith("# WARNING")]
    assert len(warnings) == 2 and "ZeRO-1" in warnings[0] and "consecutive ranks" in warnings[1]


def test_solve_format_torchtitan_end_to_end(capsys):
    args = ["solve", "--target", "trn2", "--model", "llama3-8b", "--instances", "1", "--seq", "2048",
            "--global-batch", "64", "--time-limit", "5", "--lnc", "2", "--format", "torchtitan"]
    assert main(args) == 0
    cfg = tomllib.loads(capsys.readouterr().out)
    assert T.world_size(cfg) == 64
    assert cfg["parallelism"]["data_parallel_shard_degree"] > 1  # FSDP (ZeRO-3): the only stage torchtitan runs


def test_solve_refuses_a_format_the_framework_cannot_run(capsys):
    args = ["solve", "--target", "trn2", "--instances", "1", "--framework", "torchtitan", "--format", "nxd"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchtitan cannot run --format nxd" in err
    assert main(["solve", "--framework", "nxd", "--zero-stages", "3", "--format", "env"]) == 2
    assert "nxd runs ZeRO stage(s) 0, 1" in capsys.readouterr().err


def test_the_export_writes_the_schedule_the_layout_carries():
    target, _ = llama405b_trn2u_x2()
    workload = Workload(load_model("llama3-70b"), Training(seq=8192, global_batch=256))
    plain = build(target, 1, {"tp": {"core": 4}, "dp": {"x": 4, "y": 4}, "pp": {"ring": 4}}, recompute="full")
    gpipe = replace(plain, schedule="GPipe")
    text = T.job_toml(workload, target, gpipe)
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_schedule"] == "GPipe" and "WARNING" not in text
    zbv = replace(plain, interleave=2, schedule="ZBVZeroBubble")
    text = T.job_toml(workload, target, zbv)
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert "# WARNING: torchtitan cannot run ZBVZeroBubble" in text and "torch.compile" in text


def test_the_export_writes_op_as_selective_op_and_warns_on_korthikanti_selective():
    target, lay = llama8b_trn2()
    workload = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=256))
    ac = T.job_config(workload, target, lay)["activation_checkpoint"]
    assert lay.recompute == "op" and ac["mode"][0] == "selective" and ac["selective_ac_option"][0] == "op"
    assert "WARNING" not in T.job_toml(workload, target, lay)
    text = T.job_toml(workload, target, replace(lay, recompute="selective"))
    assert "# WARNING: torchtitan has no 'selective' recomputation" in text
