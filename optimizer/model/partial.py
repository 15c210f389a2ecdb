"""A partial machine: the whole one less failed instances or chips (``trnopt solve --exclude``).

Names. An instance is ``d<domain>i<instance>`` and one chip ``d<domain>i<instance>c<chip>``,
the ids of the rank map trnopt writes (``--rank-map``: its instance column reads ``d2i3``,
its chip column the chip), so a user copies them from the map of the job that failed.
Domains, instances and chips count from 0; an instance's number is its position in the
domain (on a Trn2 UltraServer, its position on the ring that joins the four instances).

The rule. A layout places every parallel dimension on factors of the machine's axes, so all
groups of a dimension have one shape; a machine with a hole is not such a product. The
machine left is therefore planned as whole domains of one shape, fewer of them or smaller:
``k`` instances per domain, on every domain that still has ``k`` healthy instances in a row
(the rest idle). An excluded chip takes its instance out of the plan: a torus with a hole
holds no 2D group, and its instance's other chips stay idle. Instances are positions of
the domain's slowest axis (on trn2u one ring position each, on trn3 a block of 16 or 4
switch ports); ``k`` instances of a ring or torus axis are a run of ``k`` neighbours, which
for ``k`` below the whole ring is a line (``Axis.closed`` False): its collectives see half
the ring's bandwidth, as a ring with a hole does. On a switch any ``k`` instances serve.
Every ``k`` with at least one such domain is a candidate machine, except when a larger
``k`` has as many domains (fewer instances a domain and no more domains only idles chips)
and when the runtime cannot join ``k`` instances into one domain (``Target.domain_instances``:
a Trn2 UltraServer runs as 4, 2 or 1 nodes, so a ring of 4 that lost one instance is planned
as 3 whole UltraServers or as pairs of neighbours, each pair a line of 2);
`trnopt solve` searches each candidate and answers the fastest (search/partial.py).
"""

from __future__ import annotations

import re
from dataclasses import replace

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import Remaining, Target

NAME = re.compile(r"d(\d+)i(\d+)(?:c(\d+))?")


def parse_names(target: Target, domains: int, text: str | list[str], source: str = "--exclude",
                key: str = "exclude") -> tuple[str, ...]:
    """The excluded names (comma-separated, or a list), each checked against the whole machine
    of ``domains`` domains, sorted; a name that is malformed, does not exist or comes twice is
    InputError(source, key, rule)."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise InputError(source, key, f"names must be strings, got {name!r}")
        m = NAME.fullmatch(name)
        if not m:
            raise InputError(source, key, f"{name!r} is not d<domain>i<instance> (an instance, e.g. d2i3) or "
                             "d<domain>i<instance>c<chip> (a chip), as the rank map's instance and chip columns name them")
        d, i, c = (int(g) if g is not None else None for g in m.groups())
        for what, value, count, per in (("domain", d, domains, ""),
                                        ("instance", i, target.instances_per_domain, " per domain"),
                                        ("chip", c, target.chips_per_instance, " per instance")):
            if value is not None and value >= count:
                raise InputError(source, key, f"{name!r}: no {what} {value}; the machine has {count} {what}s{per} "
                                 "(numbered from 0)")
        if name in seen:
            raise InputError(source, key, f"{name!r} is named twice")
        seen.add(name)
    chips = {n for n in names if NAME.fullmatch(n).group(3) is not None}
    for name in chips:
        instance = name[:name.index("c")]
        if instance in seen:
            raise InputError(source, key, f"{name!r} is a chip of {instance!r}, which is excluded whole")
    return tuple(sorted(names, key=lambda n: tuple(int(g or -1) for g in NAME.fullmatch(n).groups())))


def failed_instances(names: tuple[str, ...]) -> set[tuple[int, int]]:
    """(domain, instance) of every instance out of the plan: those named, and those with a chip named."""
    return {(int(m.group(1)), int(m.group(2))) for m in map(NAME.fullmatch, names)}


def _instance_axis(target: Target, source: str, key: str):
    """The slowest domain axis and the positions of it one instance holds, when instances are
    blocks of it (every built-in target); else InputError."""
    axis, n = target.domain_axes[-1], target.instances_per_domain
    if axis.size % n or target.chips_per_domain // axis.size * (axis.size // n) != target.chips_per_instance:
        raise InputError(source, key, f"{target.name}'s instances are not blocks of its slowest axis "
                         f"{axis.name}; only whole domains can be excluded there")
    return axis, axis.size // n


def _run(healthy: list[bool], k: int, ring: bool) -> tuple[int, ...] | None:
    """Positions of ``k`` healthy instances: on a ring the first run of ``k`` neighbours (wrapping),
    on a switch the first ``k`` healthy ones; None when the domain has none."""
    n = len(healthy)
    if not ring:
        up = [i for i in range(n) if healthy[i]]
        return tuple(up[:k]) if len(up) >= k else None
    for start in range(n):
        run = tuple((start + j) % n for j in range(k))
        if all(healthy[i] for i in run) and (k < n or start == 0):
            return run
    return None


def candidates(target: Target, domains: int, names: tuple[str, ...], source: str = "--exclude",
               key: str = "exclude") -> list[Target]:
    """The partial machines to search (largest instances-per-domain first), each a Target whose
    ``domain_axes`` are the shape kept and whose ``remaining`` says where it sits; with nothing
    excluded, the whole target. Nothing left is InputError."""
    if not names:
        return [target]
    failed = failed_instances(names)
    n = target.instances_per_domain
    if n > 1 and any(len({i for d2, i in failed if d2 == d}) < n for d in {d for d, _ in failed}):
        axis, block = _instance_axis(target, source, key)
    else:
        axis, block = target.domain_axes[-1], axis_block(target)
    ring = axis.kind in ("torus", "ring")
    out, most = [], 0
    for k in target.domain_instances or range(n, 0, -1):
        runs = {d: _run([(d, i) not in failed for i in range(n)], k, ring) for d in range(domains)}
        kept = tuple(d for d in range(domains) if runs[d] is not None)
        if len(kept) <= most:
            continue
        most = len(kept)
        shape = axis if k == n else replace(axis, size=k * block, closed=axis.closed and not ring)
        out.append(replace(target, domain_axes=(*target.domain_axes[:-1], shape),
                           remaining=Remaining(names, domains, n, kept, tuple(runs[d] for d in kept))))
    if not out:
        raise InputError(source, key, f"{', '.join(names)} leave no healthy instance of the {domains} "
                         f"{target.name} domain(s)")
    return out


def axis_block(target: Target) -> int:
    """Positions of the slowest domain axis one instance holds (its whole size on single-instance domains)."""
    return target.domain_axes[-1].size // target.instances_per_domain


def with_instances(target: Target, domains: int, names: tuple[str, ...], instances: int, source: str,
                   key: str) -> Target:
    """The candidate of ``instances`` instances per domain (what a layout file records); InputError when
    the exclusion gives no such candidate."""
    for cand in candidates(target, domains, names, source, key):
        if cand.instances_per_domain == instances:
            return cand
    raise InputError(source, key, f"excluding {', '.join(names)} leaves no plan of {instances} instance(s) per "
                     f"domain on {domains} {target.name} domain(s)")


def describe(target: Target) -> str:
    """One line: what is excluded and what the plan runs on."""
    rem = target.remaining
    if rem is None:
        return ""
    axis = target.domain_axes[-1]
    shape = "" if axis.closed else f" ({axis.name} is a line of {axis.size}: the ring is cut)"
    idle = (rem.whole_domains * rem.whole_instances - len(failed_instances(rem.excluded))
            - len(rem.domains) * target.instances_per_domain)
    return (f"excluded {', '.join(rem.excluded)}: planned on {len(rem.domains)} of {rem.whole_domains} domains, "
            f"{target.instances_per_domain} instance(s) each{shape}"
            + (f"; {idle} healthy instance(s) idle" if idle else ""))


def physical(target: Target, domain: int, instance: int) -> tuple[int, int]:
    """The whole machine's (domain, instance) of a partial machine's (domain, instance)."""
    rem = target.remaining
    if rem is None:
        return domain, instance
    return rem.domains[domain], rem.instances[domain][instance]
