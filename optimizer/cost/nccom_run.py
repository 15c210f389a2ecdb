"""What an nccom-test run measures on a target: its group's span on the target's axes, the link
classes it crosses, each class's share of its modelled byte time, the class that limits it,
and the cost model's time for it (optimizer/cost/collectives.py).

Nodes are taken in order, whole UltraServers first: nccom-test's -N nodes fill one
domain's instances before the next domain's. Workers are divided equally across nodes and
take each node's logical cores 0, 1, ... (so 16 ranks at LNC=2 are chips 0-3 of a Trn2
instance: its torus x axis).
"""

from __future__ import annotations

import math
from dataclasses import replace

from trnopt.optimizer.cost import collectives
from trnopt.optimizer.cost.collectives import Span, coefficients, collective_time
from trnopt.optimizer.cost.nccom import MeasurementError, Run
from trnopt.optimizer.model.target import Axis, Target


def linear_from(target: Target, run: Run) -> float:
    """Smallest message the cost model's linear view (``coefficients``) describes for the run's group.

    On axes whose collectives the Neuron runtime runs, the linear view is that of its ring
    algorithms, which the runtime uses above its RDH range (``collectives.NEURON.rdh_max``);
    smaller messages run Mesh or RDH, whose fixed costs differ. On plain ring axes: every size.
    """
    span, _ = run_span(target, run)
    neuron = getattr(collectives, "is_neuron", None)
    runtime = getattr(collectives, "NEURON", None)
    if neuron is not None and runtime is not None and neuron(span):
        return float(runtime.rdh_max)
    return 0.0


def effective(axis: Axis) -> Axis:
    """The axis at its achievable bandwidth (bandwidth x achievable), as the cost model uses it."""
    return replace(axis, bandwidth=axis.bandwidth * axis.achievable, achievable=1.0)


def _inside(target: Target) -> list[int]:
    """Per domain axis: how many of its positions one instance holds (chips fill axes fastest first)."""
    out, below = [], 1
    for a in target.domain_axes:
        cpi = target.chips_per_instance
        out.append(math.gcd(cpi // below, a.size) if below < cpi and cpi % below == 0 else 1)
        below *= a.size
    return out


def run_domains(target: Target, run: Run) -> int:
    return run.domains or -(-run.nodes // target.instances_per_domain)


def run_span(target: Target, run: Run) -> tuple[Span, int]:
    """(the span of the run's group on the target's axes at their achievable bandwidth, ranks per chip).

    Each node's ranks take logical cores 0.. (chips fill the instance's axes fastest first);
    the nodes of one domain take the axes' instance-changing positions; domains join over
    the scale-out network. MeasurementError when the run does not fit the target.
    """
    lnc = run.lnc or target.chip.lnc_default
    fail = lambda rule: MeasurementError(run.path, run.header_line, rule)  # noqa: E731
    if lnc not in target.chip.lnc_allowed:
        raise fail(f"LNC={lnc} is not allowed on {target.name}")
    cpc = target.chip.logical_cores(lnc)
    per_node, domains = run.ranks // run.nodes, run_domains(target, run)
    if run.nodes % domains or run.nodes // domains > target.instances_per_domain:
        raise fail(f"{run.nodes} nodes do not fill {domains} {target.name} domain(s) of "
                   f"{target.instances_per_domain} instance(s) equally")
    if (per_node <= cpc and cpc % per_node) or (per_node > cpc and per_node % cpc) or \
            per_node > cpc * target.chips_per_instance:
        raise fail(f"{per_node} ranks per node do not fill whole chips of {cpc} logical cores (LNC={lnc}) of one "
                   f"{target.instance}")
    factors = [1] * len(target.domain_axes)
    for need, positions in ((max(1, per_node // cpc), _inside(target)),
                            (run.nodes // domains, [a.size // i for a, i in zip(target.domain_axes, _inside(target))])):
        for j, room in enumerate(positions):
            f = math.gcd(need, room)
            factors[j] *= f
            need //= f
        if need != 1:
            raise fail(f"the run's chips and nodes do not tile the axes of {target.name}")
    axes = target.axes(lnc, domains)
    span = [(effective(axes[0]), min(per_node, cpc))] if min(per_node, cpc) > 1 else []
    span += [(effective(a), f) for a, f in zip(axes[1:-1], factors) if f > 1]
    if domains > 1:
        span.append((effective(axes[-1]), domains))
    return tuple(span), min(per_node, cpc)


def link_classes(target: Target, run: Run) -> list[tuple[str, tuple[str, ...]]]:
    """(link class, names of the target's link tables) of every class the run's group crosses
    outside its chips, innermost first: the axes of one kind at one level (the torus's two axes
    together, as ``collectives.levels`` adds their bandwidths)."""
    span, _ = run_span(target, run)
    out: dict[tuple[str, str], list[str]] = {}
    for a, _ in span:
        if a.level != "chip":
            out.setdefault((a.level, a.kind), []).append(a.name)
    return [(kind, tuple(names)) for (_, kind), names in out.items()]


def scaled_links(target: Target, names: tuple[str, ...], factor: float) -> Target:
    """The target with the named link tables' bandwidth multiplied by ``factor``."""
    def change(a: Axis) -> Axis:
        return replace(a, bandwidth=a.bandwidth * factor) if a.name in names else a
    return replace(target, domain_axes=tuple(change(a) for a in target.domain_axes),
                   scale_out=change(target.scale_out))


def byte_shares(target: Target, run: Run) -> dict[tuple[str, ...], float]:
    """Per link class the run crosses: its share of the run's modelled seconds per byte.

    The cost model's byte time is a sum over the levels of a hierarchical collective,
    sum (n-1)/n * S / (inner * B) (``collectives``), each term inversely proportional to its
    class's bandwidth; doubling a class's bandwidth halves its term, so its share is
    2 * (beta - beta with that class doubled) / beta.
    """
    beta = model_time(target, run)[0]
    return {names: 2 * (beta - model_time(scaled_links(target, names, 2.0), run)[0]) / beta
            for _, names in link_classes(target, run)}


def measured_link(target: Target, run: Run) -> tuple[str, tuple[str, ...]]:
    """(link class, names of the target's link tables) that limit the run: the class with the
    largest share of its modelled byte time (``byte_shares``), not merely its outermost one.

    A hierarchical collective moves only S / (ranks inside a domain) per rank across the
    scale-out network (collectives.stages: the inter-node stage runs on what the intra-node
    stage left), so a multi-domain table is mostly a measure of the domain's slowest links;
    charging all of its time to EFA would read a slow UltraServer ring as an EFA a hundred
    times slower than its datasheet. ("core", ()) for a group inside one chip.
    """
    shares = byte_shares(target, run)
    if not shares:
        return "core", ()
    names = max(shares, key=lambda k: (shares[k], -list(shares).index(k)))
    link = next(kind for kind, n in link_classes(target, run) if n == names)
    return link, names


def model_time(target: Target, run: Run) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) the cost model gives the run's group on this target."""
    span, per_chip = run_span(target, run)
    return coefficients(run.op, span, per_chip)


def run_times(target: Target, run: Run) -> list[float]:
    """The cost model's seconds for every row of the run on this target, the algorithm chosen by size
    (``collectives.collective_time``)."""
    span, per_chip = run_span(target, run)
    return [collective_time(run.op, row.size, span, per_chip) for row in run.rows]
