"""The UltraServer runtime variables of a launch: run-node.sh's lines and the JobSet pods' env.

Neuron's page "How to schedule MPI jobs to run on Neuron UltraServer on EKS"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/how-to/how-to-ultraserver.html)
says every worker needs NEURON_RT_ULTRASERVER_MODE, NEURON_RT_ULTRASERVER_SERVER_ID,
NEURON_RT_ULTRASERVER_NODE_ID, NEURON_GLOBAL_TOPOID and NEURON_GLOBAL_TOPOID0_HOST; the values
are those its UltraServer init script (k8s-ultraserver-init-script.sh) writes (launch.py's
docstring lists them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trnopt.optimizer.frameworks.launch import Launch


# NEURON_RT_ULTRASERVER_MODE by instances per UltraServer (Neuron's k8s-ultraserver-init-script.sh: 1 = the
# 4-node configuration, 2 / 3 = 2-node horizontal / vertical, 4 = one node); the 2-node mode is read at run time.
ULTRASERVER_MODE = {4: "1", 1: "4"}


def topology_id(launch: Launch, domain: int, instance: int) -> int:
    """NEURON_GLOBAL_TOPOID of the instance at (domain, position): UltraServer by UltraServer, node id within.
    On a partial machine (--exclude) the node ids are the whole ring's positions, so the id within is
    the position's rank among its UltraServer's positions in the plan (the init script sorts by node id)."""
    rem = launch.target.remaining
    within = instance if rem is None else sorted(rem.instances[domain]).index(rem.instances[domain][instance])
    return domain * launch.target.instances_per_domain + within


def run_node_lines(launch: Launch) -> list[str]:
    """run-node.sh's lines that export the five UltraServer variables (after NODE_RANK and ``planned``), or none
    when every domain is one instance. Values already in the environment (a pod spec) are kept."""
    if not launch.ultraserver:
        return []
    n = launch.target.instances_per_domain
    sysfs = "/sys/class/neuron_device"
    master_is_topo0 = launch.binding.node_rank[(0, 0)] == 0
    lines = [
        "# UltraServer runtime variables every worker needs (Neuron, \"How to schedule MPI jobs to run on Neuron",
        "# UltraServer on EKS\"), with the values of its init script: the mode of the configuration, this instance's",
        f"# UltraServer and node id ({sysfs}/server_id_{n}, node_id_{n}), its topology id (UltraServer d of the",
        f"# plan, node id i: d * {n} + i) and the host of topology id 0.",
        "us_read() { if [ -r \"$1\" ]; then cat \"$1\"; else echo \"run-node.sh: cannot read $1; set $2\" >&2; "
        "exit 1; fi; }",
    ]
    if n in ULTRASERVER_MODE:
        lines.append(f'export NEURON_RT_ULTRASERVER_MODE="${{NEURON_RT_ULTRASERVER_MODE:-{ULTRASERVER_MODE[n]}}}"')
    elif n == 2:
        lines += [
            'if [ -z "${NEURON_RT_ULTRASERVER_MODE:-}" ]; then',
            f'  modes=$(us_read {sysfs}/ultraserver_mode NEURON_RT_ULTRASERVER_MODE)',
            '  case " $(echo "$modes" | tr -c "0-9" " ") " in',
            '    *" 3 "*) NEURON_RT_ULTRASERVER_MODE=3 ;;',
            '    *" 2 "*) NEURON_RT_ULTRASERVER_MODE=2 ;;',
            '    *) echo "run-node.sh: this instance supports no 2-node UltraServer mode ($modes)" >&2; exit 1 ;;',
            "  esac",
            "fi",
            "export NEURON_RT_ULTRASERVER_MODE",
        ]
    else:
        lines += [f"# Neuron documents the modes of 1-, 2- and 4-node configurations only, not of {n} nodes:",
                  "# set NEURON_RT_ULTRASERVER_MODE yourself.",
                  f': "${{NEURON_RT_ULTRASERVER_MODE:?set NEURON_RT_ULTRASERVER_MODE for {n}-node UltraServers}}"',
                  "export NEURON_RT_ULTRASERVER_MODE"]
    lines += [
        "NEURON_RT_ULTRASERVER_SERVER_ID=${NEURON_RT_ULTRASERVER_SERVER_ID:-$(us_read "
        f"{sysfs}/server_id_{n} NEURON_RT_ULTRASERVER_SERVER_ID)}}",
        "NEURON_RT_ULTRASERVER_NODE_ID=${NEURON_RT_ULTRASERVER_NODE_ID:-$(us_read "
        f"{sysfs}/node_id_{n} NEURON_RT_ULTRASERVER_NODE_ID)}}",
        "export NEURON_RT_ULTRASERVER_SERVER_ID NEURON_RT_ULTRASERVER_NODE_ID",
        f'export NEURON_GLOBAL_TOPOID=$((planned_us * {n} + planned))' if launch.target.remaining is None else
        # a partial machine: the plan's topology id of each node rank (node ids are the whole ring's positions)
        'export NEURON_GLOBAL_TOPOID=$(case "$NODE_RANK" in '
        + " ".join(f"{r}) echo {topology_id(launch, d, i)};;" for r, (d, i) in sorted(launch.binding.slot.items()))
        + " esac)",
    ]
    if master_is_topo0:
        lines.append('export NEURON_GLOBAL_TOPOID0_HOST="${NEURON_GLOBAL_TOPOID0_HOST:-$MASTER_ADDR}"'
                     "  # node rank 0 is topology id 0")
    else:
        lines += [': "${NEURON_GLOBAL_TOPOID0_HOST:?set NEURON_GLOBAL_TOPOID0_HOST to the host of UltraServer 0, '
                  'node 0 in nodes.csv}"', "export NEURON_GLOBAL_TOPOID0_HOST"]
    return lines



def pod_env(launch: Launch, name: str, d: int, i: int) -> list[str]:
    """The UltraServer variables a pod's placement fixes (run-node.sh reads the server id and, for 2-node
    UltraServers, the mode on the instance)."""
    if not launch.ultraserver:
        return []
    n = launch.target.instances_per_domain
    topo0 = f"{name}-node-{launch.binding.node_rank[(0, 0)]}-0-0.{name}"
    env = [("NEURON_RT_ULTRASERVER_NODE_ID", i), ("NEURON_GLOBAL_TOPOID", topology_id(launch, d, i)),
           ("NEURON_GLOBAL_TOPOID0_HOST", topo0)]
    if n in ULTRASERVER_MODE:
        env.insert(0, ("NEURON_RT_ULTRASERVER_MODE", ULTRASERVER_MODE[n]))
    return [f'              - {{name: {k}, value: "{v}"}}' for k, v in env]
