"""`trnopt check-map`: read the rank-to-device map a job printed at start-up and check it against the plan.

The rank map file
-----------------
One row per rank, as CSV with a header or as JSON:

- ``rank``: the global rank (0 .. world size - 1, each once);
- ``instance``: the instance the rank runs on, any id string (EC2 instance id, hostname);
- ``chip``: the Neuron device index within the instance (0 .. chips per instance - 1);
- ``core``: the logical NeuronCore within the chip (0 .. logical cores per chip - 1);
- ``ultraserver`` (optional): an id of the UltraServer (scale-up domain) the instance
  belongs to, e.g. from the scheduler's topology labels; without it the UltraServer
  membership is not checked;
- ``lnc`` (optional): the job's NEURON_LOGICAL_NC_CONFIG, as a column or, in JSON, as a
  top-level key; without it the LNC is judged from the core indices.

CSV::

    rank,instance,chip,core,ultraserver,lnc
    0,i-0a1,0,0,us-1,2
    1,i-0a1,0,1,us-1,2

JSON: a list of objects with the same keys, or ``{"lnc": 2, "ranks": [{...}, ...]}``.

A job can print its row at start-up from RANK, the hostname and its logical core v on the
instance (torch-neuronx gives local rank i core i unless NEURON_RT_VISIBLE_CORES says
otherwise): chip = v // (physical cores / LNC), core = v % (physical cores / LNC).

What is checked
---------------
The failure modes of the seed documents, each reported on its own line (exit 1 on any):

- ``lnc``: the job's LNC differs from the plan's (runtime NEURON_LOGICAL_NC_CONFIG and the
  compiler's --logical-nc-config must both be the planned value);
- ``tp-across-ring``: a TP group spans more instances (or UltraServers) than planned, so
  its all-reduce crosses the UltraServer ring (or EFA) instead of the torus;
- ``tp-off-plan``: a TP group's ranks are not on the chips the plan gave them;
- ``partial-ultraserver`` / ``outside-instance``: an UltraServer has only some of its
  instances in the job, or a domain has an instance from another UltraServer;
- ``world-size``: the job has a different number of ranks than the plan (the other checks
  are then skipped).

Instances are matched to the plan's (domain, instance) slots by the ranks they hold: an
instance is the slot that most of its ranks were planned on. A malformed file is an
InputError naming the file, the row and the key (exit 2). A CSV map is streamed into a few
integer columns (commands/rankmapfile.py), so every map trnopt writes (up to 16 M ranks) is
read and checked with NumPy over the columns; a JSON map is parsed whole and holds at most
1 M rows.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

import numpy as np

from trnopt.optimizer.commands.args import load_runnable_layout
from trnopt.optimizer.commands.rankmapfile import MAX_INDEX, RankMapFile, read_rank_map  # noqa: F401 (tests)
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.placement import _ranges, place_columns, tp_summary
from trnopt.optimizer.model.target import Target

SHOW = 5  # findings of one kind printed in full; the rest are counted


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str


# -- checking -----------------------------------------------------------------------------------
def crossing_name(target: Target) -> str:
    if any(a.kind == "ring" for a in target.domain_axes):
        return "the UltraServer ring"
    return "the links between instances" if target.instances_per_domain > 1 else "EFA"


def check(layout: Layout, target: Target, job: RankMapFile) -> list[Finding]:
    """Every failure mode the job's map shows against the plan (empty when it matches); NumPy over
    the columns, so a map of millions of ranks is checked in seconds."""
    found: list[Finding] = []
    if job.ranks != layout.ranks:
        return [Finding("world-size", f"the job has {job.ranks} ranks, the plan {layout.ranks} "
                        f"({layout.domains} x {target.name} at LNC={layout.lnc}); nothing else can be compared")]
    found += _lnc_findings(layout, job)
    slot, chip = _planned(layout, target)
    slot_of = _slot_of(job, slot, target.instances_per_domain * layout.domains)
    # TP group g is ranks g*tp .. g*tp + tp - 1 (tp is the fastest coordinate)
    tp, groups = layout.tp, layout.ranks // layout.tp
    moved = ((slot_of[job.instance] != slot) | (job.chip != chip)).reshape(groups, tp)
    summary = tp_summary(layout, target)
    insts = _distinct(job.instance.reshape(groups, tp))
    us_ids: dict[str, int] = {}
    us_index = np.array([-1 if u is None else us_ids.setdefault(u, len(us_ids)) for u in job.ultraserver_of],
                        dtype=np.int32)
    uss = _distinct(us_index[job.instance].reshape(groups, tp), ignore=-1)
    off, across = [], []
    for g in np.flatnonzero(moved.any(axis=1))[:SHOW + 1].tolist():
        ranks = range(g * tp, (g + 1) * tp)
        r = g * tp + int(np.argmax(moved[g]))
        inst, c, _, _ = job.device(r)
        off.append(f"TP group {g} (ranks {_ranges(list(ranks))}): {int(moved[g].sum())} of {tp} ranks off their "
                   f"planned chips, e.g. rank {r} planned on domain {slot[r] // target.instances_per_domain} "
                   f"instance {slot[r] % target.instances_per_domain} chip {chip[r]}, runs on {inst} chip {c}")
    wide = (insts > summary.instances_per_group) | (uss > summary.domains_per_group)
    for g in np.flatnonzero(wide)[:SHOW + 1].tolist():
        ranks = range(g * tp, (g + 1) * tp)
        names = sorted({job.instance_ids[i] for i in job.instance[g * tp:(g + 1) * tp].tolist()})
        over = "EFA between UltraServers" if uss[g] > summary.domains_per_group else crossing_name(target)
        across.append(f"TP group {g} (ranks {_ranges(list(ranks))}) spans {len(names)} instances "
                      f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}), planned "
                      f"{summary.instances_per_group}: its collectives cross {over}")
    found += _capped("tp-across-ring", across, "TP groups", int(wide.sum()))
    found += _capped("tp-off-plan", off, "TP groups", int(moved.any(axis=1).sum()))
    found += _ultraserver_findings(layout, target, job, slot_of)
    return found


def _lnc_findings(layout: Layout, job: RankMapFile) -> list[Finding]:
    """The job's LNC: as recorded, else judged from the core indices and the ranks per chip."""
    other = sorted(v for v in job.lnc if v != layout.lnc)
    if other:
        return [Finding("lnc", f"the job ran at LNC={','.join(map(str, other))}, the plan at LNC={layout.lnc}: set "
                        f"NEURON_LOGICAL_NC_CONFIG={layout.lnc} and compile with --logical-nc-config={layout.lnc}")]
    per_chip = layout.ranks_per_chip
    top = int(job.core.max())
    keys, counts = np.unique(job.instance.astype(np.int64) * MAX_INDEX + job.chip, return_counts=True)
    most = int(np.argmax(counts))
    inst, chip = divmod(int(keys[most]), MAX_INDEX)
    if top >= per_chip or counts[most] > per_chip:
        return [Finding("lnc", f"chip {chip} of {job.instance_ids[inst]} runs {int(counts[most])} ranks (core indices "
                        f"up to {top}) but LNC={layout.lnc} gives {per_chip} logical cores per chip: the job ran at a "
                        f"smaller LNC; set NEURON_LOGICAL_NC_CONFIG={layout.lnc} and --logical-nc-config={layout.lnc}")]
    return []


def _planned(layout: Layout, target: Target, chunk: int = 2**20) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the planned slot (domain * instances per domain + instance) and chip, as int32 (in chunks)."""
    slot = np.empty(layout.ranks, dtype=np.int32)
    chip = np.empty(layout.ranks, dtype=np.int32)
    for start in range(0, layout.ranks, chunk):
        stop = min(layout.ranks, start + chunk)
        domain, instance, c, _ = place_columns(layout, target, start, stop)
        slot[start:stop] = domain * target.instances_per_domain + instance
        chip[start:stop] = c
    return slot, chip


def _slot_of(job: RankMapFile, slot: np.ndarray, slots: int) -> np.ndarray:
    """Each job instance's planned slot: the one most of its ranks were planned on (ties: the lowest)."""
    keys, counts = np.unique(job.instance.astype(np.int64) * slots + slot, return_counts=True)
    inst, where = keys // slots, keys % slots
    order = np.lexsort((where, -counts, inst))
    first = order[np.r_[True, inst[order][1:] != inst[order][:-1]]]
    out = np.full(len(job.instance_ids), -1, dtype=np.int32)
    out[inst[first]] = where[first]
    return out


def _distinct(rows: np.ndarray, ignore: int | None = None) -> np.ndarray:
    """Distinct values per row (``ignore`` not counted)."""
    s = np.sort(rows, axis=1)
    count = 1 + (s[:, 1:] != s[:, :-1]).sum(axis=1)
    if ignore is not None:
        count -= (s == ignore).any(axis=1)
    return count


def _capped(kind: str, messages: list[str], what: str, total: int | None = None) -> list[Finding]:
    """The first SHOW messages, then how many more (``total``: all of them, when fewer were built)."""
    total = len(messages) if total is None else total
    out = [Finding(kind, m) for m in messages[:SHOW]]
    if total > SHOW:
        out.append(Finding(kind, f"... and {total - SHOW} more {what}"))
    return out


def _ultraserver_findings(layout: Layout, target: Target, job: RankMapFile, slot_of: np.ndarray) -> list[Finding]:
    """Partial UltraServers and instances from another UltraServer (one entry per instance: few)."""
    us_of = dict(zip(job.instance_ids, job.ultraserver_of))
    if target.instances_per_domain == 1 or all(u is None for u in us_of.values()):
        return []
    found = []
    missing = sorted(i for i, u in us_of.items() if u is None)
    if missing:
        found.append(Finding("outside-instance", f"instance(s) {', '.join(missing[:4])} name no UltraServer while "
                             "the others do"))
    members: dict[str, list[str]] = {}
    for inst, u in us_of.items():
        if u is not None:
            members.setdefault(u, []).append(inst)
    for u, insts in sorted(members.items()):
        if len(insts) < target.instances_per_domain:
            found.append(Finding("partial-ultraserver", f"UltraServer {u} is scheduled partially: {len(insts)} of its "
                                 f"{target.instances_per_domain} instances are in the job ({', '.join(sorted(insts))})"))
        elif len(insts) > target.instances_per_domain:
            found.append(Finding("partial-ultraserver", f"UltraServer {u} has {len(insts)} instances in the map; "
                                 f"a {target.name} domain has {target.instances_per_domain}"))
    by_domain: dict[int, list[str]] = {}
    for inst, slot in zip(job.instance_ids, slot_of.tolist()):
        by_domain.setdefault(slot // target.instances_per_domain, []).append(inst)
    for domain in sorted(by_domain):
        insts = sorted(by_domain[domain])
        counts = Counter(us_of[i] for i in insts if us_of[i] is not None)
        if not counts:
            continue
        home = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        for inst in insts:
            if us_of[inst] is not None and us_of[inst] != home:
                found.append(Finding("outside-instance", f"domain {domain} has instance {inst} from UltraServer "
                                     f"{us_of[inst]} while its other instances are in UltraServer {home}: "
                                     f"its traffic on {crossing_name(target)} goes over EFA"))
    out = []
    for kind in ("outside-instance", "partial-ultraserver"):
        out += _capped(kind, [f.message for f in found if f.kind == kind], "instances or UltraServers")
    return out


def report_lines(layout: Layout, target: Target, job: RankMapFile, findings: list[Finding]) -> list[str]:
    instances = len(job.instance_ids)
    head = (f"check-map: {job.path}: {job.ranks} ranks on {instances} instance(s) against the plan "
            f"{layout.describe()} on {layout.domains} x {target.name}")
    if not findings:
        notes = [] if any(job.ultraserver_of) or target.instances_per_domain == 1 else \
            ["  note: no ultraserver column; UltraServer membership not checked"]
        return [head, "OK: LNC as planned, every TP group on its planned chips and instances", *notes]
    return [head, f"{len(findings)} finding(s):", *(f"  [{f.kind}] {f.message}" for f in findings)]


# -- command ----------------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser("check-map", help="check the rank-to-device map a job printed against the plan",
                       description="Read a job's rank -> (instance, chip, logical core) map (CSV with header "
                                   "rank,instance,chip,core[,ultraserver][,lnc], or JSON) and report TP groups "
                                   "across the ring or off their planned chips, an LNC other than the plan's, "
                                   "and UltraServers scheduled partially or with an outside instance. "
                                   "Exit 1 on any finding.")
    p.add_argument("--layout", required=True, help="the JSON that `trnopt solve --json` writes")
    p.add_argument("--rank-map", required=True, help="the job's rank map (CSV or JSON)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target, _, layout, _ = load_runnable_layout(args.layout)
    job = read_rank_map(args.rank_map)
    findings = check(layout, target, job)
    print("\n".join(report_lines(layout, target, job, findings)))
    return 1 if findings else 0
