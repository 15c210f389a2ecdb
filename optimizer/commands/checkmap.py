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
InputError naming the file, the row and the key (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
from array import array
from collections.abc import Iterator
from collections import Counter
from dataclasses import dataclass

from trnopt.optimizer.commands.args import load_runnable_layout
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.inputfile import parse_json, read_text
from trnopt.optimizer.model.placement import _ranges, planned_map, tp_summary
from trnopt.optimizer.model.tomlcheck import closest
from trnopt.optimizer.model.target import Target

COLUMNS = ("rank", "instance", "chip", "core")
OPTIONAL = ("ultraserver", "lnc")
SHOW = 5  # findings of one kind printed in full; the rest are counted


@dataclass(frozen=True, slots=True)
class Device:
    rank: int
    instance: str
    chip: int
    core: int
    ultraserver: str | None


@dataclass
class RankMapFile:
    path: str
    devices: list[Device]     # sorted by rank
    lnc: set[int]             # LNC values recorded (empty: not recorded)


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str


# -- reading ------------------------------------------------------------------------------------
MAX_BYTES = 128 * 2**20   # ~50 bytes a row: room for MAX_ROWS rows with long instance ids
MAX_ROWS = 2**20          # ranks of one job: 262,144 Trainium2 chips at LNC=2
MAX_FIELD = 256           # characters of one field (an EC2 instance id is 19, a hostname at most 253)
MAX_INDEX = 2**20         # a chip or core index, or a rank beyond MAX_ROWS, is no index at all


def _int(path: str, where: str, key: str, value, minimum: int = 0, maximum: int = MAX_INDEX) -> int:
    """An integer from JSON (int) or CSV (digits), in [minimum, maximum]."""
    if type(value) is str and 0 < len(value) <= 12 and value.isascii() and value.isdigit():
        value = int(value)  # the common case, without a regular expression
    name = f"{where}.{key}" if where else key
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,12}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InputError(path, name, f"must be an integer, got {shown}")
    if value < minimum:
        raise InputError(path, name, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise InputError(path, name, f"must be <= {maximum:,}, got {value:,}")
    return value


def _text(path: str, name: str, value) -> str | None:
    """An id (instance, UltraServer): a printable string or number of at most MAX_FIELD characters."""
    if type(value) is str and 0 < len(value) <= MAX_FIELD and value.isprintable() and value == value.strip():
        return value  # the common case
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(path, name, f"must be an id (a string), got {type(value).__name__}")
    text = str(value).strip() if not isinstance(value, int) or abs(value) < 10**20 else None
    if text is None or len(text) > MAX_FIELD:
        raise InputError(path, name, f"longer than {MAX_FIELD} characters")
    if not text.isprintable():
        raise InputError(path, name, "must not hold control characters")
    return text or None


def _rows(path: str, text: str) -> tuple[Iterator[tuple[str, dict]], object]:
    """(where, row) pairs, produced one at a time, and the top-level lnc (or None)."""
    stripped = text.lstrip()
    if path.lower().endswith(".json") or stripped.startswith(("[", "{")):
        data = parse_json(path, text)
        top_lnc = None
        if isinstance(data, dict):
            unknown = set(data) - {"lnc", "ranks"}
            if unknown:
                name = sorted(unknown)[0]
                raise InputError(path, name, f"unknown key; a rank map object has 'ranks' and 'lnc'"
                                 f"{closest(name, ('lnc', 'ranks'))}")
            if "ranks" not in data:
                raise InputError(path, "ranks", "missing: the list of {rank, instance, chip, core} objects")
            top_lnc, data = data.get("lnc"), data["ranks"]
        if not isinstance(data, list):
            raise InputError(path, "ranks", "must be a list of objects")
        if len(data) > MAX_ROWS:
            raise InputError(path, "ranks", f"{len(data):,} rows; at most {MAX_ROWS:,}")

        def objects():
            for i, row in enumerate(data):
                if not isinstance(row, dict):
                    raise InputError(path, f"[{i}]", "must be an object with rank, instance, chip, core")
                yield f"[{i}]", row
        return objects(), top_lnc
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise InputError(path, "line 1", f"not valid CSV ({exc})") from None
    if not header or header == [""]:
        raise InputError(path, "header", f"empty file; expected a CSV header {','.join(COLUMNS)}")

    def lines():
        count = 0
        try:
            for fields in reader:
                if not fields:
                    continue
                where = f"line {reader.line_num}"
                count += 1
                if count > MAX_ROWS:
                    raise InputError(path, where, f"more than {MAX_ROWS:,} rows")
                if len(fields) > len(header):
                    raise InputError(path, where, f"{len(fields)} fields under a header of {len(header)}")
                yield where, dict(zip(header, fields))
        except csv.Error as exc:
            raise InputError(path, f"line {reader.line_num}", f"not valid CSV ({exc})") from None
    return lines(), None


def read_rank_map(path: str) -> RankMapFile:
    """The job's rank map, every row checked (see the module docstring); bounded in size and rows.

    Rows are read one at a time; what is kept per rank is one small Device and a few integers.
    """
    text = read_text(path, "--rank-map", max_bytes=MAX_BYTES)
    rows, top_lnc = _rows(path, text)
    lnc: set[int] = set()
    if top_lnc is not None:
        lnc.add(_int(path, "", "lnc", top_lnc, 1, 64))
    devices: list[Device] = []
    first_at = array("q", [-1]) * MAX_ROWS      # row index at which each rank appeared
    cores: dict[str, set[int]] = {}             # instance -> chip * MAX_INDEX + core taken
    ids: dict[str, str] = {}
    known = set(COLUMNS + OPTIONAL)
    for where, row in rows:
        if not known.issuperset(row):
            name = next(k for k in row if k not in known)
            raise InputError(path, f"{where}.{_text(path, where, str(name)[:40]) or '?'}",
                             f"unknown key; the keys are {', '.join(COLUMNS + OPTIONAL)}"
                             f"{closest(str(name), COLUMNS + OPTIONAL)}")
        for key in COLUMNS:
            if row.get(key) in (None, ""):
                raise InputError(path, f"{where}.{key}", "missing required key")
        rank = _int(path, where, "rank", row["rank"], maximum=MAX_ROWS - 1)
        instance = _text(path, f"{where}.instance", row["instance"])
        if not instance:
            raise InputError(path, f"{where}.instance", "must be a non-empty id")
        us = _text(path, f"{where}.ultraserver", row.get("ultraserver"))
        instance, us = ids.setdefault(instance, instance), ids.setdefault(us, us) if us else None
        chip, core = _int(path, where, "chip", row["chip"]), _int(path, where, "core", row["core"])
        if row.get("lnc") not in (None, ""):
            lnc.add(_int(path, where, "lnc", row["lnc"], 1, 64))
        if first_at[rank] >= 0:
            raise InputError(path, f"{where}.rank", f"rank {rank} appears twice (also row {first_at[rank] + 1})")
        taken = cores.setdefault(instance, set())
        if chip * MAX_INDEX + core in taken:
            other = next(d.rank for d in devices if (d.instance, d.chip, d.core) == (instance, chip, core))
            raise InputError(path, f"{where}.core", f"instance {instance} chip {chip} core {core} already "
                             f"holds rank {other}")
        first_at[rank] = len(devices)
        taken.add(chip * MAX_INDEX + core)
        devices.append(Device(rank, instance, chip, core, us))
    del text, cores
    if not devices:
        raise InputError(path, "ranks", "no rows")
    devices.sort(key=lambda d: d.rank)
    if devices[-1].rank != len(devices) - 1:
        missing = [r for r in range(len(devices)) if first_at[r] < 0]
        raise InputError(path, "rank", f"ranks must be 0..{len(devices) - 1}, each once; missing "
                         f"{_ranges(missing[:1000])}{' ...' if len(missing) > 1000 else ''}")
    by_instance: dict[str, set[str | None]] = {}
    for d in devices:
        by_instance.setdefault(d.instance, set()).add(d.ultraserver)
    for inst, uss in by_instance.items():
        if len(uss) > 1:
            raise InputError(path, "ultraserver", f"instance {inst} is given several UltraServers: "
                             f"{', '.join(sorted(str(u) for u in uss))}")
    return RankMapFile(path, devices, lnc)


# -- checking -----------------------------------------------------------------------------------
def crossing_name(target: Target) -> str:
    if any(a.kind == "ring" for a in target.domain_axes):
        return "the UltraServer ring"
    return "the links between instances" if target.instances_per_domain > 1 else "EFA"


def check(layout: Layout, target: Target, job: RankMapFile) -> list[Finding]:
    """Every failure mode the job's map shows against the plan (empty when it matches)."""
    found: list[Finding] = []
    devs = job.devices
    if len(devs) != layout.ranks:
        return [Finding("world-size", f"the job has {len(devs)} ranks, the plan {layout.ranks} "
                        f"({layout.domains} x {target.name} at LNC={layout.lnc}); nothing else can be compared")]
    per_chip = layout.ranks_per_chip
    # LNC: recorded values, else the core indices and ranks per chip
    other = sorted(v for v in job.lnc if v != layout.lnc)
    if other:
        found.append(Finding("lnc", f"the job ran at LNC={','.join(map(str, other))}, the plan at LNC={layout.lnc}: set "
                             f"NEURON_LOGICAL_NC_CONFIG={layout.lnc} and compile with --logical-nc-config={layout.lnc}"))
    else:
        top = max(d.core for d in devs)
        crowded = Counter((d.instance, d.chip) for d in devs).most_common(1)[0]
        if top >= per_chip or crowded[1] > per_chip:
            found.append(Finding("lnc", f"chip {crowded[0][1]} of {crowded[0][0]} runs {crowded[1]} ranks (core "
                                 f"indices up to {top}) but LNC={layout.lnc} gives {per_chip} logical cores per chip: "
                                 f"the job ran at a smaller LNC; set NEURON_LOGICAL_NC_CONFIG={layout.lnc} and "
                                 f"--logical-nc-config={layout.lnc}"))
    planned = planned_map(layout, target)
    slot = [(dom, inst) for dom, inst in zip(planned.domain, planned.instance)]
    # match each job instance to the plan's (domain, instance) slot most of its ranks were planned on
    votes: dict[str, Counter] = {}
    for d in devs:
        votes.setdefault(d.instance, Counter())[slot[d.rank]] += 1
    slot_of = {inst: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for inst, c in votes.items()}
    # TP groups off their planned chips, and TP groups across more instances than planned; TP group g
    # is ranks g*tp .. g*tp + tp - 1 (tp is the fastest coordinate)
    summary = tp_summary(layout, target)
    off, across = [], []
    for g in range(layout.ranks // layout.tp):
        ranks = list(range(g * layout.tp, (g + 1) * layout.tp))
        moved = [r for r in ranks if slot_of[devs[r].instance] != slot[r] or devs[r].chip != planned.chip[r]]
        if moved:
            r, d = moved[0], devs[moved[0]]
            off.append(f"TP group {g} (ranks {_ranges(ranks)}): {len(moved)} of {len(ranks)} ranks off their planned "
                       f"chips, e.g. rank {r} planned on domain {slot[r][0]} instance {slot[r][1]} chip "
                       f"{planned.chip[r]}, runs on {d.instance} chip {d.chip}")
        insts = sorted({devs[r].instance for r in ranks})
        uss = {devs[r].ultraserver for r in ranks} - {None}
        if len(insts) > summary.instances_per_group or len(uss) > summary.domains_per_group:
            over = "EFA between UltraServers" if len(uss) > summary.domains_per_group else crossing_name(target)
            across.append(f"TP group {g} (ranks {_ranges(ranks)}) spans {len(insts)} instances "
                          f"({', '.join(insts[:4])}{', ...' if len(insts) > 4 else ''}), planned "
                          f"{summary.instances_per_group}: its collectives cross {over}")
    found += _capped("tp-across-ring", across, "TP groups")
    found += _capped("tp-off-plan", off, "TP groups")
    found += _ultraserver_findings(layout, target, devs, slot_of)
    return found


def _capped(kind: str, messages: list[str], what: str) -> list[Finding]:
    out = [Finding(kind, m) for m in messages[:SHOW]]
    if len(messages) > SHOW:
        out.append(Finding(kind, f"... and {len(messages) - SHOW} more {what}"))
    return out


def _ultraserver_findings(layout: Layout, target: Target, devs: list[Device],
                          slot_of: dict[str, tuple[int, int]]) -> list[Finding]:
    us_of = {d.instance: d.ultraserver for d in devs}
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
    for inst, slot in slot_of.items():
        by_domain.setdefault(slot[0], []).append(inst)
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
    instances = len({d.instance for d in job.devices})
    head = (f"check-map: {job.path}: {len(job.devices)} ranks on {instances} instance(s) against the plan "
            f"{layout.describe()} on {layout.domains} x {target.name}")
    if not findings:
        notes = [] if any(d.ultraserver for d in job.devices) or target.instances_per_domain == 1 else \
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
