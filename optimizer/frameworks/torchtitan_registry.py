"""A layout as a torchtitan 0.3 config module: the config-registry style TorchTitan Neuron's tutorials use.

torchtitan 0.3 selects a config with ``--module M --config F``: ``ConfigManager``
(torchtitan/config/manager.py at v0.3.0) imports ``M.config_registry``, else ``M`` itself, and
calls the function ``F`` for a ``Trainer.Config``; ``--section.key`` overrides follow. The
module written here (``trnopt_job.py``) starts from torchtitan's own preset of the model
(``torchtitan/models/<m>/config_registry.py``: ``llama3_8b``, ``llama3_70b``, ``llama3_405b``,
``deepseek_v3_671b``) and sets what the layout decides, with the field names of
``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``, ``CompileConfig``)
and the activation-checkpoint policies of ``torchtitan/distributed/activation_checkpoint.py``
(``SelectiveAC``, ``FullAC``, or ``None``).

SimpleFSDP in 0.3 is the graph trainer (``torchtitan/experiments/graph_trainer``): the preset
goes through ``to_graph_trainer_config`` with the graph trainer's model registry, and its
compile config ``GraphTrainerCompileConfig`` takes ``mode="jit"`` with backend "neuron" (the
"Neuron JIT GraphTrainer path" of Neuron's SimpleFSDP tutorial,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/torchtitan/tutorials/tutorial-simple-fsdp-training.html).

What 0.3 cannot express, ``problem`` says (the module is then not written): torchtitan 0.3's
expert parallelism borrows ranks from FSDP and TP (``efsdp = dp_shard * cp * tp / ep``,
``ParallelismConfig.expert_parallel_degree``) and has no expert-TP degree, so trnopt's EP
inside DP with experts TP-sharded like the dense layers is not a 0.3 mesh when TP > 1; nor
is a layer-frequency selective checkpoint (0.3 has per-op SAC only).
"""

from __future__ import annotations

from trnopt.optimizer import defaults
from trnopt.optimizer.frameworks import torchtitan
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload

VERSION = "0.3.0"
MODULE = "trnopt_job"  # file trnopt_job.py, config function trnopt_job

# trnopt model -> (torchtitan model package, the 0.3 config_registry preset the module starts from, flavor).
# torchtitan's llama3_405b preset swaps in Float8Linear layers (CUDA SM89+ only: it raises on other
# hardware) and async TP (CUDA symmetric memory); the module starts from llama3_70b's BF16 preset
# instead and sets the 405B model (the same vocabulary, so the same loss).
PRESETS = {
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-405b": ("llama3", "llama3_70b", "405B"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
}
HF_ASSETS = {"llama3-405b": "./assets/hf/Llama-3.1-405B"}  # the llama3_405b preset's, as its base is another
# trnopt recompute -> the 0.3 activation-checkpoint config expression
AC = {"none": "None", "op": "SelectiveAC.Config()", "full": "FullAC.Config()"}
# the 0.2.x parallelism keys that 0.3's ParallelismConfig also has (expert_tensor_parallel_degree is gone)
PARALLELISM_KEYS = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage",
                    "context_parallel_degree", "expert_parallel_degree")
TRAINING_KEYS = ("local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "mixed_precision_reduce")


def problem(workload: Workload, layout: Layout) -> str | None:
    """Why the layout has no torchtitan 0.3 config module, or None."""
    if workload.model.name not in PRESETS:
        return f"torchtitan {VERSION} has no preset of trnopt's {workload.model.name}"
    if layout.ep > 1 and layout.tp > 1 and layout.ep_fold == 1:  # expert TP 1 is 0.3's own fold over TP
        return (f"torchtitan {VERSION}'s expert parallelism borrows ranks from TP (efsdp = dp_shard x cp x tp / ep) "
                f"and has no expert-TP degree, so EP {layout.ep} with experts TP{layout.tp}-sharded is not a "
                f"{VERSION} mesh; use the 0.2.x job.toml")
    if layout.stage_layers:
        return (f"uneven pipeline stages are written only to the 0.2.x job.toml (module_fqns_per_model_part, checked "
                f"with torchtitan 0.2.2); this {VERSION} module would run even stages: use the 0.2.x job.toml")
    if layout.recompute not in AC:
        return f"torchtitan {VERSION} has no layer-frequency checkpointing ({layout.recompute}); use the 0.2.x job.toml"
    return None


def config_module(workload: Workload, target: Target, layout: Layout, fsdp: str = defaults.TORCHTITAN_FSDP) -> str:
    """The Python text of ``trnopt_job.py``; ValueError when ``problem`` names a reason."""
    why = problem(workload, layout)
    if why:
        raise ValueError(why)
    cfg = torchtitan.job_config(workload, target, layout, fsdp)  # the 0.2.x values; the sharding is set below
    package, preset, flavor = PRESETS[workload.model.name]
    lay = layout
    lines = [
        f'"""trnopt: {workload.model.name} on {lay.domains} x {target.name}, {lay.describe()}.',
        "",
        f"A torchtitan {VERSION} config-registry module (checked by loading it with torchtitan {VERSION}'s",
        "ConfigManager). Put this file on PYTHONPATH (run-node.sh does) and run",
        f"    python -m torchtitan.train --module {MODULE} --config {MODULE}",
        f"Data-parallel sharding: {'SimpleFSDP (graph trainer, compiled)' if fsdp == 'simple' else 'FSDP2'}.",
        '"""',
        "",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401",
        f"from torchtitan.models.{package} import model_registry",
        f"from torchtitan.models.{package}.config_registry import {preset}",
    ]
    if fsdp == "simple":
        lines += ["from torchtitan.experiments.graph_trainer.configs import GraphTrainerCompileConfig, "
                  "to_graph_trainer_config",
                  f"from torchtitan.experiments.graph_trainer.{package} import model_registry as graph_model_registry"]
    lines += ["", "", "def _base():",
              f"    config = {preset}()",
              f'    config.model_spec = model_registry("{flavor}")  # BF16, no converters: what trnopt costs',
              *([f'    config.hf_assets_path = "{HF_ASSETS[workload.model.name]}"']
                if workload.model.name in HF_ASSETS else []),
              "    return config", "", "", f"def {MODULE}():"]
    if fsdp == "simple":
        lines += ["    config = to_graph_trainer_config(_base(), graph_model_registry)  # SimpleFSDP",
                  '    config.compile = GraphTrainerCompileConfig(enable=True, mode="jit", backend="neuron")']
    else:
        lines += ["    config = _base()",
                  "    config.compile.enable = True",
                  "    config.compile.enable_async_tensor_parallel = False  # CUDA symmetric memory only",
                  '    config.compile.backend = "neuron"  # TorchNeuron\'s torch.compile backend']
    for section, keys in (("parallelism", PARALLELISM_KEYS), ("training", TRAINING_KEYS)):
        for key in keys:
            if key in cfg[section]:
                value, comment = cfg[section][key]
                lines.append(f"    config.{section}.{key} = {value!r}  # {comment}")
    lines += [f"    config.activation_checkpoint = {AC[lay.recompute]}  # trnopt recompute: {lay.recompute}",
              "    return config", ""]
    return "\n".join(lines)
