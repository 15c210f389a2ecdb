"""An uneven split in the torchtitan export: ``module_fqns_per_model_part``, read back by torchtitan
0.2.2's own ConfigManager from the TOML and from the command-line overrides (skipped without it)."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest

from trnopt.optimizer.frameworks import torchtitan as T
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import build

SPLIT = (7, 9, 9, 7)


def _case():
    lay = build("trn2", 1, {"tp": {"core": 4}, "pp": {"x": 4}, "dp": {"y": 4}}, zero=3, recompute="full")
    return Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=256)), replace(lay, stage_layers=SPLIT)


def test_module_fqns_put_every_layer_on_one_stage_with_the_embedding_first_and_the_output_last():
    fqns = T.module_fqns((2, 3, 1))
    assert fqns == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "layers.4"],
                    ["layers.5", "norm", "output"]]


def test_the_split_is_written_instead_of_layers_per_stage():
    workload, lay = _case()
    written = tomllib.loads(T.job_toml(workload, load_target("trn2"), lay))
    par = written["parallelism"]
    assert "pipeline_parallel_layers_per_stage" not in par
    assert par["module_fqns_per_model_part"] == T.module_fqns(SPLIT)
    layers = [n for chunk in par["module_fqns_per_model_part"] for n in chunk if n.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(32)]


def test_torchtitan_0_2_2_reads_the_split_from_the_toml_and_the_overrides(tmp_path):
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    workload, lay = _case()
    target = load_target("trn2")
    path = tmp_path / "job.toml"
    path.write_text(T.job_toml(workload, target, lay))
    from_file = ConfigManager().parse_args(["--job.config_file", str(path)])
    from_cli = ConfigManager().parse_args(T.overrides(workload, target, lay))
    for cfg in (from_file, from_cli):
        assert cfg.parallelism.module_fqns_per_model_part == T.module_fqns(SPLIT)
        assert cfg.parallelism.pipeline_parallel_degree == 4
        assert cfg.parallelism.tensor_parallel_degree == 4
