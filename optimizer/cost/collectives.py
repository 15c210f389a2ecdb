"""Collective times on the links a group spans: the alpha-beta ring, and the Neuron runtime's algorithms.

Longer than ~400 lines because the Neuron model, its constants and the fit that derives
them from public nccom-test runs belong together: a constant is never far from its source.

Base formulas (Thakur et al., "Optimization of Collective Communication Operations in
MPICH", 2005; Patarasuk & Yuan, 2009 for the bandwidth-optimal ring), S = bytes per rank:

    ring all-reduce        2(n-1)/n * S / B + 2(n-1) * alpha
    ring reduce-scatter    (n-1)/n * S / B + (n-1) * alpha        (S = the unreduced input)
    ring all-gather        (n-1)/n * S / B + (n-1) * alpha        (S = the gathered output)
    point-to-point         S / B + alpha

A group spans factors of several physical axes. Its collective runs level by level,
innermost first (chip, then the scale-up domain, then scale-out), each level on the data
the inner levels left (S divided by the inner group sizes), the classic hierarchical
algorithm. Inside the domain the group's chips form one set of rings:
- axes of one kind (the two axes of a torus) carry traffic at once, so their bandwidths
  add: 16 chips in the trn2 4x4 torus get 512 + 512 = 1,024 GB/s, the seed's figure;
- a ring that crosses axes of different kinds (torus and UltraServer ring) runs at the
  slower kind's rate, the bottleneck: a TP group across the ring costs 4x its in-torus
  time, the seed's "classic silent slowdown";
- a group that takes only part of a torus or ring axis forms a line, whose embedded ring
  uses each link in one direction only: half the axis bandwidth.
All ranks on a chip run their groups' collectives at the same time, so a chip's link
bandwidth is shared by its ``ranks_per_chip`` ranks. Every bandwidth is the datasheet
figure times the axis's measured ``achievable`` share.

Axes whose ``collectives`` is ``"ring"`` (hand-built axes, the NVIDIA targets) run the
plain ring above at every size. Axes whose ``collectives`` is ``"neuron"`` (the Trainium
targets) run what the Neuron runtime runs (``stages``): an algorithm chosen by message
size and group shape, composed hierarchically across nodes, with the fixed costs that
Neuron's own nccom-test runs show (``Runtime``, ``fit_runtime``). Per reduce-scatter or
all-gather phase among n ranks (n_c on each chip, n/n_c chips), with alpha the hop latency
and W = sum over levels of (n-1)/n * S / (inner * B) the bandwidth-optimal byte time:

    algorithm   size (bytes/rank)   steps             byte time               fixed (once per op)
    Mesh        < 1 MB              1                 W, domain x routed hops launch
    RDH         < 12 MiB, 2^p chips [n_c>1]+log2(n/n_c) W (+ rdh_step a step)  launch
    KangaRing   above, all ranks    n/2 - 1           W                       launch + ring_setup
    Ring        above, otherwise    n - 1             W                       launch + ring_setup

Across nodes (EFA, ~15 us a hop): Mesh (< 1 MB, <= 8 nodes) 1 step, RDH (2^p nodes) log2
steps, Ring n-1 steps, each moving W; a group that crosses nodes adds ``internode`` once.
An all-reduce is a reduce-scatter then an all-gather. Sources: "Intra-node Collective
Communications with AWS Neuron" and "Inter-node Collective Communications with AWS
Neuron" (Neuron runtime deep dives), "NCCOM-TEST User Guide" (Neuron SDK docs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from trnopt.optimizer.model.target import Axis

Span = tuple[tuple[Axis, int], ...]
LEVELS = ("chip", "domain", "scale_out")
MB = 1e6
MIB = 2**20


def ring_allreduce_time(size: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """2(n-1)/n * S / B + 2(n-1) * alpha (Patarasuk & Yuan 2009). The seed's worked cases use alpha = 0."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


@dataclass(frozen=True)
class Level:
    """One step of a hierarchical collective: n members, per-rank bandwidth, hop latency."""

    name: str
    n: int
    bandwidth: float
    latency: float
    link_class: str
    longest_ring: int  # largest factor on one torus/ring axis (bisection of all-to-all)


def axis_bandwidth(axis: Axis, factor: int) -> float:
    """Per-chip bandwidth a group with ``factor`` chips on ``axis`` can use, times the axis's
    ``achievable`` share: all of it on a switch, a closed ring or the scale-out network; half
    on a line (part of a ring axis, or all of a ring axis with a hole: ``Axis.closed``)."""
    bandwidth = axis.bandwidth * axis.achievable
    if axis.kind in ("torus", "ring") and (factor < axis.size or not axis.closed):
        return bandwidth / 2
    return bandwidth


@lru_cache(maxsize=65536)  # step time asks it for every message size of every span
def levels(span: Span, ranks_per_chip: int) -> tuple[Level, ...]:
    """The chip / domain / scale-out levels a group spans, innermost first."""
    out = []
    for level in LEVELS:
        part = [(a, f) for a, f in span if a.level == level]
        if not part:
            continue
        n = math.prod(f for _, f in part)
        by_kind: dict[str, float] = {}
        for a, f in part:
            by_kind[a.kind] = by_kind.get(a.kind, 0.0) + axis_bandwidth(a, f)
        slowest = min(by_kind, key=by_kind.get)
        chip_bw = by_kind[slowest]
        # ranks on one chip share its links; on-chip traffic is per rank already
        per_rank = chip_bw if level == "chip" else chip_bw / ranks_per_chip
        latency = max(a.latency for a, _ in part)
        ring = max((f for a, f in part if a.kind in ("torus", "ring")), default=1)
        out.append(Level(level, n, per_rank, latency, slowest, ring))
    return tuple(out)


def _ring_coefficients(op: str, span: Span, ranks_per_chip: int) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) of the plain hierarchical ring (and all-to-all, p2p)."""
    lvs = levels(span, ranks_per_chip)
    per_byte = fixed = 0.0
    if op == "p2p":
        for a, _ in span:
            bw = a.bandwidth * a.achievable
            bw = bw / 2 if a.kind in ("torus", "ring") else bw
            bw = bw if a.kind == "core" else bw / ranks_per_chip
            if 1 / bw > per_byte:
                per_byte, fixed = 1 / bw, a.latency
        return per_byte, fixed
    group, inner = math.prod(lv.n for lv in lvs), 1
    for lv in lvs:
        if op == "all_reduce":
            per_byte += 2 * (lv.n - 1) / lv.n / (inner * lv.bandwidth)
            fixed += 2 * (lv.n - 1) * lv.latency
        elif op in ("all_gather", "reduce_scatter"):
            per_byte += (lv.n - 1) / lv.n / (inner * lv.bandwidth)
            fixed += (lv.n - 1) * lv.latency
        elif op == "all_to_all":
            bisection = max(1.0, lv.longest_ring / 4) if lv.link_class in ("torus", "ring") else 1.0
            per_byte += (inner * lv.n - inner) / group / lv.bandwidth * bisection
            fixed += lv.latency
        else:
            raise ValueError(f"unknown collective {op!r}")
        inner *= lv.n
    return per_byte, fixed


# -- the Neuron runtime ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    """Constants of the Neuron runtime's collectives, fitted by ``fit_runtime`` on the nccom-test
    examples of the "NCCOM-TEST User Guide" (Neuron SDK docs): ``NCCOM_16_RANKS`` and
    ``NCCOM_64_RANKS_2_NODES``.

    - ``launch``: fixed seconds of every collective (its floor: the Mesh time of a 4-byte
      all-reduce minus its two hops). The least certain constant: the same guide's newer
      all-gather examples (8 and 32 ranks) floor at 6-10 us, so it varies with instance and
      SDK release; calibration on step times should refit it and ``ring_setup``.
    - ``ring_setup``: extra fixed seconds of the ring family (Ring, KangaRing) inside a node:
      the intercept of the line through the two KangaRing points, minus launch and hops.
    - ``rdh_step``: synchronisation seconds per RDH step on top of its hop latency (each
      step is a pairwise exchange with its own handshake).
    - ``internode``: extra fixed seconds of a collective with an EFA stage.
    - ``mesh_max``, ``rdh_max``: the size switches (bytes per rank). Mesh below 1 MB: the
      "Algorithm Summary" of "Intra-node Collective Communications with AWS Neuron". RDH up
      to ``rdh_max``: that table says 56 MB, but the same page's size diagram ends RDH near
      10 MB, the 16-rank nccom-test example ran KangaRing at 32 MiB and the two-instance
      example's time jumps between 8 and 16 MiB (RDH to ring); 12 MiB agrees with all three.
    - ``mesh_max_nodes``: inter-node Mesh only on this many nodes or fewer ("Mesh does not
      scale well to large clusters", "Inter-node Collective Communications with AWS
      Neuron"; the page gives no number, 8 is an assumption).
    - ``contention``: collectives and compute share the DMA engines and HBM; a collective
      under compute has its byte time stretched by this factor (>= 1). nccom-test runs
      without compute, so the fit gives 1.0. On published step times it cannot be told
      apart from the links' achievable share (both stretch the byte time of every exposed
      collective), so calibration fits the share and leaves this at 1.0: trn1's fitted
      torus share carries it. The TP collectives under their matmuls get it from the
      simulator instead, whose timeline gives the fused kernels' DMA and HBM to both
      (the simulated overlap table).
    """

    launch: float
    ring_setup: float
    rdh_step: float
    internode: float
    mesh_max: float = 1 * MB
    rdh_max: float = 12 * MIB
    mesh_max_nodes: int = 8
    contention: float = 1.0


# Printed by fit_report() and checked against fit_runtime() by the tests.
NEURON = Runtime(launch=296.80e-6, ring_setup=1974.0e-6, rdh_step=58.58e-6, internode=192.20e-6)

# Neuron's nccom-test examples ("NCCOM-TEST User Guide", aws-neuron-sdk
# tools/neuron-sys-tools/nccom-test.rst): (bytes per rank, microseconds, algorithm shown).
# The instance types are not stated. The 16-rank run (the --show-algorithm example, in the
# guide since SDK 2.28) uses KangaRing, which pairs the four LNC=2 ranks of a Trainium2 chip: a trn2.48xlarge,
# ranks 0-15 = chips 0-3 = its torus x axis. The two-instance run (-r 64 -N 2, in the guide
# since SDK 2.10, May 2023, before Trn2) is two trn1.32xlarge: 32 ranks = 16 chips x 2 cores each.
NCCOM_16_RANKS = ((4, 299.91, "mesh"), (32, 299.69, "mesh"), (512, 299.82, "mesh"), (8192, 299.74, "mesh"),
                  (131072, 574.15, "mesh"), (2097152, 686.32, "rdh"), (33554432, 2754.15, "kangaring"),
                  (536870912, 9689.51, "kangaring"))
NCCOM_64_RANKS_2_NODES = ((8, 520), (16, 520), (32, 523), (64, 525), (128, 553), (256, 709), (512, 782),
                          (1024, 840), (2048, 881), (4096, 916), (8192, 1013), (16384, 1031), (32768, 1174),
                          (65536, 1315), (131072, 1315), (262144, 1311), (524288, 1312), (1048576, 1328),
                          (2097152, 1329), (4194304, 1378), (8388608, 1419), (16777216, 2138),
                          (33554432, 2711), (67108864, 3963), (134217728, 6279), (268435456, 11954),
                          (536870912, 21803), (1073741824, 41806))

RING_FAMILY = ("ring", "kangaring")
# HBM touches per byte a rank sends, per phase ("Intra-node Collective Communications with
# AWS Neuron", KangaRing): Ring reduce-scatter 2R1W per hop, all-gather 1R1W; KangaRing
# does two ranks' hop with one 3R1W (reduce-scatter) or one 1R2W (all-gather, duplication).
HBM_TOUCHES = {"reduce_scatter": 3.0, "all_gather": 2.0}
KANGARING_TOUCHES = {"reduce_scatter": 2.0, "all_gather": 1.5}


@dataclass(frozen=True)
class Stage:
    """One phase of a hierarchical collective: ``op`` on ``size`` bytes per rank (reduce-scatter
    input, all-gather output) among the ranks of one node (``intra``) or across nodes (``inter``)."""

    scope: str
    op: str
    size: float
    algorithm: str
    hops: int
    seconds: float  # hop latencies, RDH step synchronisation and byte time; no fixed costs
    hbm_bytes: float  # bytes read and written in HBM per chip


def is_neuron(span: Span) -> bool:
    """Whether the Neuron runtime runs this group's collectives (any axis says ``neuron``)."""
    return any(a.collectives == "neuron" for a, _ in span)


@lru_cache(maxsize=65536)
def _mesh_distance(span: Span) -> float:
    """Mean routed hops between two distinct chips of the group: Mesh writes straight to every
    rank and the torus routes it, so each byte loads this many links (1 on a switch).

    Per axis, the mean distance over all pairs: a closed ring of f: sum(min(d, f-d))/f; a line
    of f: (f^2-1)/(3f); a switch: (f-1)/f. Summed over axes (Manhattan) and scaled by n/(n-1)
    to leave out the pairs of a chip with itself.
    """
    part = [(a, f) for a, f in span if a.level == "domain"]
    n = math.prod(f for _, f in part)
    if n <= 1:
        return 1.0
    total = 0.0
    for a, f in part:
        if a.kind == "switch":
            total += (f - 1) / f
        elif f == a.size and a.closed:
            total += sum(min(d, f - d) for d in range(f)) / f
        else:
            total += (f * f - 1) / (3 * f)
    return total * n / (n - 1)


def _intra_algorithm(size: float, n_chip: int, n_chips: int, ranks_per_chip: int, rt: Runtime) -> str:
    """Mesh < mesh_max; RDH < rdh_max when the chips are a power of two (recursive halving
    needs N = 2^p); else KangaRing when the group holds every rank of its chips (two or more),
    Ring otherwise ("Intra-node Collective Communications with AWS Neuron")."""
    if size < rt.mesh_max:
        return "mesh"
    if size < rt.rdh_max and n_chips & (n_chips - 1) == 0:
        return "rdh"
    return "kangaring" if n_chip == ranks_per_chip >= 2 else "ring"


def _inter_algorithm(size: float, nodes: int, rt: Runtime) -> str:
    """Mesh for small messages on few nodes, RDH for mid sizes on 2^p nodes, Ring for large
    ("Inter-node Collective Communications with AWS Neuron", Algorithm Summary)."""
    if size < rt.mesh_max and nodes <= rt.mesh_max_nodes:
        return "mesh"
    if size < rt.rdh_max and nodes & (nodes - 1) == 0:
        return "rdh"
    return "ring"


def _hops(algorithm: str, n_chip: int, n: int) -> int:
    """Steps of one reduce-scatter or all-gather among n ranks (n_chip of them on each chip):
    Ring n-1 (a flat cycle); KangaRing n/2-1 (only the primary half of the ranks in the
    cycle); RDH one on-chip step plus log2(n / n_chip) exchanges; Mesh 1."""
    if n <= 1:
        return 0
    if algorithm == "ring":
        return n - 1
    if algorithm == "kangaring":
        return max(1, n // 2 - 1)
    if algorithm == "rdh":
        return (n_chip > 1) + math.ceil(math.log2(max(1, n // n_chip)))
    return 1


def _phase(scope: str, op: str, size: float, algorithm: str, lvs: list[Level], span: Span,
           ranks_per_chip: int, rt: Runtime) -> Stage:
    """One reduce-scatter or all-gather over the levels ``lvs`` (chip and domain, or scale-out).

    Byte time: sum over levels of (n-1)/n * size / (inner * B), the bandwidth-optimal traffic
    that Ring, KangaRing and RDH move ("no additional overhead in RDH", inter-node page),
    Mesh's domain term times the routed distance (``_mesh_distance``), all times contention.
    Latency: hops x the largest hop latency of the levels; RDH adds ``rdh_step`` per step
    inside a node. HBM: ranks_per_chip ranks each touch (n-1)/n * size x touches per byte.
    """
    n = math.prod(lv.n for lv in lvs)
    n_chip = next((lv.n for lv in lvs if lv.name == "chip"), 1)
    byte_time, inner = 0.0, 1
    for lv in lvs:
        stretch = _mesh_distance(span) if algorithm == "mesh" and lv.name == "domain" else 1.0
        byte_time += stretch * (lv.n - 1) / lv.n * size / (inner * lv.bandwidth)
        inner *= lv.n
    hops = _hops(algorithm, n_chip, n)
    latency = max(lv.latency for lv in lvs)
    sync = rt.rdh_step * hops if algorithm == "rdh" and scope == "intra" else 0.0
    touches = (KANGARING_TOUCHES if algorithm == "kangaring" else HBM_TOUCHES)[op]
    hbm = ranks_per_chip * (n - 1) / n * size * touches
    return Stage(scope, op, size, algorithm, hops, hops * latency + sync + rt.contention * byte_time, hbm)


def stages(op: str, size: float, span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> tuple[Stage, ...]:
    """The phases of ``op`` as the Neuron runtime composes them, in execution order
    ("Inter-node Collective Communications with AWS Neuron", Hierarchical Algorithm):

        all-gather      = inter-node all-gather, then intra-node all-gather
        reduce-scatter  = intra-node reduce-scatter, then inter-node reduce-scatter
        all-reduce      = intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather

    The intra-node algorithm is chosen on ``size`` (the op's buffer), the inter-node one on
    what reaches the network, size / (ranks of the group in one node). An all-reduce is a
    reduce-scatter followed by an all-gather at either scope.
    """
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(f"no staged form for {op!r}")
    lvs = levels(span, ranks_per_chip)
    intra = [lv for lv in lvs if lv.name != "scale_out"]
    inter = [lv for lv in lvs if lv.name == "scale_out"]
    n_intra = math.prod(lv.n for lv in intra)
    n_chip = next((lv.n for lv in intra if lv.name == "chip"), 1)
    out_intra: dict[str, Stage] = {}
    out_inter: dict[str, Stage] = {}
    if intra:
        alg = _intra_algorithm(size, n_chip, n_intra // n_chip, ranks_per_chip, runtime)
        for phase in ("reduce_scatter", "all_gather"):
            out_intra[phase] = _phase("intra", phase, size, alg, intra, span, ranks_per_chip, runtime)
    if inter:
        inter_size = size / n_intra
        alg = _inter_algorithm(inter_size, inter[0].n, runtime)
        for phase in ("reduce_scatter", "all_gather"):
            out_inter[phase] = _phase("inter", phase, inter_size, alg, inter, span, ranks_per_chip, runtime)
        if op == "all_reduce":
            rs, ag = out_inter["reduce_scatter"], out_inter["all_gather"]
            out_inter["all_reduce"] = replace(rs, op="all_reduce", hops=rs.hops + ag.hops,
                                              seconds=rs.seconds + ag.seconds, hbm_bytes=rs.hbm_bytes + ag.hbm_bytes)
    order = {"all_gather": (out_inter.get("all_gather"), out_intra.get("all_gather")),
             "reduce_scatter": (out_intra.get("reduce_scatter"), out_inter.get("reduce_scatter")),
             "all_reduce": (out_intra.get("reduce_scatter"), out_inter.get("all_reduce"),
                            out_intra.get("all_gather"))}[op]
    return tuple(s for s in order if s is not None)


def _fixed(span: Span, steps: Sequence[Stage], rt: Runtime) -> float:
    """launch, plus ring_setup when the intra-node stage is Ring or KangaRing, plus internode
    when a stage crosses nodes."""
    fixed = rt.launch
    if any(s.scope == "intra" and s.algorithm in RING_FAMILY for s in steps):
        fixed += rt.ring_setup
    if any(a.level == "scale_out" for a, _ in span):
        fixed += rt.internode
    return fixed


def algorithm(op: str, size: float, span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> str:
    """The algorithm that runs ``op`` for reports: ``ring`` on ring axes; on Neuron axes the
    intra-node and inter-node choices, e.g. ``kangaring``, ``rdh+ring`` (intra + inter);
    ``direct`` for all-to-all and ``p2p`` for a send; ``none`` for an empty group."""
    if not span or size <= 0:
        return "none"
    if op in ("all_to_all", "p2p"):
        return "direct" if op == "all_to_all" else "p2p"
    if not is_neuron(span):
        return "ring"
    steps = stages(op, size, span, ranks_per_chip, runtime)
    intra = next((s.algorithm for s in steps if s.scope == "intra"), None)
    inter = next((s.algorithm for s in steps if s.scope == "inter"), None)
    return "+".join(x for x in (intra, inter) if x)


def coefficients(op: str, span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) of collective ``op`` on a group: time = S * a + b.

    On ring axes this is the whole model, linear in S. ``op`` is one of:
    - ``all_reduce``: hierarchical, per level 2(n-1)/n / (inner * B) and 2(n-1) alpha;
    - ``all_gather`` (and ``reduce_scatter``): per level (n-1)/n / (inner * B), (n-1) alpha;
    - ``all_to_all``: per level (n_here - n_inner)/n_group / B, times k/4 on a torus or
      ring of k chips per axis where the bisection binds (Dally & Towles 2004, ch. 3),
      plus one alpha: the bytes leaving each inner block cross that level's links;
    - ``p2p``: a send to the neighbouring stage across the slowest axis spanned: one of
      the chip's two links on a torus or ring axis (half its bandwidth), all of it on a
      switch or the scale-out network.
    On Neuron axes it is the linear view of the algorithms used for large messages
    (KangaRing or Ring inside a node, Ring across nodes): the ring's bytes times contention,
    and launch + ring_setup (+ internode) + the hops of those algorithms; all-to-all and p2p
    keep the formulas above plus launch. ``collective_time`` is exact at every size; step
    time uses it for the per-layer TP and CP collectives, whose messages can be small, and
    this linear view for the large ones (gradients, ZeRO-3 gathers and reduce-scatters, EP,
    pipeline sends).
    """
    if not is_neuron(span):
        per_byte, fixed = _ring_coefficients(op, span, ranks_per_chip)
        return runtime.contention * per_byte, fixed
    if op in ("all_to_all", "p2p"):
        per_byte, fixed = _ring_coefficients(op, span, ranks_per_chip)
        return runtime.contention * per_byte, fixed + runtime.launch
    big = replace(runtime, mesh_max=0.0, rdh_max=0.0)
    per_byte = sum(s.seconds for s in stages(op, 1.0, replace_latency(span, 0.0), ranks_per_chip, big))
    steps = stages(op, 1.0, span, ranks_per_chip, big)
    latency = sum(s.seconds for s in steps) - per_byte
    return per_byte, _fixed(span, steps, big) + latency


def all_to_all_scale_out(span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> float:
    """Seconds per byte of an all-to-all's scale-out level alone: the whole's per-byte coefficient
    less the same group's with an unbounded scale-out network (the levels' terms add, ``coefficients``)."""
    if not any(a.kind == "scale_out" for a, _ in span):
        return 0.0
    free = tuple((replace(a, bandwidth=math.inf) if a.kind == "scale_out" else a, f) for a, f in span)
    return coefficients("all_to_all", span, ranks_per_chip, runtime)[0] - coefficients(
        "all_to_all", free, ranks_per_chip, runtime)[0]


def replace_latency(span: Span, latency: float) -> Span:
    """The span with every hop latency set to ``latency``."""
    return tuple((replace(a, latency=latency), f) for a, f in span)


def collective_time(op: str, size: float, span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> float:
    """Seconds for ``op`` on ``size`` bytes per rank over the group ``span``; nothing to send
    costs nothing. Ring axes: ``coefficients`` (S * a + b). Neuron axes: the fixed costs
    (``Runtime``) plus the seconds of every stage (``stages``), the algorithm chosen on the
    size at each stage; all-to-all and p2p as ``coefficients``."""
    if not span or size <= 0:
        return 0.0
    if not is_neuron(span) or op in ("all_to_all", "p2p"):
        per_byte, fixed = coefficients(op, span, ranks_per_chip, runtime)
        return size * per_byte + fixed
    steps = stages(op, size, span, ranks_per_chip, runtime)
    return _fixed(span, steps, runtime) + sum(s.seconds for s in steps)


def hbm_bytes(op: str, size: float, span: Span, ranks_per_chip: int = 1, runtime: Runtime = NEURON) -> float:
    """Bytes each chip reads and writes in HBM for ``op``: per phase, ranks_per_chip ranks x
    (n-1)/n x size x touches (Ring, Mesh, RDH: 3 per reduce-scatter byte, 2 per all-gather
    byte; KangaRing 2 and 1.5, "Intra-node Collective Communications with AWS Neuron"). On
    ring axes every level counts as a ring phase. All-to-all and p2p: one read and one write
    of what the rank sends."""
    if not span or size <= 0:
        return 0.0
    if op in ("all_to_all", "p2p"):
        return 2.0 * ranks_per_chip * size
    if is_neuron(span):
        return sum(s.hbm_bytes for s in stages(op, size, span, ranks_per_chip, runtime))
    phases = ("reduce_scatter", "all_gather") if op == "all_reduce" else (op,)
    total, inner = 0.0, 1
    for lv in levels(span, ranks_per_chip):
        total += sum(ranks_per_chip * (lv.n - 1) / lv.n * size / inner * HBM_TOUCHES[p] for p in phases)
        inner *= lv.n
    return total


def concurrent_time(collectives: Sequence[tuple[str, float, Span]], ranks_per_chip: int = 1,
                    runtime: Runtime = NEURON) -> float:
    """Seconds for collectives that run at the same time (TP and DP traffic in one window).

    Each puts its ring byte time per level (2(n-1)/n, or (n-1)/n, x size / (inner * B), times
    contention) on every axis of that level; on an axis several groups use, their byte times
    add. Each finishes after its fixed part (time alone minus its byte time) plus, level by
    level, the summed byte time of that level's busiest axis; the result is the last to
    finish. All-to-all and p2p load their outermost level.
    """
    load: dict[str, float] = {}
    parts = []
    for op, size, span in collectives:
        if not span or size <= 0:
            continue
        mine = _level_seconds(op, size, span, ranks_per_chip, runtime)
        own = sum(seconds for _, seconds in mine)
        groups = [[a.name for a, _ in span if a.level == lv.name] for lv, _ in mine]
        parts.append((collective_time(op, size, span, ranks_per_chip, runtime) - own, groups))
        for lv, seconds in mine:
            for a, _ in span:
                if a.level == lv.name:
                    load[a.name] = load.get(a.name, 0.0) + seconds
    return max((fixed + sum(max(load[name] for name in names) for names in groups) for fixed, groups in parts),
               default=0.0)


def _level_seconds(op: str, size: float, span: Span, ranks_per_chip: int, rt: Runtime) -> list[tuple[Level, float]]:
    """The ring byte time each level of the group carries (see ``concurrent_time``)."""
    lvs = levels(span, ranks_per_chip)
    if op in ("all_to_all", "p2p"):
        return [(lvs[-1], size * coefficients(op, span, ranks_per_chip, rt)[0])]
    factor = 2.0 if op == "all_reduce" else 1.0
    out, inner = [], 1
    for lv in lvs:
        out.append((lv, rt.contention * factor * (lv.n - 1) / lv.n * size / (inner * lv.bandwidth)))
        inner *= lv.n
    return out


def link_class(span: Span) -> str:
    """The link class of a group's outermost level (core, torus, ring, switch, scale_out)."""
    lvs = levels(span, 1)
    if not lvs:
        return "none"
    return lvs[-1].link_class


# -- the fit ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    runtime: Runtime
    neuronlink: float  # achievable share of the trn2 torus, from the KangaRing slope
    efa: float  # achievable share of trn1 EFA, from the two-instance slope


def fit_runtime(trn2_16: Span, trn1_64: Span) -> Fit:
    """Derive the Neuron constants from the nccom-test examples, in closed form.

    ``trn2_16`` is the 16-rank group on datasheet links (achievable 1): 4 ranks on each of
    chips 0-3, the trn2 torus x axis; ``trn1_64`` the 64 ranks on two trn1.32xlarge (2 ranks
    on each of 16 chips, the 4x4 torus, 2 instances over EFA). With a the hop latency and
    p_chip, p_link the all-reduce's seconds per byte on chip and on the links at share 1:
    1. launch = mean Mesh time of the four points <= 8 KiB - 2 a (Mesh: two steps);
    2. the line through the KangaRing points (32 MiB, 512 MiB), slope k and intercept c:
       neuronlink = p_link / (k - p_chip); ring_setup = c - launch - 2(16/2 - 1) a;
    3. rdh_step = (t(2 MiB) - launch - bytes at neuronlink) / steps - a, steps = 2(1 + log2 4);
    4. two instances, slope k2 through 512 MiB and 1 GiB: efa = p_efa / (k2 - p_intra),
       p_intra at the fitted neuronlink (carried over from trn2); internode = the mean of the
       four points <= 64 B - launch - Mesh hops (2 in the node, 2 across).
    """
    a16 = max(a.latency for a, _ in trn2_16 if a.level == "domain")
    floor = [t for s, t, _ in NCCOM_16_RANKS if s <= 8192]
    launch = sum(floor) / len(floor) * 1e-6 - 2 * a16
    (s1, t1, _), (s2, t2, _) = [p for p in NCCOM_16_RANKS if p[2] == "kangaring"]
    slope = (t2 - t1) * 1e-6 / (s2 - s1)
    intercept = t1 * 1e-6 - slope * s1
    chip = tuple((a, f) for a, f in trn2_16 if a.level == "chip")
    p_chip = _ring_coefficients("all_reduce", chip, 4)[0]
    p_link = _ring_coefficients("all_reduce", trn2_16, 4)[0] - p_chip
    neuronlink = p_link / (slope - p_chip)
    ring_setup = intercept - launch - 2 * _hops("kangaring", 4, 16) * a16
    size, t_rdh, _ = next(p for p in NCCOM_16_RANKS if p[2] == "rdh")
    steps = 2 * _hops("rdh", 4, 16)
    shared = _with_share(trn2_16, neuronlink, 1.0)
    rdh_bytes = size * _ring_coefficients("all_reduce", replace_latency(shared, 0.0), 4)[0]
    rdh_step = (t_rdh * 1e-6 - launch - rdh_bytes) / steps - a16
    (s3, t3), (s4, t4) = NCCOM_64_RANKS_2_NODES[-2:]
    slope2 = (t4 - t3) * 1e-6 / (s4 - s3)
    intra = tuple((a, f) for a, f in trn1_64 if a.level != "scale_out")
    p_intra = _ring_coefficients("all_reduce", replace_latency(_with_share(intra, neuronlink, 1.0), 0.0), 2)[0]
    p_total = _ring_coefficients("all_reduce", replace_latency(trn1_64, 0.0), 2)[0]
    p_efa = p_total - _ring_coefficients("all_reduce", replace_latency(intra, 0.0), 2)[0]
    efa = p_efa / (slope2 - p_intra)
    a1 = max(a.latency for a, _ in trn1_64 if a.level == "domain")
    a_efa = max(a.latency for a, _ in trn1_64 if a.level == "scale_out")
    floor2 = [t for s, t in NCCOM_64_RANKS_2_NODES if s <= 64]
    internode = sum(floor2) / len(floor2) * 1e-6 - launch - 2 * a1 - 2 * a_efa
    return Fit(Runtime(launch, ring_setup, rdh_step, internode), neuronlink, efa)


def _with_share(span: Span, link: float, efa: float) -> Span:
    """The span with achievable ``link`` on domain axes and ``efa`` on scale-out (cores stay at 1)."""
    share = {"chip": 1.0, "domain": link, "scale_out": efa}
    return tuple((replace(a, achievable=share[a.level], collectives="neuron"), f) for a, f in span)


def fit_rows(trn2_16: Span, trn1_64: Span, fit: Fit) -> list[tuple[str, int, float, float, str, str]]:
    """(run, bytes, measured us, model us, measured algorithm, model algorithm) for every
    nccom-test point, the model on ``fit``'s runtime and shares."""
    rows = []
    for spec, points, rpc, label in ((trn2_16, [(s, t, a) for s, t, a in NCCOM_16_RANKS], 4, "trn2 16 ranks"),
                                     (trn1_64, [(s, t, "") for s, t in NCCOM_64_RANKS_2_NODES], 2, "trn1 2x32 ranks")):
        span = _with_share(spec, fit.neuronlink, fit.efa)
        for size, t, alg in points:
            model = collective_time("all_reduce", size, span, rpc, fit.runtime) * 1e6
            rows.append((label, size, t, model, alg, algorithm("all_reduce", size, span, rpc, fit.runtime)))
    return rows


def fit_report(trn2_16: Span, trn1_64: Span) -> str:
    """The fit and every point, model against measurement, as text."""
    fit = fit_runtime(trn2_16, trn1_64)
    rt = fit.runtime
    lines = [f"launch {rt.launch * 1e6:.2f} us, ring_setup {rt.ring_setup * 1e6:.1f} us, rdh_step "
             f"{rt.rdh_step * 1e6:.2f} us, internode {rt.internode * 1e6:.2f} us, NeuronLink achievable "
             f"{fit.neuronlink:.4f}, EFA achievable {fit.efa:.4f}",
             f"{'run':16} {'bytes':>11} {'measured us':>12} {'model us':>10} {'error':>7}  algorithm (measured/model)"]
    for label, size, t, model, alg, mine in fit_rows(trn2_16, trn1_64, fit):
        lines.append(f"{label:16} {size:11d} {t:12.2f} {model:10.2f} {model / t - 1:+7.1%}  {alg or '-'}/{mine}")
    return "\n".join(lines)
