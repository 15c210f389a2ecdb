"""A layout as the settings a training job reads: torchtitan job config, NxD Training YAML keys, environment lines.

``trnopt solve --format torchtitan`` prints the torchtitan job config (frameworks/torchtitan.py).

``trnopt solve --format nxd`` prints the keys of a NeuronX Distributed Training (NxD
Training) YAML config that the layout decides, to merge into a config such as the
examples' ``hf_llama3_70B_trn2_config.yaml``. Key names and nesting follow the NxD Training
page "YAML Configuration Settings"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-training/general/config_overview.html):

- ``trainer.devices`` (worker processes per node), ``trainer.num_nodes``, ``trainer.lnc``;
- ``exp_manager.checkpoint_callback_params.every_n_train_steps``;
- ``distributed_strategy.tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
  ``virtual_pipeline_model_parallel_size``, ``zero1``, ``sequence_parallel``, and
  ``context_parallel_size`` / ``expert_model_parallel_size`` as in the NxD Training
  example configs for context parallelism and Mixtral;
- ``data.micro_batch_size``, ``data.global_batch_size``;
- ``model.encoder_seq_length``, ``model.activations_checkpoint_granularity``
  (``selective``, ``full`` or ``null``) and ``model.activations_checkpoint_recompute``.

NxD Training has ZeRO-1 only (``zero1``). When trnopt's layout uses ZeRO-2 or ZeRO-3 the
export says so in a comment and the CLI warns on stderr, with the memory the same layout
needs under ZeRO-1 (scored by the cost model).

``trnopt solve --format env`` numbers the nodes as ``trnopt launch`` does (``launch.node_numbering``:
an instance's node rank is the same in both), and prints bash lines to source on every instance: the LNC for the
runtime (``NEURON_LOGICAL_NC_CONFIG``) and for the compiler (``--logical-nc-config`` in
``NEURON_CC_FLAGS``, which must match: Neuron "Logical NeuronCore configuration" page),
the world size, the torchrun node count and processes per node, and the rank ordering.
torchrun numbers workers ``RANK = NODE_RANK * nproc_per_node + LOCAL_RANK`` and
torch-neuronx puts local rank i on the instance's logical NeuronCore i (chip i // cores, core
i % cores, cores = logical cores per chip). NxD builds its TP groups from consecutive ranks
with PP outermost (``parallel_state.initialize_model_parallel``), the same order as trnopt's
ranks (tp, cp, ep, dp, pp; tp fastest), so the plan lands when torchrun's rank of each
(node, logical core) is the planned rank there. When it is not (the plan puts ranks that are
not consecutive on one instance, e.g. pipeline stages inside an instance), the lines carry a
table of the planned rank per (node, local rank) and set ``RANK`` from it; the workers must
then be started through the file (torchrun ``--no-python``) with the static rendezvous, where
torchrun's ``GROUP_RANK`` equals ``--node_rank``. Assumption: trnopt's chip number within an
instance (x + 4y on the Trn2 torus) is the Neuron device index; ``trnopt check-map`` checks
what a job actually got.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.frameworks import torchtitan
from trnopt.optimizer.frameworks.launch import node_numbering
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.partial import physical
from trnopt.optimizer.model.placement import instance_ranks
from trnopt.optimizer.search.driver import SearchResult
from trnopt.optimizer.model.target import GIB, Target
from trnopt.optimizer.model.workload import Workload

FORMATS = ("torchtitan", "nxd", "env")


# -- NxD Training YAML ----------------------------------------------------------------------------
def checkpoint_steps(e: Evaluation) -> int:
    """Young's interval (reliability model) in whole training steps of the modelled step time."""
    return max(1, round(e.reliability.interval_s / e.step.total))


def _yaml_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    return str(value)


def _yaml_lines(tree: dict, indent: int = 0) -> list[str]:
    """Nested dicts of (value, comment) leaves as block YAML; comments after the value."""
    out = []
    for key, node in tree.items():
        pad = "  " * indent
        if isinstance(node, dict):
            out.append(f"{pad}{key}:")
            out += _yaml_lines(node, indent + 1)
        else:
            value, comment = node
            line = f"{pad}{key}: {_yaml_scalar(value)}"
            out.append(f"{line:52s} # {comment}" if comment else line)
    return out


def zero_warning(workload: Workload, target: Target, e: Evaluation, headroom: float) -> str:
    """Empty when NxD's zero1 is the layout's ZeRO stage; else what ZeRO-1 would need."""
    lay = e.layout
    if lay.zero <= 1:
        return ""
    z1 = Problem(workload, target, lay.domains, headroom).evaluate(replace(lay, zero=1))
    fit = "fits" if z1.fits else "does NOT fit"
    return (f"trnopt chose ZeRO-{lay.zero} but NxD Training offers only zero1 (optimizer state sharded over DP); "
            f"under ZeRO-1 this layout needs {z1.memory.total / GIB:.1f} GiB/chip of {z1.usable_bytes / GIB:.1f} "
            f"usable and {fit}")


def nxd_tree(workload: Workload, target: Target, e: Evaluation, headroom: float) -> dict:
    lay = e.layout
    per_node = lay.ranks_per_chip * target.chips_per_instance
    nodes = lay.domains * target.instances_per_domain
    dp = lay.dp // lay.ep
    strategy: dict = {
        "tensor_model_parallel_size": (lay.tp, f"TP {lay.tp} [{_span(lay, 'tp')}]"),
        "pipeline_model_parallel_size": (lay.pp, f"PP {lay.pp} [{_span(lay, 'pp')}]"),
        "virtual_pipeline_model_parallel_size": (lay.interleave, "interleaved stages per rank (1 = plain 1F1B)"),
    }
    if lay.cp > 1:
        strategy["context_parallel_size"] = (lay.cp, f"CP {lay.cp} [{_span(lay, 'cp')}]")
    if workload.model.moe is not None or lay.ep > 1:
        strategy["expert_model_parallel_size"] = (lay.ep, f"EP {lay.ep}, carved out of DP {lay.dp} "
                                                  f"[{_span(lay, 'ep')}]")
    zero_note = "ZeRO-1: master weights and Adam state sharded over DP"
    if lay.zero == 0:
        zero_note = "ZeRO-0: no optimizer sharding"
    elif lay.zero > 1:
        zero_note = f"trnopt chose ZeRO-{lay.zero}; NxD Training has zero1 only (see the warning above)"
    strategy["zero1"] = (lay.zero >= 1, zero_note)
    strategy["sequence_parallel"] = (lay.tp > 1, "with TP, as trnopt's memory and TP terms assume" if lay.tp > 1
                                     else "no TP, nothing to shard")
    granularity = {"none": None, "selective": "selective", "full": "full"}[lay.recompute]
    model: dict = {
        "encoder_seq_length": (workload.training.seq, "sequence length the layout was solved for"),
        "activations_checkpoint_granularity": (granularity, f"trnopt recompute: {lay.recompute}"),
    }
    if lay.recompute == "selective":
        model["activations_checkpoint_recompute"] = (["CoreAttention"], "selective = attention only "
                                                     "(Korthikanti et al. 2022)")
    return {
        "trainer": {
            "devices": (per_node, f"workers per node = logical NeuronCores per {target.instance} at LNC={lay.lnc}"),
            "num_nodes": (nodes, f"{lay.domains} domain(s) x {target.instances_per_domain} instance(s)"),
            "lnc": (lay.lnc, "= NEURON_LOGICAL_NC_CONFIG; the compiler's --logical-nc-config must match"),
        },
        "exp_manager": {"checkpoint_callback_params": {
            "every_n_train_steps": (checkpoint_steps(e), f"Young's interval {e.reliability.interval_s / 60:.1f} min "
                                    f"at a modelled {e.step.total:.3f} s/step"),
        }},
        "distributed_strategy": strategy,
        "data": {
            "micro_batch_size": (lay.micro_batch, f"{lay.micro_batches(workload)} micro-batches per step "
                                 f"on each of the {dp} data-parallel replicas"),
            "global_batch_size": (workload.training.global_batch, "sequences per step"),
        },
        "model": model,
    }


def _span(lay: Layout, dim: str) -> str:
    return " ".join(f"{a.name}{f}" for a, f in lay.span(dim)) or "none"


def nxd_yaml(workload: Workload, target: Target, e: Evaluation, headroom: float) -> str:
    lay = e.layout
    lines = ["# NeuronX Distributed Training settings chosen by trnopt; merge these keys into your training",
             "# config (names and nesting of the NxD Training 'YAML Configuration Settings' page).",
             f"# {workload.model.name} on {lay.domains} x {target.name} ({lay.chips} chips, {lay.ranks} ranks): "
             f"{lay.describe()}",
             f"# modelled: {e.step.total:.3f} s/step, {e.tokens_per_s:,.0f} tokens/s, MFU {100 * e.mfu:.1f}%, "
             f"{e.memory.total / GIB:.1f} of {e.usable_bytes / GIB:.1f} GiB/chip"]
    warning = zero_warning(workload, target, e, headroom)
    if warning:
        lines.append(f"# WARNING: {warning}")
    return "\n".join(lines + _yaml_lines(nxd_tree(workload, target, e, headroom))) + "\n"


# -- launch environment ---------------------------------------------------------------------------
def rank_table(layout: Layout, target: Target, numbering: dict[tuple[int, int], int]) -> list[list[int]]:
    """``table[node_rank][local_rank]`` = planned rank; local rank i is logical core i of the node, node ranks
    as ``launch.node_numbering`` gives them (the numbering of `trnopt launch`'s nodes.csv)."""
    table: list[list[int]] = [[] for _ in numbering]
    for (domain, instance), n in numbering.items():
        table[n] = instance_ranks(layout, target, domain, instance)  # by chip, then core: logical core order
    return table


def torchrun_order_holds(table: list[list[int]]) -> bool:
    """True when torchrun's own numbering (node_rank * nproc + local_rank) is the planned one."""
    per = len(table[0])
    return all(r == n * per + i for n, row in enumerate(table) for i, r in enumerate(row))


def node_rank_lines(target: Target, numbering: dict[tuple[int, int], int]) -> list[str]:
    """How NODE_RANK is numbered: the numbering `trnopt launch` writes to nodes.csv (``node_numbering``)."""
    ipd = target.instances_per_domain
    where = "domain" if ipd == 1 else "UltraServer"
    lines = ["# NODE_RANK: the node rank `trnopt launch` gives the instance in its nodes.csv (one numbering for both)."]
    if target.remaining is None and all(n == d * ipd + i for (d, i), n in numbering.items()):
        rule = f"{ipd} * {where} + position in it" if ipd > 1 else "the instance's index in the job"
        lines.append(f"# Here NODE_RANK = {rule}"
                     + (" (ring position)" if any(a.kind == "ring" for a in target.domain_axes) else "") + ".")
        return lines
    lines.append(f"# Line n + 1 of TRNOPT_NODE_TABLE is node rank n's {where} of the job and position in it.")
    slots = sorted(numbering, key=numbering.__getitem__)
    # a partial machine (--exclude) names the whole machine's UltraServers and positions, as nodes.csv does
    return lines + ["TRNOPT_NODE_TABLE='" + "\n".join("{} {}".format(*physical(target, d, i)) for d, i in slots) + "'"]


def ultraserver_env_lines(ipd: int) -> list[str]:
    """The UltraServer runtime variables (Neuron, "How to schedule MPI jobs to run on Neuron UltraServer on
    EKS"), as far as a file sourced on every instance can set them without its node rank: the mode of a 4-node
    configuration, the server and node id from sysfs; the topology id and its host are the user's to set, as
    `trnopt launch`'s run-node.sh does. Nothing here exits (the file is sourced)."""
    if ipd == 1:
        return []
    sysfs = "/sys/class/neuron_device"
    lines = ["# UltraServer runtime variables every worker needs (Neuron, \"How to schedule MPI jobs to run on Neuron",
             "# UltraServer on EKS\"):"]
    if ipd == 4:
        lines.append('export NEURON_RT_ULTRASERVER_MODE="${NEURON_RT_ULTRASERVER_MODE:-1}"  # the 4-node configuration')
    else:
        lines.append(f"# NEURON_RT_ULTRASERVER_MODE: set it for the {ipd}-node configuration ({sysfs}/ultraserver_mode).")
    for var, f in (("SERVER_ID", f"server_id_{ipd}"), ("NODE_ID", f"node_id_{ipd}")):
        lines.append(f'if [ -z "${{NEURON_RT_ULTRASERVER_{var}:-}}" ] && [ -r {sysfs}/{f} ]; then '
                     f"NEURON_RT_ULTRASERVER_{var}=$(cat {sysfs}/{f}); fi; export NEURON_RT_ULTRASERVER_{var}")
    return lines + [f"# Set NEURON_GLOBAL_TOPOID = {ipd} * UltraServer of the job + node id, and NEURON_GLOBAL_TOPOID0_HOST",
                    "# = the host of UltraServer 0, node 0 (`trnopt launch` writes a run-node.sh that does)."]


def env_script(workload: Workload, target: Target, layout: Layout) -> str:
    lay, lnc = layout, layout.lnc
    numbering = node_numbering(lay, target)
    table = rank_table(lay, target, numbering)
    nodes, per = len(table), len(table[0])
    ipd = target.instances_per_domain
    lines = [
        f"# trnopt launch environment: {workload.model.name} on {lay.domains} x {target.name}, {lay.describe()}",
        "# Source it (bash) on every instance before starting the job.",
        f"export NEURON_LOGICAL_NC_CONFIG={lnc}",
        f'export NEURON_CC_FLAGS="${{NEURON_CC_FLAGS:+$NEURON_CC_FLAGS }}--logical-nc-config={lnc}"',
        f"export WORLD_SIZE={lay.ranks}",
        f"export TRNOPT_NNODES={nodes}",
        f"export TRNOPT_NPROC_PER_NODE={per}",
        f"# NEURON_LOGICAL_NC_CONFIG (runtime) and --logical-nc-config (compiler) must agree: LNC={lnc},",
        f"# {lay.ranks_per_chip} logical cores per chip, {per} workers per instance, {lay.ranks} in all.",
        "#",
        "# Launcher (static rendezvous, so that torchrun's GROUP_RANK is --node_rank):",
        "#   torchrun --nnodes=$TRNOPT_NNODES --nproc_per_node=$TRNOPT_NPROC_PER_NODE --node_rank=$NODE_RANK \\",
        "#            --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT ...",
    ]
    lines += node_rank_lines(target, numbering)
    lines += ultraserver_env_lines(ipd)
    lines.append(f"# Local rank i runs on logical NeuronCore i of its instance: chip i // {lay.ranks_per_chip}, "
                 f"core i % {lay.ranks_per_chip}.")
    if torchrun_order_holds(table):
        lines += ["# Rank ordering: torchrun's own numbering (RANK = NODE_RANK * nproc_per_node + LOCAL_RANK) is the",
                  "# planned one; nothing else to set.",
                  "export TRNOPT_RANK_REMAP=0"]
        return "\n".join(lines) + "\n"
    lines += [
        "# Rank ordering: the plan puts ranks that are not consecutive on one instance, so torchrun's own",
        "# numbering would not land them as planned. Start the workers through this file so that each takes",
        "# its planned rank, e.g.",
        "#   torchrun ... --no-python bash -c 'source trnopt-env.sh && exec python train.py ...'",
        "# Line n + 1 of TRNOPT_RANK_TABLE lists the planned rank of local ranks 0, 1, ... on node rank n.",
        "# (The training script must take its rank from the RANK variable, as torch.distributed's env:// does.)",
        "export TRNOPT_RANK_REMAP=1",
        "TRNOPT_RANK_TABLE='" + "\n".join(" ".join(map(str, row)) for row in table) + "'",
        'if [ -n "${GROUP_RANK:-}" ] && [ -n "${LOCAL_RANK:-}" ]; then',
        '  RANK=$(printf \'%s\\n\' "$TRNOPT_RANK_TABLE" | awk -v n="$GROUP_RANK" -v l="$LOCAL_RANK" '
        "'NR == n + 1 { print $(l + 1) }')",
        "  export RANK",
        "fi",
    ]
    return "\n".join(lines) + "\n"


# -- what the CLI calls ---------------------------------------------------------------------------
def render(fmt: str, result: SearchResult) -> tuple[str, list[str]]:
    """(text for stdout, warnings for stderr) of a solved problem in one of FORMATS."""
    p, e = result.problem, result.best
    if fmt == "torchtitan":
        return torchtitan.render(p.workload, p.target, e)
    if fmt == "nxd":
        warning = zero_warning(p.workload, p.target, e, p.headroom)
        return nxd_yaml(p.workload, p.target, e, p.headroom), [warning] if warning else []
    if fmt == "env":
        return env_script(p.workload, p.target, e.layout), []
    raise ValueError(f"unknown export format {fmt!r}")


def write(fmt: str, result: SearchResult) -> None:
    text, warnings = render(fmt, result)
    sys.stdout.write(text)
    for w in warnings:
        print(f"trnopt: warning: {w}", file=sys.stderr)
