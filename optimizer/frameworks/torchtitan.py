"""A layout as a torchtitan job config: the TOML of torchtitan 0.2.x and the same as command-line overrides.

Keys, sections and value spellings are those of torchtitan 0.2.2's
``torchtitan/config/job_config.py`` (the release TorchTitan Neuron 0.2.2+neuron.1 builds on):

- ``[parallelism]``: ``data_parallel_replicate_degree`` and ``data_parallel_shard_degree``
  (HSDP when both exceed 1, FSDP when only the shard degree does), ``tensor_parallel_degree``,
  ``pipeline_parallel_degree``, ``pipeline_parallel_schedule``,
  ``pipeline_parallel_microbatch_size``, ``pipeline_parallel_layers_per_stage``,
  ``context_parallel_degree``, ``expert_parallel_degree``, ``expert_tensor_parallel_degree``;
- ``[training]``: ``local_batch_size`` (per data-parallel rank), ``global_batch_size`` (more
  than local x DP means gradient accumulation), ``seq_len``, ``mixed_precision_param``,
  ``mixed_precision_reduce``;
- ``[activation_checkpoint]``: ``mode`` (none, selective, full) and ``selective_ac_option``
  ("op", or a layer frequency);
- ``[compile]``: ``enable`` and ``backend`` ("neuron" for TorchNeuron's torch.compile backend).

Data-parallel sharding is FSDP2 (``fully_shard``, torchtitan's default) or SimpleFSDP
(``fsdp="simple"``): torchtitan 0.2.2 runs SimpleFSDP as the experiment
``torchtitan/experiments/simple_fsdp``, selected by ``model.name = "simple_fsdp.<model>"``
(``experiments/__init__.py``) and ``job.custom_config_module =
"torchtitan.experiments.simple_fsdp.job_config"`` (its integration tests). Neuron recommends
SimpleFSDP for ``torch.compile`` workloads ("How to use torch.distributed on Neuron", cited by
"Tutorial: Train Llama and DeepSeek with SimpleFSDP on Neuron",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/torchtitan/tutorials/tutorial-simple-fsdp-training.html),
and every export compiles with backend "neuron", so SimpleFSDP is the default
(``defaults.TORCHTITAN_FSDP``).

The command-line overrides are in the form torchtitan's CLI (tyro, ``config/manager.py``)
accepts: ``--section.key=value``, and booleans as flags (``--compile.enable``,
``--compile.no-enable``); ``--compile.enable=true`` is refused there ("Unrecognized options").

torchtitan's world size is pp x dp_replicate x dp_shard x cp x tp
(``ParallelDims._validate``); trnopt's dp (expert parallelism included) is dp_replicate x
dp_shard, so the degrees written multiply to the layout's rank count. Later torchtitan
releases replaced the TOML files by a Python config registry but still take
``--section.option=value`` overrides on the command line; ``overrides`` gives the same
settings in that form.
"""

from __future__ import annotations

import math

from trnopt.optimizer import defaults
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.frameworks.profile import TORCHTITAN
from trnopt.optimizer.model.layout import EVERY_NTH, Layout
from trnopt.optimizer.model.target import GIB, Target
from trnopt.optimizer.model.workload import Workload

VERSION = "0.2.2"
FSDP_MODES = ("simple", "fsdp2")
SIMPLE_FSDP_CONFIG = "torchtitan.experiments.simple_fsdp.job_config"  # its JobConfig extension (compile passes)

# trnopt model preset -> torchtitan (model.name, model.flavor): torchtitan/models/llama3/__init__.py
# (llama3_args) and torchtitan/models/deepseek_v3/__init__.py (deepseekv3_args) at v0.2.2.
MODEL_PRESETS = {
    "llama3-8b": ("llama3", "8B"),
    "llama3-70b": ("llama3", "70B"),
    "llama3-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
}

# trnopt recompute -> (activation_checkpoint.mode, selective_ac_option or None). Korthikanti et al.'s
# "selective" is not a torchtitan mode (profile.TORCHTITAN.recompute): a layout carrying it is written with
# per-op SAC, the nearest torchtitan has, and the header's WARNING says the plan was costed otherwise.
AC_MODES = {"none": ("none", None), "op": ("selective", "op"), "selective": ("selective", "op"), "full": ("full", None),
            **{f"every-{n}": ("selective", str(n)) for n in EVERY_NTH}}


def layers_per_stage(layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> int | None:
    """``pipeline_parallel_layers_per_stage`` that gives ``stages`` virtual stages, or None.

    torchtitan 0.2.2 (torchtitan/distributed/pipeline_parallel.py) makes
    ``ceil((layers + first_less + last_less) / layers_per_stage)`` virtual stages, the
    embedding and the output counting as ``first_less`` / ``last_less`` layers (defaults 1).
    """
    effective = layers + first_less + last_less
    for per in range(1, effective + 1):
        if math.ceil(effective / per) == stages:
            return per
    return None


def module_fqns(stage_layers: tuple[int, ...]) -> list[list[str]]:
    """torchtitan 0.2.2's ``parallelism.module_fqns_per_model_part`` of an uneven split: the modules of
    each stage, the embedding on the first and the final norm and output on the last (torchtitan/config/
    job_config.py; the names of torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part``)."""
    out, start, last = [], 0, len(stage_layers) - 1
    for s, n in enumerate(stage_layers):
        out.append((["tok_embeddings"] if s == 0 else []) + [f"layers.{i}" for i in range(start, start + n)]
                   + (["norm", "output"] if s == last else []))
        start += n
    return out


def check_fsdp(fsdp: str) -> None:
    if fsdp not in FSDP_MODES:
        raise ValueError(f"fsdp must be one of {FSDP_MODES}, got {fsdp!r}")


def job_config(workload: Workload, target: Target, layout: Layout,
               fsdp: str = defaults.TORCHTITAN_FSDP) -> dict[str, dict[str, tuple[object, str]]]:
    """The settings the layout decides: section -> key -> (value, comment)."""
    check_fsdp(fsdp)
    lay, t = layout, workload.training
    sharder = "SimpleFSDP" if fsdp == "simple" else "FSDP2"
    dp = lay.dp
    micro = lay.micro_batches(workload)
    par: dict[str, tuple[object, str]] = {
        "data_parallel_replicate_degree": (lay.dp_replicate, "HSDP replicas of the shards (1: plain FSDP)"
                                           if lay.dp_replicate == 1 else
                                           f"HSDP: {lay.dp_replicate} replicas of {lay.dp_shard}-way shards"),
        "data_parallel_shard_degree": (lay.dp_shard, f"{sharder} shards (ZeRO-3) over {lay.dp_shard} ranks"
                                       + (f" x CP {lay.cp} (torchtitan shards over dp_shard x cp)" if lay.cp > 1
                                          else "")),
        "fsdp_reshard_after_forward": ("always", "ZeRO-3: parameters re-gathered in backward (\"default\" keeps "
                                       "them gathered under PP)"),
        "tensor_parallel_degree": (lay.tp, f"TP {lay.tp} [{_span(lay, 'tp')}]; consecutive ranks (tp innermost)"),
        "pipeline_parallel_degree": (lay.pp, f"PP {lay.pp} [{_span(lay, 'pp')}]"),
    }
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = (TORCHTITAN.schedule(lay), "the schedule trnopt's step time assumes")
        par["pipeline_parallel_microbatch_size"] = (lay.micro_batch, f"{micro} micro-batches per step")
    if lay.interleave > 1:
        per = layers_per_stage(workload.model.layers, lay.pp * lay.interleave)
        if per is not None:
            par["pipeline_parallel_layers_per_stage"] = (per, f"{lay.pp * lay.interleave} virtual stages = "
                                                         f"{lay.interleave} per PP rank")
    if lay.stage_layers:
        par["module_fqns_per_model_part"] = (module_fqns(lay.stage_layers), "uneven stages, layers "
                                             f"{','.join(map(str, lay.stage_layers))} (first to last)")
    par["context_parallel_degree"] = (lay.cp, f"CP {lay.cp} [{_span(lay, 'cp')}]" if lay.cp > 1 else "no CP")
    if workload.model.moe is not None or lay.ep > 1:
        if lay.ep_fold > 1:  # parallel_dims.py: with etp 1, EP borrows all of tp and part of dp_shard
            par["expert_parallel_degree"] = (lay.ep, f"EP {lay.ep} = TP {lay.tp} x {lay.ep_dp} of dp_shard "
                                             f"[{_span(lay, 'tp')}; {_span(lay, 'ep')}]")
            par["expert_tensor_parallel_degree"] = (1, "experts whole on each rank (etp = 1): EP folds over TP")
        else:
            par["expert_parallel_degree"] = (lay.ep, f"EP {lay.ep}, the innermost part of dp_shard "
                                             f"[{_span(lay, 'ep')}]")
            par["expert_tensor_parallel_degree"] = (lay.tp, "experts TP-sharded like the dense layers (etp = tp)")
    if lay.pp > 1:
        local, local_note = t.global_batch // dp, f"global batch / DP {dp}: all {micro} micro-batches in one step"
    else:
        local, local_note = lay.micro_batch, f"micro-batch; {micro} per step by gradient accumulation"
    training = {
        "local_batch_size": (local, local_note),
        "global_batch_size": (t.global_batch, "sequences per step"),
        "seq_len": (t.seq, "sequence length the layout was solved for"),
        "mixed_precision_param": ("bfloat16", "BF16 compute, FP32 master weights and Adam state"),
        "mixed_precision_reduce": ("float32", "gradient reduction in FP32"),
    }
    mode, option = AC_MODES[lay.recompute]
    ac = {"mode": (mode, f"trnopt recompute: {lay.recompute}")}
    if option == "op":
        ac["selective_ac_option"] = (option, "per-op SAC: saves every second matmul's output, the attention "
                                     "kernel's and the reduce-scatters'; the other matmuls and all elementwise "
                                     "ops are recomputed (trnopt recompute \"op\")")
    elif option is not None:
        ac["selective_ac_option"] = (option, f"every {option}-th transformer block of a stage checkpointed in full, "
                                     "the others keep their activations")
    job: dict[str, tuple[object, str]] = {"description": (f"trnopt: {workload.model.name} on {lay.domains} x "
                                                          f"{target.name}, {lay.describe()}", "")}
    if fsdp == "simple":
        job["custom_config_module"] = (SIMPLE_FSDP_CONFIG, "SimpleFSDP's config extension")
    out: dict[str, dict[str, tuple[object, str]]] = {"job": job}
    if workload.model.name in MODEL_PRESETS:
        name, flavor = MODEL_PRESETS[workload.model.name]
        if fsdp == "simple":
            name, note = f"simple_fsdp.{name}", f"torchtitan's {name} under SimpleFSDP (experiments/simple_fsdp)"
        else:
            note = "torchtitan model (FSDP2: fully_shard)"
        out["model"] = {"name": (name, note), "flavor": (flavor, f"= trnopt {workload.model.name}")}
    out |= {
        "training": training,
        "parallelism": par,
        "activation_checkpoint": ac,
        "compile": {"enable": (True, "torch.compile through TorchNeuron"),
                    "backend": ("neuron", "TorchNeuron's torch.compile backend")},
    }
    return out


def _span(lay: Layout, dim: str) -> str:
    return " ".join(f"{a.name}{f}" for a, f in lay.span(dim)) or "none"


def _toml_value(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def world_size(cfg: dict) -> int:
    """pp x dp_replicate x dp_shard x cp x tp of a job config (torchtitan ParallelDims)."""
    par = {k: v[0] if isinstance(v, tuple) else v for k, v in cfg["parallelism"].items()}
    return math.prod(par[k] for k in ("pipeline_parallel_degree", "data_parallel_replicate_degree",
                                      "data_parallel_shard_degree", "context_parallel_degree",
                                      "tensor_parallel_degree"))


def header(workload: Workload, target: Target, layout: Layout, e: Evaluation | None) -> list[str]:
    lay = layout
    lines = [f"# torchtitan job config written by trnopt for torchtitan {VERSION} (TorchTitan Neuron "
             "0.2.2+neuron.1):",
             f"# the keys of torchtitan/config/job_config.py at v{VERSION}. Later torchtitan takes the same settings",
             "# as command-line overrides (--parallelism.tensor_parallel_degree=... ; see `overrides`).",
             f"# {workload.model.name} on {lay.domains} x {target.name} ({lay.chips} chips, {lay.ranks} ranks at "
             f"LNC={lay.lnc}): {lay.describe()}",
             f"# world size = pp {lay.pp} x dp_replicate {lay.dp_replicate} x dp_shard {lay.dp_shard} x cp {lay.cp} "
             f"x tp {lay.tp} = {lay.ranks}",
             f"# LNC: run with NEURON_LOGICAL_NC_CONFIG={lay.lnc} and compile with --logical-nc-config={lay.lnc} "
             "(they must agree)"]
    if e is not None:
        lines.append(f"# modelled: {e.step.total:.3f} s/step, {e.tokens_per_s:,.0f} tokens/s, MFU {100 * e.mfu:.1f}%, "
                     f"{e.memory.total / GIB:.1f} of {e.usable_bytes / GIB:.1f} GiB/chip")
    for w in warnings(workload, target, layout):
        lines.append(f"# WARNING: {w}")
    if lay.interleave > 1 and layers_per_stage(workload.model.layers, lay.pp * lay.interleave) is None:
        lines.append(f"# WARNING: no pipeline_parallel_layers_per_stage gives {lay.pp * lay.interleave} virtual stages "
                     f"of {workload.model.layers} layers; set module_fqns_per_model_part by hand")
    if workload.model.name not in MODEL_PRESETS:
        lines.append(f"# [model]: trnopt's {workload.model.name} has no torchtitan preset; set model.name and "
                     "model.flavor yourself")
    return lines


def warnings(workload: Workload, target: Target, layout: Layout) -> list[str]:
    """What torchtitan cannot run of this layout (empty when it runs as planned)."""
    return [w for w in (TORCHTITAN.supports(layout, workload), TORCHTITAN.producible(layout, target)) if w]


def job_toml(workload: Workload, target: Target, layout: Layout, e: Evaluation | None = None,
             fsdp: str = defaults.TORCHTITAN_FSDP) -> str:
    """The job config as TOML (parses with tomllib), comments after each value."""
    lines = header(workload, target, layout, e)
    for section, keys in job_config(workload, target, layout, fsdp).items():
        lines += ["", f"[{section}]"]
        for key, (value, comment) in keys.items():
            line = f"{key} = {_toml_value(value)}"
            lines.append(f"{line:44s} # {comment}" if comment else line)
    return "\n".join(lines) + "\n"


def override(section: str, key: str, value: object) -> str:
    """One setting as torchtitan's CLI takes it: ``--section.key=value``; a boolean is a flag,
    ``--section.key`` or ``--section.no-key`` (tyro's boolean flags); a list of lists (the stages'
    modules) the key, then one argument a stage, its names joined by commas (as tyro reads
    ``list[list[str]]``: checked with torchtitan 0.2.2's ConfigManager)."""
    return " ".join(override_args(section, key, value))


def override_args(section: str, key: str, value: object) -> list[str]:
    """``override``'s command-line arguments, one a list element (one for every value but a list of lists)."""
    if isinstance(value, list):
        return [f"--{section}.{key}", *(",".join(chunk) for chunk in value)]
    if isinstance(value, bool):
        return [f"--{section}.{key}" if value else f"--{section}.no-{key.replace('_', '-')}"]
    return [f"--{section}.{key}={value}"]


def overrides(workload: Workload, target: Target, layout: Layout, fsdp: str = defaults.TORCHTITAN_FSDP) -> list[str]:
    """The same settings as torchtitan command-line overrides (every key but the free-text job.description)."""
    return [arg for section, keys in job_config(workload, target, layout, fsdp).items()
            for key, (value, _) in keys.items() if (section, key) != ("job", "description")
            for arg in override_args(section, key, value)]


def render(workload: Workload, target: Target, e: Evaluation,
           fsdp: str = defaults.TORCHTITAN_FSDP) -> tuple[str, list[str]]:
    """(stdout text, stderr warnings) for ``trnopt solve --format torchtitan``: the TOML, then the overrides."""
    lay = e.layout
    text = job_toml(workload, target, lay, e, fsdp)
    text += f"\n# The same as command-line overrides (checked with torchtitan {VERSION}'s ConfigManager):\n"
    text += "# " + " \\\n#   ".join(overrides(workload, target, lay, fsdp)) + "\n"
    return text, warnings(workload, target, lay)
