"""Text and JSON for what the CLI prints. Every number comes from an Evaluation (evaluate.py)."""

from __future__ import annotations

from dataclasses import dataclass

from trnopt.optimizer.cost.calibration import held_out_mean, step_band
from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.model.layoutfile import layout_dict
from trnopt.optimizer.model.placement import instance_table, rank_map_summary, tp_summary
from trnopt.optimizer.search.driver import SearchResult, change_text
from trnopt.optimizer.model.target import GIB, Target

STEP_TERMS = (("compute", "compute"), ("tp", "TP communication (exposed)"), ("cp", "CP communication"),
              ("ep", "EP all-to-all"), ("pp_send", "pipeline sends"), ("pp_bubble", "pipeline bubble"),
              ("stage_split", "uneven stages (vs even)"),
              ("dp", "DP gradients (exposed)"), ("zero3", "ZeRO-3 gathers and scatters (exposed)"),
              ("optimizer", "optimizer step"))


@dataclass(frozen=True)
class NoOverlapAnswer:
    """The solve's answer with every hidden share 0 (``overlap.NO_OVERLAP``): how much the
    answer rests on the simulated overlap."""

    best: Evaluation
    """The best layout searched with no overlap, evaluated with no overlap."""
    status: str
    """Its search status (OPTIMAL, FEASIBLE), or 'unchanged' when no search was needed: the chosen
    layout hides nothing, and every other layout's step time only grows without overlap."""
    chosen: Evaluation
    """The layout chosen with overlap, evaluated with no overlap."""


def no_overlap_line(answer: NoOverlapAnswer) -> str:
    """One line: the answer with no overlap, its step time, and the chosen layout's without overlap."""
    b, c = answer.best, answer.chosen
    same = b.layout == c.layout
    found = "the same layout" if same else f"{b.layout.describe()} [{b.layout.placement_text()}]"
    status = "" if answer.status in ("OPTIMAL", "unchanged") else f", {answer.status}"
    tail = "" if same else f"; the chosen layout would take {c.step.total:.3f} s"
    return (f"with no overlap (every hidden share 0): {found}, {b.step.total:.3f} s/step{status}{tail}")


def no_overlap_dict(answer: NoOverlapAnswer) -> dict:
    return {"layout": layout_dict(answer.best.layout), "step_time_s": answer.best.step.total,
            "status": answer.status, "chosen_layout_step_time_s": answer.chosen.step.total}


def neuron_target(target: Target) -> bool:
    """True when the Neuron runtime runs the target's collectives (a Trainium machine): only
    then do the Neuron runtime and compiler settings apply."""
    return target.scale_out.collectives == "neuron"


def lnc_lines(lnc: int, target: Target) -> list[str]:
    """The two settings that must agree (Neuron LNC docs); none for a GPU target."""
    if not neuron_target(target):
        return []
    return [f"LNC={lnc}: runtime NEURON_LOGICAL_NC_CONFIG={lnc}; compiler --logical-nc-config={lnc}"]


def constants_lines(target: Target) -> list[str]:
    """Every efficiency constant the step time rests on, by name, with where it comes from: the
    chip's own (stated per generation) and the framework's (fitted, or carried from another
    generation's fit: ``fitted_on`` says which)."""
    eff = target.efficiency
    links = ", ".join(f"{a.name} {a.achievable:g}" for a in (*target.domain_axes, target.scale_out))
    return [f"constants of {target.name}: GEMM share {eff.gemm_share:.3f} of TensorE's rate = chip_matmul "
            f"{eff.chip_matmul:g} ({eff.chip_matmul_source}) x matmul {eff.matmul:g}",
            f"  framework, {eff.fitted_on}: matmul {eff.matmul:g}, elementwise {eff.elementwise:g}, "
            f"microbatch_overhead_us {eff.microbatch_overhead_s * 1e6:g}, collective_fixed_share "
            f"{eff.collective_fixed_share:g}; link achievable shares: {links}"]


def evaluation_lines(e: Evaluation, target: Target) -> list[str]:
    lay, mem, step = e.layout, e.memory, e.step
    out = [f"layout: {lay.describe()}",
           f"placement: {lay.placement_text() or 'all on one rank'}",
           *lnc_lines(lay.lnc, target),
           f"ranks: {lay.ranks} logical cores on {lay.chips} chips ({lay.ranks_per_chip} per chip), "
           f"{lay.domains} domain(s) of {target.name}",
           "",
           f"memory per chip: {mem.total / GIB:.1f} GiB of {e.usable_bytes / GIB:.1f} usable "
           f"({target.chip.hbm_bytes / GIB:.0f} GiB HBM) - {'fits' if e.fits else 'DOES NOT FIT'}, "
           f"{(e.usable_bytes - mem.total) / GIB:.1f} GiB headroom left"
           + (" (the fullest pipeline stage)" if lay.stage_layers else "")]
    for name, gib in mem.gib().items():
        out.append(f"  {name.replace('_', ' '):22s} {gib:8.2f} GiB")
    out += ["", f"step time: {step.total:.3f} s", *constants_lines(target)]
    for key, label in STEP_TERMS:
        value = getattr(step, key)
        if value:
            out.append(f"  {label:28s} {value:9.4f} s  {100 * value / step.total:5.1f}%")
    if lay.stage_layers:
        even = step.total - step.stage_split
        out.append(f"  layers per stage {','.join(map(str, lay.stage_layers))} (first to last): {step.total:.3f} s "
                   f"against {even:.3f} s with the even split ({100 * (even - step.total) / even:.1f}% faster)")
    if step.tp_raw:
        out.append(f"  TP communication raw {step.tp_raw:.4f} s, after overlap {step.tp:.4f} s "
                   f"({100 * (1 - step.tp / step.tp_raw):.0f}% hidden by the overlap kernels)")
    rel = e.reliability
    out += ["", f"throughput: {e.tokens_per_s:,.0f} tokens/s, MFU {100 * e.mfu:.1f}%",
            f"reliability: {rel.instances} instances, job MTBF {rel.job_mtbf_s / 3600:.1f} h, checkpoint "
            f"{rel.checkpoint_s:.0f} s, Young's interval {rel.interval_s / 60:.1f} min, goodput {100 * rel.goodput:.1f}% "
            f"({e.goodput_tokens_per_s:,.0f} tokens/s after failures and checkpoints)"]
    return out


def rank_map_lines(e: Evaluation, target: Target) -> list[str]:
    summary = tp_summary(e.layout, target)
    return ["rank-to-chip map (rank order tp, cp, ep, dp, pp; tp fastest):",
            *instance_table(e.layout, target), summary.check_line(e.layout)]


def overlap_source_line(e: Evaluation, hidden, target, hidden_size: int) -> str:
    """Where the TP term's hidden fraction came from (the simulated table, with the version of the
    simulator that wrote it), or '' when none applies."""
    from trnopt.optimizer.cost import collectives as cc
    from trnopt.optimizer.cost.overlap import TP_KERNELS, OverlapTable, shape_class, tp_hidden

    span = e.layout.span("tp")
    if not span or not e.step.tp_raw or not isinstance(hidden, OverlapTable):
        return ""
    cls = cc.link_class(span)
    key = {"target": target.name, "lnc": e.layout.lnc, "shape_class": shape_class(hidden_size)}
    found = ", ".join(f"{k} {hidden.fraction(k, e.layout.tp, cls, **key):.2f} "
                      f"({hidden.source_of(k, e.layout.tp, cls, **key)})" for k in TP_KERNELS)
    return (f"    overlap at TP{e.layout.tp} on {cls} links of {target.name} at LNC={e.layout.lnc}: "
            f"{tp_hidden(hidden, span, **key):.2f} hidden, the mean of {found}, from {hidden.source}, "
            f"{hidden.provenance_text()}{stale_note(hidden)}")


def simulator_version() -> str:
    """The installed simulator's ``__version__``, read from its package's source: importing the
    simulator for one string would cost a report most of a CPU-second (NumPy dtypes, ml_dtypes)."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec("trnopt.kernels.sim").origin  # imports trnopt.kernels only
    with open(origin, encoding="utf-8") as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
                return ast.literal_eval(node.value)
    raise RuntimeError(f"{origin}: no __version__")


def stale_note(table) -> str:
    """'' when the table was written by this simulator version, else a note saying it was not."""
    __version__ = simulator_version()
    v = table.simulator_version
    return "" if v in (None, __version__) else f"; this simulator is {__version__}: regenerate the table"


def with_overlap_source(lines: list[str], e: Evaluation, p) -> list[str]:
    """``lines`` (evaluation_lines) with the overlap source line after the TP line, if any."""
    source = overlap_source_line(e, p.overlap, p.target, p.workload.model.hidden)
    if not source:
        return lines
    at = next((i for i, line in enumerate(lines) if line.startswith("  TP communication raw")), len(lines) - 1)
    return lines[:at + 1] + [source] + lines[at + 1:]


# what ended a search before its proof (SearchResult.stopped)
STOPPED_BY = {"work": "work budget", "time": "time limit"}


def solve_text(result: SearchResult, no_overlap: NoOverlapAnswer | None = None) -> str:
    p, e = result.problem, result.best
    status = "OPTIMAL" if result.status == "OPTIMAL" else \
        f"FEASIBLE, gap {100 * result.gap:.2f}% ({STOPPED_BY.get(result.stopped, 'stopped')})"
    out = [f"trnopt solve: {p.workload.model.name} on {p.domains} x {p.target.name} "
           f"({p.domains * p.target.chips_per_domain} chips), seq {p.workload.training.seq}, "
           f"global batch {p.workload.training.global_batch}, objective {p.objective}"]
    if result.domains_note:
        out.append(result.domains_note)
    out += [f"solver: {status} in {result.seconds:.2f} s over {result.space_size:,} points (CP-SAT; "
            f"the search {result.search_seconds:.2f} s, the robust choice and the alternatives the rest)", ""]
    out += with_overlap_source(evaluation_lines(e, p.target), e, p)
    if result.uneven_stages:
        out.append(f"uneven stages: {result.uneven_stages['note']}")
        if joint := result.uneven_stages.get("joint"):
            out.append(f"  layout and split together: {joint_text(joint)}")
        for r in result.uneven_stages.get("runners_up", ()):
            out.append(f"  runner-up {r['layout']}: layers {','.join(map(str, r['layers']))}, {r['step_s']:.3f} s "
                       f"against {r['even_step_s']:.3f} s even" + (" - faster than the answer: evaluate it with "
                                                                   "--stage-layers" if r["beats_answer"] else ""))
    if no_overlap is not None:
        out.append(no_overlap_line(no_overlap))
    out += uncertainty_lines(result)
    out += [""] + rank_map_lines(e, p.target)
    if result.runners_up:
        out += ["", "next best layouts (other degrees, against the chosen one):"]
        base = e.step.total
        for r in result.runners_up:
            out.append(f"  {r.layout.describe()} [{r.layout.placement_text()}]: {r.step.total:.3f} s/step, "
                       f"{change_text(r.step.total / base)}")
    if result.runners_up_cut:
        out.append("  (the runner-up search's deterministic budget ended before every runner-up asked for)")
    if result.alternatives:
        out += ["", "the obvious alternatives, against the chosen one:"]
        for alt in result.alternatives:
            out.append(f"  {alt.name}: {alt.verdict}")
    return "\n".join(out)


def uncertainty_lines(result: SearchResult) -> list[str]:
    """The step-time band the calibration leaves, and whether the choice was a near-tie."""
    p, e = result.problem, result.best
    out = []
    band = step_band(p.target)
    if band is not None:
        low, high, source = band
        out.append(f"step-time band: {e.step.total * low:.1f} .. {e.step.total * high:.1f} s ({source})")
    u = result.uncertainty
    if result.fastest is not None and result.fastest.layout != e.layout:
        slower = p.score(e) / p.score(result.fastest) - 1
        out.append(f"robust choice: this layout, not the fastest modelled, {result.fastest.layout.describe()} "
                   f"[{result.fastest.layout.placement_text()}], which models {100 * slower:.1f}% faster, within the "
                   f"{u:.0%} uncertainty; this layout keeps TP on faster links (inside a chip first) and more headroom")
    elif result.robust_skipped:
        out.append(f"robust choice: not settled (the time limit stopped it); "
                   f"this is the fastest layout found, without regard to the {u:.0%} uncertainty")
    elif result.runners_up:
        line = near_tie_line(p.score(result.runners_up[0]) / p.score(e), u, held_out_mean(p.target))
        out += [line] if line else []
    return [""] + out if out else []


def near_tie_line(ratio: float, uncertainty: float, held_out: tuple[float, str] | None) -> str:
    """'near-tie: ...' when the next best layout's score is within the larger of the search's
    ``uncertainty`` and the calibration rows' mean held-out error (``held_out_mean``) of the
    chosen one's (``ratio`` = next / chosen), naming which; '' otherwise. The published runs
    tell two step times apart only beyond the held-out error, not the fit's."""
    h, source = held_out if held_out is not None else (0.0, "")
    d = ratio - 1
    if d > max(uncertainty, h):
        return ""
    if held_out is not None and d <= h:
        return f"near-tie: the next best layout is {100 * d:.1f}% slower, within the {source}"
    return f"near-tie: the next best layout is {100 * d:.1f}% slower, within the {uncertainty:.0%} uncertainty"


def evaluation_dict(e: Evaluation) -> dict:
    return {"layout": layout_dict(e.layout), **e.as_dict()}


def solve_dict(result: SearchResult, problem_info: dict, no_overlap: NoOverlapAnswer | None = None) -> dict:
    """One JSON document, under 1 MB whatever the machine (the rank map is its summary; --rank-map FILE has every rank)."""
    e = result.best
    return {
        "problem": problem_info,
        "status": result.status,
        "gap": result.gap,
        # no timings: the document is a function of the inputs alone unless the time limit stopped the search
        "stopped_by": STOPPED_BY.get(result.stopped),
        "space_size": result.space_size,
        "layout": layout_dict(e.layout),
        **e.as_dict(),
        **({"lnc_settings": {"NEURON_LOGICAL_NC_CONFIG": e.layout.lnc, "--logical-nc-config": e.layout.lnc}}
           if neuron_target(result.problem.target) else {}),
        "rank_map": rank_map_summary(e.layout, result.problem.target),
        "runners_up": [evaluation_dict(r) for r in result.runners_up],
        "alternatives": [{"name": a.name, "verdict": a.verdict, **evaluation_dict(a.evaluation)}
                         for a in result.alternatives],
        **({"no_overlap": no_overlap_dict(no_overlap)} if no_overlap is not None else {}),
        **({"uneven_stages": result.uneven_stages} if result.uneven_stages else {}),
    }


def joint_text(joint: dict) -> str:
    """One line of the joint layout-and-split search (search/jointsplit.py): proven, or its gap."""
    if joint["status"] == "NOT_SEARCHED":
        return joint["note"]
    what = (f"{joint['layouts_split']} layouts split exactly of {joint['candidates']} whose floor could beat the "
            f"best, {joint['cpsat_solves']} CP-SAT split solves")
    best = ("the answer" if joint["answer"] else
            f"{joint['layout']}, layers {','.join(map(str, joint['stage_layers'])) or 'even'}, {joint['step_s']:.3f} s "
            "(the answer is within the uncertainty of it)")
    if joint["status"] == "OPTIMAL":
        return f"{best}, proven optimal over {joint['scope']} ({what})"
    return (f"{best}, gap {100 * joint['gap']:.2f}% against {joint['bound_s']:.3f} s "
            f"({joint.get('stopped_by') or joint.get('note', 'unproven')}; {what})")
