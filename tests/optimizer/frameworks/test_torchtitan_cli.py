"""The torchtitan exports read by torchtitan's own config manager.

0.2.2 (installed by the ``frameworks`` extra; skipped without it): job.toml through
``ConfigManager.parse_args(["--job.config_file", ...])`` and the overrides through its CLI
parser give the same settings, the ones the layout decided. 0.3.0 cannot be installed beside
0.2.2, so the config module is loaded by the Python that ``TRNOPT_TORCHTITAN03_PYTHON`` names
(a venv with torchtitan==0.3.0), skipped when it is not set.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from importlib.metadata import version

import pytest

from trnopt.optimizer.frameworks import torchtitan as T
from trnopt.optimizer.frameworks import torchtitan_registry as R
from trnopt.optimizer.model.workload import Training, Workload, load_model

from .layouts import deepseek_trn3_gen2, llama8b_trn2, llama405b_trn2u_x2

SHAPES = {
    "llama3-405b": (llama405b_trn2u_x2, Training(seq=8192, global_batch=1024)),
    "deepseek-v3": (deepseek_trn3_gen2, Training(seq=4096, global_batch=1024)),
    "llama3-8b": (llama8b_trn2, Training(seq=8192, global_batch=256)),
}


def _case(model):
    shape, training = SHAPES[model]
    target, lay = shape()
    return Workload(load_model(model), training), target, lay


def _settings(cfg, toml_cfg: dict) -> dict:
    """The values of every key trnopt wrote, read back from torchtitan's JobConfig."""
    return {(s, k): getattr(getattr(cfg, s), k) for s, keys in toml_cfg.items() for k in keys}


@pytest.mark.parametrize("fsdp", T.FSDP_MODES)
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_toml_and_overrides_parse_in_torchtitan_0_2_2(model, fsdp, tmp_path):
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    assert version("torchtitan") == T.VERSION  # the release the export states it was checked against

    workload, target, lay = _case(model)
    text = T.job_toml(workload, target, lay, fsdp=fsdp)
    path = tmp_path / "job.toml"
    path.write_text(text)
    written = tomllib.loads(text)
    from_file = ConfigManager().parse_args(["--job.config_file", str(path)])
    from_cli = ConfigManager().parse_args(T.overrides(workload, target, lay, fsdp))
    got_file, got_cli = _settings(from_file, written), _settings(from_cli, written)
    expect = {(s, k): v for s, keys in written.items() for k, v in keys.items()}
    assert got_file == expect
    del expect[("job", "description")]  # free text: not an override
    assert {k: v for k, v in got_cli.items() if k != ("job", "description")} == expect
    assert from_cli.compile.enable is True and from_cli.compile.backend == "neuron"
    if fsdp == "simple":
        assert from_cli.model.name.startswith("simple_fsdp.")


def test_a_false_boolean_is_a_no_flag_torchtitan_takes():
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    assert T.override("compile", "enable", False) == "--compile.no-enable"
    assert ConfigManager().parse_args([T.override("compile", "enable", False)]).compile.enable is False
    assert ConfigManager().parse_args([T.override("compile", "enable", True)]).compile.enable is True


PY03 = os.environ.get("TRNOPT_TORCHTITAN03_PYTHON")
LOAD03 = """
import sys
from torchtitan.config import ConfigManager
c = ConfigManager().parse_args(["--module", "trnopt_job", "--config", "trnopt_job"])
p, t = c.parallelism, c.training
print(type(c).__module__, c.model_spec.flavor, type(c.activation_checkpoint).__qualname__, c.compile.enable,
      c.compile.backend, p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
      p.pipeline_parallel_degree, p.context_parallel_degree, t.local_batch_size, t.global_batch_size, t.seq_len)
"""


@pytest.mark.skipif(not PY03, reason="set TRNOPT_TORCHTITAN03_PYTHON to a Python with torchtitan==0.3.0")
@pytest.mark.parametrize("fsdp", T.FSDP_MODES)
@pytest.mark.parametrize("model", ["llama3-405b", "llama3-8b"])
def test_the_config_module_loads_in_torchtitan_0_3_0(model, fsdp, tmp_path):
    workload, target, lay = _case(model)
    (tmp_path / f"{R.MODULE}.py").write_text(R.config_module(workload, target, lay, fsdp))
    r = subprocess.run([PY03, "-c", LOAD03], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = T.job_config(workload, target, lay, fsdp)
    par, tr = {k: v[0] for k, v in cfg["parallelism"].items()}, {k: v[0] for k, v in cfg["training"].items()}
    trainer = "torchtitan.experiments.graph_trainer.trainer" if fsdp == "simple" else "torchtitan.trainer"
    ac = {"full": "FullAC.Config", "op": "SelectiveAC.Config", "none": "NoneType"}[lay.recompute]
    assert r.stdout.split() == [trainer, {"llama3-405b": "405B", "llama3-8b": "8B"}[model], ac, "True", "neuron",
                                *map(str, (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
                                           lay.tp, lay.pp, lay.cp, tr["local_batch_size"], tr["global_batch_size"],
                                           tr["seq_len"]))]


def test_what_0_3_cannot_express_is_said_not_written():
    workload, target, lay = _case("deepseek-v3")  # EP8 with TP4: 0.3's EP borrows TP ranks
    assert "no expert-TP degree" in R.problem(workload, lay)
    with pytest.raises(ValueError):
        R.config_module(workload, target, lay)
