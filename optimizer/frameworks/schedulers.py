"""The scheduler part of the launch files: torchrun on each instance by hand, a Slurm batch job, a Kubernetes JobSet.

All three start ``run-node.sh NODE_RANK`` on every instance, which runs torchrun with the
static rendezvous (``--node-rank``, ``--master-addr``: torchrun's default rendezvous, in which
``GROUP_RANK`` is the node rank given; the c10d rendezvous would pick the node order itself).
What differs is how an instance learns its node rank and how the scheduler keeps an
UltraServer's instances together:

- torchrun: the user starts node rank n on the instance ``nodes.csv`` names, or lets
  ``node-rank.sh`` work it out from a topology file (host, UltraServer id, node id);
- Slurm: ``--segment`` = instances per UltraServer with the topology/block plugin (one block
  per UltraServer) allocates whole UltraServers; ``--requeue`` brings a failed job back on
  whole UltraServers again; ``node-rank.sh`` refuses a partial one at start;
- Kubernetes: a JobSet with one replicated job per node rank, pinned by node selector to
  its UltraServer node id and by pod (anti-)affinity to one UltraServer per domain (the
  ``neuron.amazonaws.com/ultraserver-server-id-<n>`` / ``ultraserver-node-id-<n>`` node
  labels of the Neuron page "How to schedule MPI jobs to run on Neuron UltraServer on EKS");
  the JobSet's failure policy recreates every pod when one fails, so a failed UltraServer is
  replaced as a whole. A JobSet is one Kubernetes object and its files one ConfigMap, so a
  launch past their size limits (about 700 node ranks) is refused for Slurm or torchrun.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.frameworks import torchtitan_registry
from trnopt.optimizer.frameworks.ultraserver import pod_env as _ultraserver_env
from trnopt.optimizer.frameworks.ultraserver import run_node_lines as ultraserver_lines
from trnopt.optimizer.model.partial import physical

if TYPE_CHECKING:
    from trnopt.optimizer.frameworks.launch import Launch


def files(launch: Launch) -> dict[str, str]:
    out = {"run-node.sh": run_node_sh(launch)}
    if launch.scheduler in ("torchrun", "slurm"):
        out["node-rank.sh"] = node_rank_sh(launch)
    if launch.scheduler == "slurm":
        out["job.sbatch"] = sbatch(launch)
    if launch.scheduler == "k8s":
        out["jobset.yaml"] = jobset_yaml(launch)
    return out


def check_k8s(launch: Launch, pod_files: dict[str, str]) -> None:
    """InputError when the JobSet (one replicated job per node) or the ConfigMap of the files its
    pods read (``pod_files`` without run-node.sh) would exceed what Kubernetes stores in one object."""
    rem = launch.target.remaining
    if rem is not None and launch.target.instances_per_domain != rem.whole_instances:
        # a plan of whole UltraServers (fewer of them) is a JobSet as any other: the pods select whole
        # UltraServers' node ids, and one with a failed node cannot take a domain. A plan on some of an
        # UltraServer's instances would need pods on chosen node ids of a cut ring, run in a smaller
        # UltraServer mode: not written
        raise InputError("--scheduler", "scheduler", f"k8s: the plan runs on {launch.target.instances_per_domain} "
                         f"of each UltraServer's {rem.whole_instances} instances ({','.join(rem.excluded)} "
                         "excluded), and the JobSet is written for whole UltraServers only; use --scheduler "
                         "torchrun or slurm, whose node-rank.sh maps the whole machine's node ids")
    name = _name(launch)
    one = len("\n".join(_replicated_job(launch, name, 0, 0, 0, f"{name}-node-0-0-0.{name}"))) + 1
    if one * launch.nodes > OBJECT_LIMIT:
        raise InputError("--scheduler", "scheduler", f"k8s: a JobSet of {launch.nodes} node ranks is about "
                         f"{one * launch.nodes / 2**20:.1f} MiB, over the {OBJECT_LIMIT / 2**20:.1f} MiB a Kubernetes "
                         "object may hold (etcd's request limit); use --scheduler slurm or torchrun")
    pod_bytes = sum(len(text.encode()) for text in pod_files.values()) + len(run_node_sh(launch).encode())
    if pod_bytes > CONFIGMAP_LIMIT:
        raise InputError("--scheduler", "scheduler", f"k8s: the files the pods read ({', '.join(POD_FILES)}) "
                         f"are {pod_bytes / 2**20:.1f} MiB, over the 1 MiB a ConfigMap holds; use --scheduler "
                         "slurm or torchrun")


def _assumptions(launch: Launch) -> list[str]:
    from trnopt.optimizer.frameworks.launch import ASSUME_RING
    return [f"# Assumption: {ASSUME_RING}."] if launch.ultraserver else []


def run_node_sh(launch: Launch) -> str:
    entry = launch.entry  # shlex-quoted words (launch.plan): the shell runs none of it
    lines = [
        "#!/usr/bin/env bash",
        "# Start this instance's workers: MASTER_ADDR=<host of node rank 0> ./run-node.sh NODE_RANK [command ...]",
        f"# {launch.title()}",
        "# NODE_RANK must be the one nodes.csv gives this instance (its UltraServer of the job and its position in",
        "# it): that node order is what puts every rank where the plan put it. torchrun's static rendezvous",
        "# (--node-rank, --master-addr, torchrun's default) makes GROUP_RANK = NODE_RANK.",
        *_assumptions(launch),
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'source "$here/env.sh"',
        'NODE_RANK=${1:?usage: MASTER_ADDR=host ./run-node.sh NODE_RANK [command ...]}',
        "shift",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the host of node rank 0}"',
        f'read -r {"planned_us" if launch.ultraserver else "_"} planned < <(awk -F, -v n="$NODE_RANK" '
        '\'NR > 1 && $1 == n { print $2, $3 }\' "$here/nodes.csv") || true',
        'if [ -z "${planned:-}" ]; then echo "run-node.sh: node rank $NODE_RANK is not in nodes.csv" >&2; exit 1; fi',
        *ultraserver_lines(launch),
        "# When the Neuron runtime knows this instance's UltraServer node id, refuse a node rank planned elsewhere.",
        'if [ -n "${NEURON_RT_ULTRASERVER_NODE_ID:-}" ] && [ "$NEURON_RT_ULTRASERVER_NODE_ID" != "$planned" ]; then',
        '  echo "run-node.sh: node rank $NODE_RANK is planned at UltraServer position $planned, but this instance is'
        ' node $NEURON_RT_ULTRASERVER_NODE_ID" >&2',
        "  exit 1",
        "fi",
        'export TRNOPT_ULTRASERVER="${TRNOPT_ULTRASERVER:-${NEURON_RT_ULTRASERVER_SERVER_ID:-}}"',
        'export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # trnopt_job.py, the torchtitan 0.3 config module',
        "# The default command: --entry's words, each quoted so that the shell runs and expands none of them.",
        "# shellcheck disable=SC2016",
        f'if [ $# -eq 0 ]; then set -- {entry} --job.config_file "$here/job.toml"; fi',
        'exec torchrun --nnodes="$TRNOPT_NNODES" --nproc-per-node="$TRNOPT_NPROC_PER_NODE" --node-rank="$NODE_RANK" \\',
        '  --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --no-python "$here/worker.sh" "$@"',
    ]
    return "\n".join(lines) + "\n"


def _whole_positions(launch: Launch) -> int:
    """Node ids an UltraServer of the whole machine has: its instances (more than the plan's on a partial machine)."""
    rem, ipd = launch.target.remaining, launch.target.instances_per_domain
    return ipd if rem is None else max(ipd, max(max(p) for p in rem.instances) + 1)


def _topo0(launch: Launch) -> int:
    """The plan's position in UltraServer 0 of topology id 0 (the lowest node id it holds)."""
    rem = launch.target.remaining
    return 0 if rem is None else rem.instances[0].index(min(rem.instances[0]))


def node_rank_sh(launch: Launch) -> str:
    ipd, domains = launch.target.instances_per_domain, launch.layout.domains
    lines = [
        "#!/usr/bin/env bash",
        "# Print 'NODE_RANK MASTER_HOST ULTRASERVER TOPOID0_HOST' for this host: ./node-rank.sh HOSTS [TOPOLOGY] [HOST]",
        "#   (TOPOID0_HOST: the host of UltraServer 0, node id 0, NEURON_GLOBAL_TOPOID0_HOST);",
        "#   HOSTS: the job's hosts, one per line (Slurm: scontrol show hostnames \"$SLURM_JOB_NODELIST\");",
        "#   TOPOLOGY: lines 'host ultraserver-id node-id' for every host (from the EC2 instance topology or the",
        "#     neuron.amazonaws.com/ultraserver-server-id-<n> / ultraserver-node-id-<n> labels); not needed when",
        "#     every domain is one instance;",
        "#   HOST: default $(hostname).",
        f"# The job's UltraServers become domains 0..{domains - 1} in the sorted order of their ids (EFA joins every",
        "# pair alike, so any order of whole UltraServers is the plan's); inside one, the node id is the position.",
        f"# Fails (exit 1) unless the job has exactly {domains} UltraServer(s) of {ipd} instance(s) each, node ids "
        f"0..{ipd - 1} once: an UltraServer is scheduled as one unit or the job does not start."
        if launch.target.remaining is None else
        f"# A partial machine ({', '.join(launch.target.remaining.excluded)} excluded): the job's UltraServers are "
        f"the plan's domains {' '.join(str(physical(launch.target, d, 0)[0]) for d in range(domains))} in that order; "
        "fails (exit 1) unless each has the plan's node ids once.",
        *_assumptions(launch),
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'hosts=${1:?usage: ./node-rank.sh HOSTS [TOPOLOGY] [HOST]}',
        'topology=${2:-}',
        'me=${3:-$(hostname)}',
        f'awk -v ipd={ipd} -v domains={domains} -v me="$me" -v topo="$topology" -v nodes="$here/nodes.csv" '
        f'-v doms="{" ".join(str(physical(launch.target, d, 0)[0]) for d in range(domains))}" '
        f'-v positions={_whole_positions(launch)} -v t0="{" ".join(map(str, physical(launch.target, 0, _topo0(launch))))}" \'',
        "function fail(msg) { print \"node-rank.sh: \" msg > \"/dev/stderr\"; bad = 1; exit 1 }",
        "BEGIN {",
        "  if (topo != \"\") while ((getline line < topo) > 0) {",
        "    if (line ~ /^[ \\t]*(#|$)/) continue",
        "    split(line, f, \" \"); us[f[1]] = f[2]; pos[f[1]] = f[3]",
        "  }",
        "  while ((getline line < nodes) > 0) {",
        "    split(line, f, \",\"); if (f[1] == \"node_rank\") continue",
        "    rank_of[f[2] \" \" f[3]] = f[1]; if (f[1] == 0) { d0 = f[2]; p0 = f[3] }",
        "  }",
        "}",
        "NF == 0 { next }",
        "{ h = $1; n++; host[n] = h; injob[h] = 1",
        "  if (!(h in us)) { if (ipd == 1 && topo == \"\") { us[h] = h; pos[h] = 0 } else fail(\"host \" h \" is not in"
        " the topology file\") }",
        "  key = us[h] \" \" pos[h]; if (key in seen) fail(\"hosts \" seen[key] \" and \" h \" are both UltraServer \""
        " us[h] \" node \" pos[h]); seen[key] = h",
        "  count[us[h]]++ }",
        "END {",
        "  if (bad) exit 1",
        "  k = 0; for (u in count) ids[++k] = u",
        "  for (i = 2; i <= k; i++) { v = ids[i]; for (j = i - 1; j >= 1 && ids[j] > v; j--) ids[j + 1] = ids[j];"
        " ids[j + 1] = v }",
        "  if (k != domains) fail(\"the job has \" k \" UltraServer(s), the plan \" domains)",
        "  split(doms, dn, \" \"); split(t0, z, \" \")",
        "  for (i = 1; i <= k; i++) { dom[ids[i]] = dn[i]",
        "    if (count[ids[i]] != ipd) fail(\"UltraServer \" ids[i] \" is scheduled partially: \" count[ids[i]] \" of \""
        " ipd \" instances\") }",
        "  for (i = 1; i <= n; i++) { h = host[i]; if (pos[h] < 0 || pos[h] >= positions) fail(\"host \" h \" has node id \""
        " pos[h] \", not 0..\" positions - 1)",
        "    if (!((dom[us[h]] \" \" pos[h]) in rank_of)) fail(\"host \" h \" is UltraServer \" us[h] \" node \" pos[h] \", "
        "which the plan leaves out (excluded)\")",
        "    if (dom[us[h]] == d0 && pos[h] == p0) master = h",
        "    if (dom[us[h]] == z[1] && pos[h] == z[2]) topo0 = h }",
        "  if (!(me in injob)) fail(\"this host \" me \" is not in the job\")",
        "  r = rank_of[dom[us[me]] \" \" pos[me]]",
        "  print r, master, us[me], topo0",
        "}' \"$hosts\"",
    ]
    return "\n".join(lines) + "\n"


def sbatch(launch: Launch) -> str:
    ipd = launch.target.instances_per_domain
    name = _name(launch)
    lines = [
        "#!/usr/bin/env bash",
        f"# trnopt Slurm job: {launch.title()}",
        "# Submit from this directory on a shared file system: sbatch job.sbatch",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={launch.nodes}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        "#SBATCH --requeue",
    ]
    if ipd > 1:
        lines += [
            f"#SBATCH --segment={ipd}",
            f"# --segment={ipd}: whole UltraServers only. It needs a Slurm with the topology/block plugin and sbatch",
            "# --segment, configured with one block per",
            f"# UltraServer (topology.conf: BlockName=<ultraserver-id> Nodes=<its {ipd} hosts>, BlockSizes={ipd}).",
            "# A failed instance ends the job (srun --kill-on-bad-exit); --requeue allocates whole UltraServers again,",
            "# so an UltraServer is scheduled and replaced as one unit.",
            "# TRNOPT_TOPOLOGY names a file 'host ultraserver-id node-id' for every host (e.g. written from the",
            "# topology.conf blocks, in node-id order, or from `aws ec2 describe-instance-topology`).",
            ': "${TRNOPT_TOPOLOGY:=$PWD/topology.txt}"',
        ]
    else:
        lines += ["# Every domain is one instance: nodes are numbered in the order Slurm lists them.",
                  'TRNOPT_TOPOLOGY=""']
    lines += [
        *_assumptions(launch),
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR:-$PWD}"',
        'scontrol show hostnames "$SLURM_JOB_NODELIST" > "hosts.$SLURM_JOB_ID"',
        "export TRNOPT_TOPOLOGY",
        "# The command is single-quoted on purpose: every node expands it for itself.",
        "# shellcheck disable=SC2016",
        "srun --kill-on-bad-exit=1 bash -c 'set -euo pipefail",
        '  read -r rank master us topo0 < <(./node-rank.sh "hosts.$SLURM_JOB_ID" "$TRNOPT_TOPOLOGY" "$(hostname)")',
        '  TRNOPT_ULTRASERVER="$us" MASTER_ADDR="$master" NEURON_GLOBAL_TOPOID0_HOST="$topo0" exec ./run-node.sh '
        '"$rank"\'',
    ]
    return "\n".join(lines) + "\n"


def _name(launch: Launch) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"trnopt-{launch.workload.model.name}".lower())[:50].strip("-")


# Kubernetes keeps an object in one etcd request, at most 1.5 MiB (etcd's --max-request-bytes default,
# "Operating etcd clusters for Kubernetes"); a ConfigMap holds at most 1 MiB ("ConfigMaps").
OBJECT_LIMIT = int(1.5 * 2**20)
CONFIGMAP_LIMIT = 2**20
# what the pods read (launch.pod_files and run-node.sh); trnopt_job.py besides when it is written
POD_FILES = ("env.sh", "job.toml", "job-overrides.txt", "nodes.csv", "run-node.sh", "worker.sh")


def pod_file_names(launch: Launch) -> list[str]:
    extra = [f"{torchtitan_registry.MODULE}.py"] if torchtitan_registry.problem(launch.workload, launch.layout) is None \
        else []
    return [*POD_FILES, *extra]


def jobset_yaml(launch: Launch) -> str:
    ipd = launch.target.instances_per_domain
    name = _name(launch)
    server_key = f"neuron.amazonaws.com/ultraserver-server-id-{ipd}"
    node_key = f"neuron.amazonaws.com/ultraserver-node-id-{ipd}"
    master = f"{name}-node-0-0-0.{name}"
    lines = [
        f"# trnopt Kubernetes JobSet: {launch.title()}",
        "# Needs the JobSet controller (jobset.x-k8s.io), the Neuron device plugin and the EFA device plugin.",
        "# The files the pods read reach them as a ConfigMap (run in this directory):",
        f"#   kubectl create configmap {name}-files {' '.join(f'--from-file={f}' for f in pod_file_names(launch))}",
        "# then kubectl apply -f jobset.yaml. Set the image to your TorchTitan Neuron image.",
        "# One replicated job per node rank: its pod is pinned to the UltraServer node id nodes.csv plans for it",
        f"# ({node_key}), and pod affinity on {server_key} keeps the pods of one",
        "# domain on one UltraServer, anti-affinity keeps other domains and other trnopt jobs off it.",
        "# failurePolicy: any failed pod restarts the whole JobSet, so a failed UltraServer's instances are",
        "# rescheduled together, as one unit, onto a whole UltraServer.",
        *_assumptions(launch),
        *_partial_lines(launch),
    ]
    if ipd not in (2, 4):
        lines.append(f"# Assumption: the Neuron node labels for {ipd}-instance UltraServers follow the documented "
                     "ultraserver-server-id-2/-4 pattern; check `kubectl get nodes --show-labels`.")
    lines += [
        "# Assumption: one EFA device per chip (vpc.amazonaws.com/efa); check `kubectl describe node`.",
        "apiVersion: jobset.x-k8s.io/v1alpha2",
        "kind: JobSet",
        "metadata:",
        f"  name: {name}",
        "spec:",
        "  failurePolicy:",
        "    maxRestarts: 10",
        "  network:",
        "    enableDNSHostnames: true",
        "  replicatedJobs:",
    ]
    for n, (d, i) in sorted(launch.binding.slot.items()):
        lines += _replicated_job(launch, name, n, d, i, master)
    return "\n".join(lines) + "\n"


def _partial_lines(launch: Launch) -> list[str]:
    """The JobSet's note on a plan of whole domains with failed instances or chips excluded."""
    rem = launch.target.remaining
    if rem is None:
        return []
    what = "UltraServer(s)" if launch.ultraserver else "instance(s)"
    return [f"# Planned on {launch.layout.domains} whole {what}, {', '.join(rem.excluded)} excluded: any healthy "
            f"{what} serve;",
            "# cordon the failed node (kubectl cordon) so that it takes no pod"
            + (" and its UltraServer, short of that node id, no domain." if launch.ultraserver else ".")]


def _replicated_job(launch: Launch, name: str, n: int, d: int, i: int, master: str) -> list[str]:
    """The JobSet replicated job of node rank n: one pod on UltraServer node id i of domain d's UltraServer."""
    t, ipd = launch.target, launch.target.instances_per_domain
    server_key = f"neuron.amazonaws.com/ultraserver-server-id-{ipd}"
    node_key = f"neuron.amazonaws.com/ultraserver-node-id-{ipd}"
    lines: list[str] = []
    select = [f"              node.kubernetes.io/instance-type: {t.instance}"]
    affinity = []
    if launch.ultraserver:
        select.append(f'              {node_key}: "{i}"')
        affinity = [
            "            affinity:",
            "              podAffinity:",
            "                requiredDuringSchedulingIgnoredDuringExecution:",
            "                - labelSelector:",
            f"                    matchLabels: {{trnopt/job: {name}, trnopt/domain: \"{d}\"}}",
            f"                  topologyKey: {server_key}",
            "              podAntiAffinity:",
            "                requiredDuringSchedulingIgnoredDuringExecution:",
            "                - labelSelector:",
            "                    matchExpressions:",
            f"                    - {{key: trnopt/job, operator: In, values: [{name}]}}",
            f"                    - {{key: trnopt/domain, operator: NotIn, values: [\"{d}\"]}}",
            f"                  topologyKey: {server_key}",
            "                - labelSelector:",
            "                    matchExpressions:",
            "                    - {key: trnopt/job, operator: Exists}",
            f"                    - {{key: trnopt/job, operator: NotIn, values: [{name}]}}",
            f"                  topologyKey: {server_key}",
        ]
    lines += [
        f"  - name: node-{n}",
        "    replicas: 1",
        "    template:",
        "      spec:",
        "        parallelism: 1",
        "        completions: 1",
        "        backoffLimit: 0",
        "        template:",
        "          metadata:",
        f"            labels: {{trnopt/job: {name}, trnopt/domain: \"{d}\", trnopt/node-rank: \"{n}\"}}",
        "          spec:",
        "            restartPolicy: Never",
        "            nodeSelector:",
        *select,
        *affinity,
        "            volumes:",
        f"            - {{name: trnopt, configMap: {{name: {name}-files, defaultMode: 0755}}}}",
        "            containers:",
        "            - name: trainer",
        "              image: REPLACE-WITH-YOUR-TORCHTITAN-NEURON-IMAGE",
        f'              command: [bash, /trnopt/run-node.sh, "{n}"]',
        "              env:",
        f"              - {{name: MASTER_ADDR, value: {master}}}",
        "              - {name: TRNOPT_RANK_MAP_DIR, value: /tmp/rank-map}",
        *_ultraserver_env(launch, name, d, i),
        "              - name: TRNOPT_INSTANCE",
        "                valueFrom: {fieldRef: {fieldPath: spec.nodeName}}",
        "              volumeMounts:",
        "              - {name: trnopt, mountPath: /trnopt}",
        "              resources:",
        f"                limits: {{aws.amazon.com/neuron: {t.chips_per_instance}, "
        f"vpc.amazonaws.com/efa: {t.chips_per_instance}}}",
    ]
    return lines
