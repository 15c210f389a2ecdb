"""The files that run a layout under torchrun: environment, node order, core binding, the rank map they imply.

``launch_files`` returns file name -> text for one scheduler (torchrun by hand, Slurm, or
Kubernetes; the scheduler parts are in schedulers.py). Every file states the assumptions it
relies on. The common files:

- ``env.sh``: the LNC for the runtime (``NEURON_LOGICAL_NC_CONFIG``) and the compiler
  (``--logical-nc-config`` in ``NEURON_CC_FLAGS``; the two must agree, Neuron "Logical
  NeuronCore configuration" page); the EFA variables of the Neuron multi-node setup pages
  (``FI_PROVIDER=efa``, ``FI_EFA_USE_DEVICE_RDMA=1``, ``FI_EFA_FORK_SAFE=1`` on Amazon Linux 2);
  the world size, node count and workers per node.
- ``nodes.csv``: which instance is which torchrun node rank: (UltraServer of the job,
  position in it) -> node rank. This is the node order the plan needs.
- ``ranks.csv``: every rank's node rank, local rank, chip and logical core.
- ``worker.sh``: what torchrun starts for every worker (``torchrun --no-python``): binds the
  local rank to its planned logical core when the plan needs it
  (``NEURON_RT_VISIBLE_CORES``), records the worker's row of the rank map, then runs the
  training command.
- ``expected-rank-map.csv``: the rank map the launch implies, in ``trnopt check-map``'s
  format; ``trnopt check-map --layout L --rank-map expected-rank-map.csv`` passes on it, and
  the rows the workers record (``rank-map/*.csv``, concatenated) are what the job really got.
- ``job.toml``: the torchtitan 0.2.x job config (frameworks/torchtitan.py), FSDP2 or SimpleFSDP;
  ``job-overrides.txt`` the same as torchtitan command-line overrides, one per line;
  ``trnopt_job.py`` the same as a torchtitan 0.3 config-registry module
  (frameworks/torchtitan_registry.py), when 0.3 can express the layout.

On UltraServers ``run-node.sh`` (and the JobSet's pods) set the five variables Neuron's page
"How to schedule MPI jobs to run on Neuron UltraServer on EKS"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/how-to/how-to-ultraserver.html)
says every worker needs, with the values its UltraServer init script gives them
(k8s-ultraserver-init-script.sh):

- ``NEURON_RT_ULTRASERVER_MODE``: the UltraServer configuration passed to the runtime: 1 for
  the 4-node configuration, 2 or 3 for the 2-node one (horizontal or vertical pairs, whichever
  the instance lists in ``/sys/class/neuron_device/ultraserver_mode``, vertical first), 4 for
  one node;
- ``NEURON_RT_ULTRASERVER_SERVER_ID`` / ``NEURON_RT_ULTRASERVER_NODE_ID``: the instance's
  UltraServer id and node id in that configuration (``/sys/class/neuron_device/server_id_<n>``,
  ``node_id_<n>``, n = instances per UltraServer);
- ``NEURON_GLOBAL_TOPOID``: the instance's topology id, its index when the job's instances
  are listed UltraServer by UltraServer, node id within one (the init script sorts by server
  id, then node id); here UltraServer d of the plan, node id i: ``d * n + i``;
- ``NEURON_GLOBAL_TOPOID0_HOST``: the host of topology id 0 (the "leader").

Nodes are numbered once, by ``node_numbering``: ``launch`` and ``solve --format env`` give
every instance the same node rank.

The rank order is torchtitan's (profile.py): torchrun gives node n the ranks n*P .. n*P+P-1,
so the launch chooses only the node order and the core binding (``torchrun_binding``).
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import schedulers, torchtitan, torchtitan_registry
from trnopt.optimizer.frameworks.profile import TORCHTITAN, FrameworkProfile, TorchrunBinding, torchrun_binding
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.partial import physical
from trnopt.optimizer.model.placement import instance_ranks
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload
from trnopt.optimizer import defaults

SCHEDULERS = ("torchrun", "slurm", "k8s")
MASTER_PORT = 29500  # torchrun's default --master-port

# Assumptions every file repeats where it relies on them.
ASSUME_CORES = ("logical NeuronCores 4k..4k+3 of an instance are chip k at LNC=2 (in general: logical core v is "
                "chip v // cores-per-chip); very likely, but not documented explicitly by Neuron")
ASSUME_DEFAULT_BINDING = ("without NEURON_RT_VISIBLE_CORES, torch-neuronx runs local rank i on logical core i of "
                          "the instance")
ASSUME_RING = ("an instance's UltraServer node id (neuron.amazonaws.com/ultraserver-node-id-<n> label, "
               "NEURON_RT_ULTRASERVER_NODE_ID) is its position in the UltraServer's NeuronLink ring; "
               "not documented explicitly")


@dataclass(frozen=True)
class Launch:
    """What the files are written from."""

    workload: Workload
    target: Target
    layout: Layout
    binding: TorchrunBinding
    scheduler: str
    entry: str
    """The training command each worker runs (after worker.sh)."""
    layout_file: str
    """The layout JSON the files were written from (named in their headers)."""
    fsdp: str = defaults.TORCHTITAN_FSDP
    """torchtitan's data-parallel sharding in job.toml: "simple" (SimpleFSDP) or "fsdp2"."""

    @property
    def nodes(self) -> int:
        return self.binding.nodes

    @property
    def nproc(self) -> int:
        return self.binding.nproc_per_node

    @property
    def ultraserver(self) -> bool:
        """Whether a domain is several instances (an UltraServer) that must be scheduled together."""
        return self.target.instances_per_domain > 1

    def title(self) -> str:
        lay = self.layout
        return (f"{self.workload.model.name} on {lay.domains} x {self.target.name} ({self.nodes} instance(s), "
                f"{lay.ranks} ranks at LNC={lay.lnc}): {lay.describe()}")


def entry_words(entry: str) -> list[str]:
    """The training command as words (``shlex.split``), or InputError: empty, a line break or NUL, bad quoting.
    run-node.sh gets them back quoted (``shlex.join``), so nothing in them is run by the shell."""
    if "\n" in entry or "\r" in entry or "\0" in entry:
        raise InputError("--entry", "entry", "must be one line (no line break or NUL character)")
    try:
        words = shlex.split(entry)
    except ValueError as exc:  # an unbalanced quote
        raise InputError("--entry", "entry", f"cannot be split into words: {exc}") from None
    if not words:
        raise InputError("--entry", "entry", "must name a training command, got an empty one")
    return words


def plan(workload: Workload, target: Target, layout: Layout, scheduler: str, entry: str, layout_file: str,
         framework: FrameworkProfile = TORCHTITAN, fsdp: str = defaults.TORCHTITAN_FSDP) -> Launch:
    """The launch of a layout, or InputError naming why this framework and torchrun cannot produce it
    (or why the entry or the sharding is not one)."""
    if scheduler not in SCHEDULERS:
        raise InputError("--scheduler", "scheduler", f"must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if fsdp not in torchtitan.FSDP_MODES:
        raise InputError("--fsdp", "fsdp", f"must be one of {', '.join(torchtitan.FSDP_MODES)}, got {fsdp!r}")
    entry = shlex.join(entry_words(entry))
    for why in (framework.supports(layout, workload), framework.producible(layout, target)):
        if why:
            raise InputError(layout_file, "layout", why)
    binding = torchrun_binding(layout, target)
    assert isinstance(binding, TorchrunBinding)
    launch = Launch(workload, target, layout, binding, scheduler, entry, layout_file, fsdp)
    if scheduler == "k8s":
        schedulers.check_k8s(launch, pod_files(launch))  # before the per-rank files are written
    return launch


# -- node numbering ----------------------------------------------------------------------------------
def node_numbering(layout: Layout, target: Target) -> dict[tuple[int, int], int]:
    """(domain, position in it) -> node rank: the one numbering of the instances of a plan.

    When torchrun can produce the placement, the node rank of an instance is the one that
    gives it its planned ranks (``torchrun_binding``: its lowest rank // workers per node).
    Otherwise the instances are numbered in the order of the lowest rank each holds, which is
    the same rule, so both branches agree wherever both apply.
    """
    binding = torchrun_binding(layout, target)
    if isinstance(binding, TorchrunBinding):
        return binding.node_rank
    slots = [(d, i) for d in range(layout.domains) for i in range(target.instances_per_domain)]
    lowest = {s: min(instance_ranks(layout, target, *s)) for s in slots}
    return {s: n for n, s in enumerate(sorted(slots, key=lowest.__getitem__))}


# -- the rank map the launch implies ------------------------------------------------------------------
def host_name(domain: int, instance: int) -> str:
    """The name the expected rank map gives the instance at (domain, position): on a partial machine
    (--exclude) the whole machine's numbers (``partial.physical``), so the hole's names never appear."""
    return f"us{domain}-node{instance}"


def implied_rank_map(launch: Launch, node_order: dict[int, tuple[int, int]] | None = None) -> str:
    """check-map's rank map (CSV) of where every rank runs when node rank n starts on the instance ``node_order[n]``.

    ``node_order`` maps node rank -> (UltraServer, position) of the instance that really got
    it; by default the plan's (nodes.csv). Local rank l of node n is rank ``n * P + l`` on
    logical core ``binding.local_core[l]`` (chip = core // cores per chip); node by node, local
    rank by local rank is rank order.
    """
    b, per_chip, lnc = launch.binding, launch.layout.ranks_per_chip, launch.layout.lnc
    order = node_order or b.slot
    header = ("rank", "instance", "chip", "core") + (("ultraserver",) if launch.ultraserver else ()) + ("lnc",)

    def rows():
        for n in range(b.nodes):
            domain, instance = physical(launch.target, *order[n])
            host, us = host_name(domain, instance), (f"us{domain}",) if launch.ultraserver else ()
            for local, v in enumerate(b.local_core):
                yield (n * b.nproc_per_node + local, host, v // per_chip, v % per_chip, *us, lnc)
    return _csv(header, rows())


def _csv(header: tuple[str, ...], rows) -> str:
    """CSV text of a header and rows of values, joined without a per-row object kept (millions of rows)."""
    return "".join(itertools.chain([",".join(header) + "\n"], (",".join(map(str, r)) + "\n" for r in rows)))


# -- common files -------------------------------------------------------------------------------------
def env_sh(launch: Launch) -> str:
    lay, lnc = launch.layout, launch.layout.lnc
    lines = [
        "# trnopt launch environment: source it (bash) on every instance before torchrun.",
        f"# {launch.title()}",
        f"# Written from {launch.layout_file} by `trnopt launch`.",
        f"# LNC: the runtime (NEURON_LOGICAL_NC_CONFIG) and the compiler (--logical-nc-config) must agree: LNC={lnc},",
        f"# {lay.ranks_per_chip} logical NeuronCores per chip, {launch.nproc} workers per instance "
        "(one per logical core).",
        f"export NEURON_LOGICAL_NC_CONFIG={lnc}",
        f'export NEURON_CC_FLAGS="${{NEURON_CC_FLAGS:+$NEURON_CC_FLAGS }}--logical-nc-config={lnc}"',
        f"export TRNOPT_WORLD_SIZE={lay.ranks}",
        f"export TRNOPT_NNODES={launch.nodes}",
        f"export TRNOPT_NPROC_PER_NODE={launch.nproc}",
        f"export MASTER_PORT=${{MASTER_PORT:-{MASTER_PORT}}}",
        "# EFA between instances (Neuron multi-node training setup): libfabric's EFA provider with device RDMA.",
    ]
    if launch.nodes == 1:
        lines.append("# (One instance: EFA carries no traffic of this job; the settings are harmless.)")
    lines += [
        "export FI_PROVIDER=efa",
        "export FI_EFA_USE_DEVICE_RDMA=1",
        "# FI_EFA_FORK_SAFE=1 is needed on Amazon Linux 2 only (its kernel lacks the fork support of newer ones).",
        'if [ -r /etc/os-release ] && [ "$(. /etc/os-release && echo "${ID}:${VERSION_ID}")" = "amzn:2" ]; then',
        "  export FI_EFA_FORK_SAFE=1",
        "fi",
    ]
    return "\n".join(lines) + "\n"


def nodes_csv(launch: Launch) -> str:
    return _csv(("node_rank", "ultraserver", "position", "host"),
                ((n, *physical(launch.target, d, i), host_name(*physical(launch.target, d, i)))
                 for n, (d, i) in sorted(launch.binding.slot.items())))


def ranks_csv(launch: Launch) -> str:
    b, per_chip = launch.binding, launch.layout.ranks_per_chip

    def rows():
        for n in range(b.nodes):
            d, i = physical(launch.target, *b.slot[n])
            for local, v in enumerate(b.local_core):
                yield n * b.nproc_per_node + local, n, local, d, i, v // per_chip, v % per_chip, v
    return _csv(("rank", "node_rank", "local_rank", "ultraserver", "position", "chip", "core", "logical_core"), rows())


def worker_sh(launch: Launch) -> str:
    b, per_chip = launch.binding, launch.layout.ranks_per_chip
    lines = [
        "#!/usr/bin/env bash",
        "# One torchrun worker: `torchrun ... --no-python ./worker.sh <training command>`.",
        f"# {launch.title()}",
        "# torchrun sets RANK = GROUP_RANK * nproc_per_node + LOCAL_RANK; with the static rendezvous GROUP_RANK is",
        "# the --node-rank this instance was given from nodes.csv.",
        f"# Assumption: {ASSUME_CORES}.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'source "$here/env.sh"',
    ]
    if b.bound:
        lines += [
            "# The plan puts local ranks on other logical cores than torchrun's default (local rank i on core i):",
            "# bind each worker to its planned core. Entry l of the table is local rank l's core, on every node.",
            "# Assumption: the Neuron runtime honours NEURON_RT_VISIBLE_CORES per process with logical core indices",
            "# at this LNC, and the training script uses the one core it sees.",
            f"TRNOPT_CORES='{','.join(map(str, b.local_core))}'",
            'core=$(printf "%s" "$TRNOPT_CORES" | cut -d, -f"$((LOCAL_RANK + 1))")',
            "export NEURON_RT_VISIBLE_CORES=$core",
        ]
    else:
        lines += [
            "# The plan's local rank i is logical core i: torchrun's and torch-neuronx's default, no binding set.",
            f"# Assumption: {ASSUME_DEFAULT_BINDING}.",
            "core=$LOCAL_RANK",
        ]
    lines += [
        "# Record where this rank runs, as a row of `trnopt check-map`'s rank map (rank,instance,chip,core,...).",
        'mkdir -p "${TRNOPT_RANK_MAP_DIR:-$here/rank-map}"',
        f'printf "%s,%s,%s,%s,%s,%s\\n" "$RANK" "${{TRNOPT_INSTANCE:-$(hostname)}}" "$((core / {per_chip}))" "$((core % {per_chip}))" '
        '"${TRNOPT_ULTRASERVER:-}" "$NEURON_LOGICAL_NC_CONFIG" > "${TRNOPT_RANK_MAP_DIR:-$here/rank-map}/rank-$RANK.csv"',
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"


def readme(launch: Launch, files: dict[str, str]) -> str:
    lines = [f"trnopt launch files ({launch.scheduler}): {launch.title()}",
             f"Written from {launch.layout_file}.", "",
             "Files:"]
    lines += [f"  {name}" for name in sorted(files)]
    why = torchtitan_registry.problem(launch.workload, launch.layout)
    module = torchtitan_registry.MODULE
    lines += ["", f"torchtitan {torchtitan.VERSION} (TorchTitan Neuron 0.2.2+neuron.1): run-node.sh runs the entry with "
              "--job.config_file job.toml; job-overrides.txt holds the same settings as command-line overrides.",
              f"torchtitan {torchtitan_registry.VERSION} (config registry): "
              + (f"not written: {why}." if why else
                 f"MASTER_ADDR=... ./run-node.sh NODE_RANK python -m torchtitan.train --module {module} "
                 f"--config {module} (run-node.sh puts this directory on PYTHONPATH)."),
              f"Data-parallel sharding: {'SimpleFSDP' if launch.fsdp == 'simple' else 'FSDP2'} (trnopt launch --fsdp).",
              "",
              "Check what the job got: concatenate the rows the workers wrote, with a header, and run",
              "  (echo rank,instance,chip,core,ultraserver,lnc; cat rank-map/rank-*.csv) > rank-map.csv",
              f"  trnopt check-map --layout {launch.layout_file} --rank-map rank-map.csv",
              "(expected-rank-map.csv is the map this launch implies; check-map passes on it.)", "",
              "Assumptions:",
              f"  - {ASSUME_CORES};",
              f"  - {ASSUME_DEFAULT_BINDING};"]
    if launch.binding.bound:
        lines.append("  - the Neuron runtime honours NEURON_RT_VISIBLE_CORES per worker (logical core indices);")
    if launch.ultraserver:
        lines.append(f"  - {ASSUME_RING};")
    lines.append("  - torchrun's static rendezvous (--node-rank, --master-addr) numbers the nodes; the c10d "
                 "rendezvous would choose the node order itself.")
    return "\n".join(lines) + "\n"


def pod_files(launch: Launch) -> dict[str, str]:
    """The files every instance reads (the scheduler's run-node.sh besides)."""
    w, t, lay = launch.workload, launch.target, launch.layout
    files = {"env.sh": env_sh(launch), "worker.sh": worker_sh(launch), "nodes.csv": nodes_csv(launch),
             "job.toml": torchtitan.job_toml(w, t, lay, fsdp=launch.fsdp),
             "job-overrides.txt": "\n".join(torchtitan.overrides(w, t, lay, launch.fsdp)) + "\n"}
    if torchtitan_registry.problem(w, lay) is None:
        files[f"{torchtitan_registry.MODULE}.py"] = torchtitan_registry.config_module(w, t, lay, launch.fsdp)
    return files


def launch_files(launch: Launch) -> dict[str, str]:
    """file name -> text for the launch's scheduler."""
    files = {**pod_files(launch), "ranks.csv": ranks_csv(launch), "expected-rank-map.csv": implied_rank_map(launch)}
    files |= schedulers.files(launch)
    files["README.txt"] = readme(launch, files)
    return files
