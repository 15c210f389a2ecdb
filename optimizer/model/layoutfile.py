"""A solved layout as JSON (what `trnopt solve --json` writes and the other commands read)."""

from __future__ import annotations

from pathlib import Path

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.bounds import MAX_DOMAINS, MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_SEQ
from trnopt.optimizer.model.inputfile import parse_json, read_text
from trnopt.optimizer.model.layout import DIMS, RECOMPUTE, Layout
from trnopt.optimizer.model.partial import parse_names, with_instances
from trnopt.optimizer.model.schedules import SCHEDULES, default_schedule
from trnopt.optimizer.model.scale import check_scale
from trnopt.optimizer.model.target import Target, check_domains, load_target
from trnopt.optimizer.model.tomlcheck import Table
from trnopt.optimizer.model.workload import Training, Workload, load_model

FRAMEWORKS = ("torchtitan", "nxd")  # the --framework names a layout file may carry (frameworks/profile.py)


def layout_dict(layout: Layout) -> dict:
    """The decisions of a layout; ``placement`` maps dimension -> axis -> factor (factors > 1)."""
    return {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp": layout.cp,
        "zero": layout.zero, "recompute": layout.recompute, "micro_batch": layout.micro_batch,
        "interleave": layout.interleave, "schedule": layout.pipeline_schedule, "lnc": layout.lnc,
        "dp_replicate": layout.dp_replicate,
        **({"etp": layout.etp} if layout.etp is not None else {}),
        **({"stage_layers": list(layout.stage_layers)} if layout.stage_layers else {}),
        "placement": {d: {a.name: f for a, f in zip(layout.axes, row) if f > 1}
                      for d, row in zip(DIMS, layout.placement)},
    }


def problem_dict(target_ref: str, model_ref: str, workload: Workload, domains: int,
                 framework: str | None = None) -> dict:
    """Enough to rebuild the problem: the target and model as the user named them (preset or path),
    and the framework the layout was chosen for, when one was."""
    return {"target": target_ref, "model": model_ref, "domains": domains,
            "seq": workload.training.seq, "global_batch": workload.training.global_batch,
            **({"framework": framework} if framework else {})}


def partial_dict(target: Target) -> dict:
    """A partial machine's record (model/partial.py), which replaces ``problem.domains``: the whole
    machine's domains, the excluded names and the instances per domain the plan runs on; {} on a
    whole machine. Every reader rebuilds the same candidate machine from it."""
    rem = target.remaining
    if rem is None:
        return {}
    return {"domains": rem.whole_domains, "exclude": list(rem.excluded),
            "instances_per_domain": target.instances_per_domain}


def layout_framework(path: str) -> str | None:
    """The framework a layout file names (``problem.framework``, checked by read_layout), or None."""
    problem = parse_json(path, read_text(path, "--layout")).get("problem")
    return problem.get("framework") if isinstance(problem, dict) else None


def read_layout(path: str) -> tuple[Target, Workload, Layout]:
    """Read a layout file back into the target, the workload and a validated Layout.

    The file is the JSON `trnopt solve --json` (or `evaluate --json`) writes; only its
    ``problem`` and ``layout`` objects are read, and every key of those is checked: integers
    are JSON integers (not 4.9, "4" or true) in range, unknown keys are errors, the placement
    names the dimensions and the target's axes, and the layout must tile the machine and
    run the model and batch it names (heads, layers, experts, sequence, global batch).
    """
    data = parse_json(path, read_text(path, "--layout"))
    if not isinstance(data, dict) or not isinstance(data.get("layout"), dict):
        raise InputError(path, "layout", "missing: expected the JSON that `trnopt solve --json` writes")
    problem, lay = Table(data.get("problem"), path, "problem"), Table(data["layout"], path, "layout")
    target = _load(path, problem, "target", load_target)
    model = _load(path, problem, "model", load_model)
    try:
        training = Training(seq=problem.int("seq", 8192, maximum=MAX_SEQ),
                            global_batch=problem.int("global_batch", 1024, maximum=MAX_GLOBAL_BATCH))
    except InputError as exc:  # Training's own checks name the bare key; the Table's already say problem.
        key = exc.key if exc.key.startswith("problem.") else f"problem.{exc.key}"
        raise InputError(path, key, exc.rule) from None
    domains = problem.int("domains", maximum=MAX_DOMAINS)
    if problem.has("framework"):
        problem.choice("framework", FRAMEWORKS)
    check_domains(target, domains, path, "problem.domains")
    if problem.has("exclude"):
        listed = problem._get("exclude", [])
        if not isinstance(listed, list) or not listed:
            raise problem.fail("exclude", "must be a non-empty list of instance or chip names (d2i3, d0i1c5)")
        names = parse_names(target, domains, listed, path, "problem.exclude")
        kept = problem.int("instances_per_domain", maximum=target.instances_per_domain)
        target = with_instances(target, domains, names, kept, path, "problem.instances_per_domain")
        domains = len(target.remaining.domains)
    lnc = lay.int("lnc", maximum=target.chip.physical_cores)
    if lnc not in target.chip.lnc_allowed:
        raise lay.fail("lnc", f"LNC={lnc} is not allowed on {target.name} "
                       f"(allowed: {', '.join(map(str, target.chip.lnc_allowed))})")
    axes = target.axes(lnc, domains)
    ranks = target.ranks(lnc, domains)
    degree = {"maximum": ranks}
    placement = lay.table("placement")
    rows = []
    for dim in DIMS:
        row = placement.table(dim, {})
        rows.append(tuple(row.int(a.name, 1, maximum=a.size) for a in axes))
    kwargs = dict(tp=lay.int("tp", **degree), pp=lay.int("pp", **degree), dp=lay.int("dp", **degree),
                  ep=lay.int("ep", 1, **degree), cp=lay.int("cp", 1, **degree),
                  zero=lay.int("zero", minimum=0, maximum=3), recompute=lay.choice("recompute", RECOMPUTE),
                  micro_batch=lay.int("micro_batch", maximum=MAX_GLOBAL_BATCH),
                  interleave=lay.int("interleave", 1, maximum=MAX_LAYERS),
                  dp_replicate=lay.int("dp_replicate", 1, **degree),
                  etp=lay.int("etp", **degree) if lay.has("etp") else None)
    # files written before the schedule was recorded ran the frameworks' default (1F1B, or
    # Interleaved1F1B with interleaved stages: torchtitan's and NxD's)
    kwargs["schedule"] = lay.choice("schedule", SCHEDULES, default_schedule(kwargs["interleave"]))
    if lay.has("stage_layers"):  # an uneven pipeline split (cost/stages.py): whole numbers, one a stage
        split = lay._get("stage_layers", [])
        if (not isinstance(split, list) or not split
                or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LAYERS for v in split)):
            raise lay.fail("stage_layers", f"must be a list of whole numbers from 1 to {MAX_LAYERS}, one a pipeline "
                           "stage")
        kwargs["stage_layers"] = tuple(split)
    problem.check_unknown()
    lay.check_unknown()
    try:
        layout = Layout(lnc=lnc, axes=axes, placement=tuple(rows), **kwargs)
    except InputError as exc:
        raise InputError(path, f"layout.{exc.key}", exc.rule) from None
    workload = Workload(model, training)
    check_scale(workload, path, "problem.model", path, "problem.seq")
    problems = layout.workload_problems(workload)
    if problems:
        key, rule = problems[0]
        raise InputError(path, f"layout.{key}", f"does not run {model.name} with global batch "
                         f"{training.global_batch}: {rule}")
    return target, workload, layout


def _load(path: str, problem: Table, key: str, load):
    """The target or model a layout names: a built-in name, a path, or a path next to the layout file."""
    ref = problem.str(key, nonempty=True)
    beside = Path(path).parent / ref
    if ref.endswith(".toml") and not Path(ref).exists() and beside.exists():
        ref = str(beside)
    try:
        return load(ref)
    except InputError as exc:
        raise InputError(path, f"problem.{key}", str(exc)) from None
