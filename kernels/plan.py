"""KernelPlan: what a solved layout asks of the overlap kernels.

From a Layout and its Target (the collective placement rules of the Neuron runtime's
"Intra-node Collective Communications with AWS Neuron" page):
- the replica groups of TP (and EP) from the rank-to-chip map
  (`trnopt.optimizer.model.placement`): group 0 in ring order along physical neighbours,
  and how many groups there are;
- a check of every hop of the ring (one link: two cores of one chip, or two chips one
  link apart on one torus/ring axis, or any two chips on a switch or the scale-out
  network) and the link class the ring runs on (`optimizer.collectives.link_class` of
  the group's span, the same class the cost model charges).

Group 0 stands for every group. A dimension's digits are innermost on each axis they share
with later dimensions (rank order tp, cp, ep, dp, pp), so another group is group 0 moved by
a fixed offset on every axis: its members are as far apart, hop by hop and at the wrap, on
any torus, ring or switch. The plan therefore costs the same at 4 million ranks as at 16
(the tests check the claim against every group of small layouts);
- the channels the topology allows and the simulator LinkModel of one channel;
- the kernels each layer uses, at full shape: how each TP kernel's ring runs (`tp_ring`,
  from the kernel's own plan) and the tiling that must fit SBUF.

Ring order. The group's chips form a box: on every axis the group spans a set of
coordinates (TP, innermost in rank order, a contiguous block). The chips are put in a
Hamiltonian cycle of that box, then each chip's ranks are visited in core order (cores
of one chip are adjacent: on-chip). The cycle is built, not searched:
- one axis: 0, 1, .., f-1, which closes with a one-hop wrap only on a full ring (f equal
  to the axis size), on a switch or the scale-out network, or for f = 2;
- several axes: one axis is the "ring" dimension (size a) and the others are walked as a
  boustrophedon (snake) path of b positions; an a x b grid has a cycle on its own edges
  when a or b is even (out along the first row, snake back over the rest, home along
  the first column), and when both are odd only if the ring dimension can wrap in one
  hop (full ring or switch). A box with an odd number of chips and no wrap has no
  one-hop cycle; the plan then keeps the snake order and its check says which hop is
  longer than one link.

Channels (kernels take 1 to 4): four when the group holds every rank of one node (all
cores of every chip of a 2-D torus, nothing beyond it): the collective pages allow "4 for
replica groups containing all devices inside a node and 2 for other supported replica
groups" ("nki.collectives.collective_permute_implicit"), and a 2-D torus (a product of
two cycles) splits into two edge-disjoint Hamiltonian cycles (Kotzig, 1973), so the four
channels (both directions of both cycles) each take their own link. Otherwise two (both
ring directions) when the ring has three or more members and its chip cycle is not two
chips on a partial axis (those two chips share one link, so a second direction adds no
bandwidth); else one.

Link model (one channel = one direction of the ring; kept consistent with
benchmarks/kernel_overlap.py, which takes the trn2 torus 1,024 GB/s per chip as 2 axes x
2 directions x 256 GB/s): a target axis's ``bandwidth`` is per chip over the chip's two
links on that axis (both directions), so one ring direction gets ``bandwidth / 2``; an
on-chip hop gets ``on_chip_bandwidth / 2``; when g groups of the same dimension sit on
one chip their rings share its links, so a chip-to-chip hop gets ``bandwidth / 2 / g``
(the cost model divides by the ranks per chip the same way). The ring runs at its slowest
hop; the hop latency is the largest ``latency_us`` of the axes it crosses.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from trnopt.kernels import ring_alltoall
from trnopt.kernels.allgather_matmul import gather_plan
from trnopt.kernels.ring import scatter_steps
from trnopt.kernels.scatter_sbuf import sbuf_ring_plan
from trnopt.kernels.sim import LinkModel
from trnopt.kernels.tiling import MOVING_FMAX, PMAX, SBUF_TRN2, choose_tiling, split_rows
from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost.overlap import shape_class
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import Target
from trnopt.optimizer.model.workload import Workload

ITEMSIZE = 2  # BF16 activations and weights
SUM_ITEMSIZE = ITEMSIZE  # the reduce-scatter's running sums travel in the data's dtype (matmul_reduce_scatter's sum_dtype)


@dataclass(frozen=True)
class Hop:
    """One ring hop: ranks, the physical link class it takes and how many links it crosses."""

    src: int
    dst: int
    link: str  # core (on-chip), or the kind of the one axis it crosses; "multi" if several
    links: int  # 1 for every good hop; > 1 when the hop is routed through other chips


@dataclass(frozen=True)
class GroupPlan:
    """The replica groups of one parallel dimension and how their rings sit on the machine."""

    dim: str
    size: int
    first_group: tuple[int, ...]  # group 0 (ranks k * stride, k < size), ring order
    count: int  # groups of this dimension: ranks // size
    span: str  # e.g. "core4 x2"
    link_class: str  # collectives.link_class of the span (what the cost model charges)
    channels: int
    link_gbs: float  # simulator LinkModel bandwidth per channel, GB/s
    latency_us: float
    hops: tuple[Hop, ...]  # the first group's ring, wrap hop last
    one_hop: bool  # every hop of the ring is one link (of every group: see the module docstring)
    order_note: str

    @property
    def link(self) -> LinkModel:
        return LinkModel(bandwidth_Bps=self.link_gbs * 1e9, latency_s=self.latency_us * 1e-6)

    def hop_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for h in self.hops:
            out[h.link] = out.get(h.link, 0) + 1
        return out


@dataclass(frozen=True)
class KernelUse:
    """One overlap kernel a layer runs, at the full shape of one micro-batch."""

    kernel: str
    ops: str  # which projections use it, forward and backward
    m: int
    k: int
    n: int
    channels: int
    chunk_bytes: int  # bytes the widest ring step moves per channel (expert kernel: per sub-chunk, at the first step)
    ring: str  # how the ring runs: where its chunks live, its schedule, its steps (`tp_ring`); expert kernel: its exchange
    tiling: str
    sbuf_bytes: int  # per partition, the matmul pipeline's SBUF buffers
    sbuf_capacity: int

    @property
    def fits(self) -> bool:
        return self.sbuf_bytes <= self.sbuf_capacity


@dataclass(frozen=True)
class KernelPlan:
    target: str
    layout: str
    ranks: int
    tp: GroupPlan
    ep: GroupPlan | None
    kernels: tuple[KernelUse, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    lnc: int = 1  # programs per rank the kernels run with (the layout's LNC)
    shape_class: str | None = None  # the overlap table's shape class of the model (its width)
    sbuf_bytes: int = SBUF_TRN2  # SBUF bytes per partition of the target's chip, which the kernels plan for

    @property
    def groups(self) -> tuple[GroupPlan, ...]:
        return (self.tp,) + ((self.ep,) if self.ep else ())

    def problems(self) -> list[str]:
        """Checks the plan fails; empty when every ring is one link per hop and every tile fits."""
        out = []
        for g in self.groups:
            if not g.one_hop:
                bad = [h for h in g.hops if h.links != 1]
                out.append(f"{g.dim} ring has {len(bad)} hop(s) over more than one link "
                           f"(first {bad[0].src}->{bad[0].dst}: {bad[0].links} links)" if bad else
                           f"{g.dim}: some group's ring has a hop over more than one link")
        for k in self.kernels:
            if k.ring.startswith("cannot run"):
                out.append(f"{k.kernel}: {k.ring}")
            if not k.fits:
                out.append(f"{k.kernel}: tiles need {k.sbuf_bytes} SBUF bytes/partition > {k.sbuf_capacity}")
        return out

    def lines(self) -> list[str]:
        out = [f"kernel plan: {self.layout} on {self.target}, {self.ranks} ranks"
               + (f"; LNC {self.lnc}: each rank's {self.lnc} physical cores split every kernel's work"
                  if self.lnc > 1 else "")]
        for g in self.groups:
            first = g.first_group
            shown = ", ".join(map(str, first[:16])) + (", ..." if len(first) > 16 else "")
            hops = ", ".join(f"{n} {c}" for c, n in g.hop_counts().items())
            out += [f"  {g.dim.upper()}{g.size} [{g.span}]: {g.count} replica groups of {g.size}; "
                    f"group 0 ring order [{shown}]",
                    f"    link class {g.link_class}; hops per ring: {hops}; "
                    f"check: {'every hop is one link' if g.one_hop else 'NOT every hop is one link'}",
                    f"    channels {g.channels}, {g.link_gbs:.1f} GB/s and {g.latency_us:.1f} us per hop "
                    f"per channel; {g.order_note}"]
        if not self.kernels:
            out.append("  no overlap kernels: TP = 1 and no expert parallelism")
        for k in self.kernels:
            out.append(f"  {k.kernel:<23} {k.ops}")
            if k.kernel == "alltoall_expert_matmul":
                moves = ("ncc.all_to_all of " if k.channels == 1 else "the ring's two directions (store and forward), ")
                moves += f"{k.chunk_bytes / 2**20:.2f} MiB per sub-chunk" + (" per channel at the first step"
                                                                            if k.channels == 2 else "")
            else:
                moves = f"ring {k.ring}, up to {k.chunk_bytes / 2**20:.2f} MiB per step per channel"
            out.append(f"    M {k.m} K {k.k} N {k.n}, {k.channels} channel(s), {moves}; tiles {k.tiling}: "
                       f"{k.sbuf_bytes // 1024} KiB of {k.sbuf_capacity // 1024} KiB SBUF per partition "
                       f"({'fits' if k.fits else 'DOES NOT FIT'})")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        d["problems"] = self.problems()
        return d


# -- ring order ------------------------------------------------------------------------------
def snake(sizes: list[int]) -> list[tuple[int, ...]]:
    """Boustrophedon walk of a box (first size slowest): consecutive points differ by 1 in one coordinate."""
    if not sizes:
        return [()]
    rest = snake(sizes[1:])
    out = []
    for i in range(sizes[0]):
        out += [(i,) + p for p in (rest if i % 2 == 0 else rest[::-1])]
    return out


def grid_cycle(a: int, b: int, wrap_a: bool) -> list[tuple[int, int]] | None:
    """A Hamiltonian cycle of the a x b grid (edges between neighbouring rows and columns, plus
    (a-1, j) - (0, j) when ``wrap_a``), as (i, j) points; None when none exists."""
    if b == 1:
        return [(i, 0) for i in range(a)] if (wrap_a or a <= 2) else None
    if a == 1:
        return [(0, j) for j in range(b)] if b <= 2 else None
    if a % 2 == 0:
        body = [(i, j) for i in range(a) for j in (range(1, b) if i % 2 == 0 else range(b - 1, 0, -1))]
        return body + [(i, 0) for i in range(a - 1, -1, -1)]
    if b % 2 == 0 or wrap_a:  # columns first; both odd: the last column ends at row a-1, one wrap hop from row 0
        body = [(i, j) for j in range(b) for i in (range(1, a) if j % 2 == 0 else range(a - 1, 0, -1))]
        return body + [(0, j) for j in range(b - 1, -1, -1)]
    return None


def _ring_distance(a: int, b: int, axis) -> int:
    if a == b:
        return 0
    if axis.kind in ("torus", "ring"):
        d = abs(a - b)
        return min(d, axis.size - d)
    return 1  # switch, scale-out: one hop between any two chips


def _hop(layout: Layout, coords: dict[int, tuple[int, ...]], src: int, dst: int) -> Hop:
    a, b = coords[src], coords[dst]
    crossed = [(axis, _ring_distance(x, y, axis)) for axis, x, y in zip(layout.axes[1:], a[1:], b[1:]) if x != y]
    if not crossed:
        return Hop(src, dst, "core", 1)
    links = sum(d for _, d in crossed)
    return Hop(src, dst, crossed[0][0].kind if len(crossed) == 1 else "multi", links)


def order_group(layout: Layout, coords: dict[int, tuple[int, ...]], ranks: list[int]) -> tuple[list[int], str]:
    """The group's ranks in ring order along physical neighbours, and how the order was made."""
    axes = layout.axes
    per_axis = [sorted({coords[r][j] for r in ranks}) for j in range(len(axes))]
    spanned = [j for j in range(1, len(axes)) if len(per_axis[j]) > 1]

    def wraps(j: int) -> bool:
        vals, axis = per_axis[j], axes[j]
        return _ring_distance(vals[-1], vals[0], axis) == 1 and len(vals) >= 3

    chips_order: list[tuple[int, ...]]
    if not spanned:
        chips_order, note = [()], "one chip: cores in order (on-chip)"
    else:
        ring_dim = max(spanned, key=lambda j: (wraps(j), len(per_axis[j]) % 2 == 0))
        others = [j for j in spanned if j != ring_dim]
        path = snake([len(per_axis[j]) for j in others])
        cyc = grid_cycle(len(per_axis[ring_dim]), len(path), wraps(ring_dim))
        closed = cyc is not None
        if cyc is None:
            cyc = [(i, q) for q in range(len(path)) for i in range(len(per_axis[ring_dim]))]
        chips_order = []
        for i, q in cyc:
            pos = {ring_dim: i, **{j: path[q][n] for n, j in enumerate(others)}}
            chips_order.append(tuple(per_axis[j][pos[j]] for j in spanned))
        shape = " x ".join(f"{axes[j].name}{len(per_axis[j])}" for j in spanned)
        note = (f"chips {shape} in a {'cycle' if closed else 'snake that cannot close in one hop'} "
                f"(ring dimension {axes[ring_dim].name}"
                f"{', wraps in one hop' if wraps(ring_dim) else ''}), cores of each chip in order")
    by_chip: dict[tuple[int, ...], list[int]] = {}
    for r in ranks:
        by_chip.setdefault(tuple(coords[r][j] for j in spanned), []).append(r)
    ordered = [r for chip in chips_order for r in sorted(by_chip[chip], key=lambda r: coords[r][0])]
    return ordered, note


def whole_node(layout: Layout, span) -> bool:
    """Whether a group of this ``span`` holds every rank of one node and nothing beyond it:
    every core of every chip of a 2-D torus (two torus axes of three or more chips, whose
    links split into two edge-disjoint Hamiltonian cycles)."""
    spanned = {a.name: f for a, f in span}
    node = [a for a in layout.axes if a.kind in ("core", "torus")]
    return (sum(a.kind == "torus" and a.size >= 3 for a in node) == 2 and set(spanned) <= {a.name for a in node}
            and all(spanned.get(a.name, 1) == a.size for a in node))


def group_plan(layout: Layout, target: Target, dim: str) -> GroupPlan:
    """The replica groups of ``dim`` (tp or ep): group 0 in ring order, with its link model and hop check."""
    size = layout.degree(dim)
    stride = math.prod(layout.degree(d) if d != "dp" else layout.dp // layout.ep for d in DIMS[:DIMS.index(dim)])
    first = [k * stride for k in range(size)]
    coords = {r: layout.rank_coordinates(r)[1] for r in first}
    ring, note = order_group(layout, coords, first)
    span = layout.span(dim)
    hops = [_hop(layout, coords, ring[i], ring[(i + 1) % size]) for i in range(size)] if size > 1 else []
    # channels and link model
    chip_cycle = len({coords[r][1:] for r in ring})
    partial_pair = chip_cycle == 2 and any(a.kind in ("torus", "ring") and f < a.size and a.size > 2
                                           for a, f in span if a.kind != "core")
    channels = 4 if whole_node(layout, span) else 2 if size >= 3 and not partial_pair else 1
    # groups of this dimension whose rings leave each chip over the same links
    sharing = max(1, layout.ranks_per_chip // layout.placement[DIMS.index(dim)][0])
    bws, lats = [], [0.0]
    for h in hops:
        if h.link == "core":
            bws.append(target.chip.on_chip_bandwidth / 2)
            continue
        a, b = coords[h.src], coords[h.dst]
        for axis, x, y in zip(layout.axes[1:], a[1:], b[1:]):
            if x != y:
                bws.append(axis.bandwidth / 2 / sharing)
                lats.append(axis.latency)
    bw = min(bws) if bws else target.chip.on_chip_bandwidth / 2
    text = " x ".join(f"{a.name}{f}" for a, f in span) or "one rank"
    return GroupPlan(dim, size, tuple(ring), layout.ranks // size, text,
                     cc.link_class(span) if span else "none", channels, bw / 1e9, max(lats) * 1e6, tuple(hops),
                     all(h.links == 1 for h in hops), note)


# -- kernels per layer -------------------------------------------------------------------------
def full_shapes(workload: Workload, layout: Layout) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) per kernel at the full shape, the narrowest projection (attention output,
    h x h/tp): the least matmul to hide behind, so the measured fraction is the conservative one.
    M = the micro-batch's sequence rows (seq / cp * micro-batch)."""
    m = workload.training.seq // layout.cp * layout.micro_batch
    h, tp = workload.model.hidden, layout.tp
    return {"allgather_matmul": (m, h, h // tp), "matmul_reduce_scatter": (m, h // tp, h)}


def kernel_uses(workload: Workload, layout: Layout, target: Target, tp: GroupPlan,
                ep: GroupPlan | None) -> list[KernelUse]:
    mdl = workload.model
    cap = target.chip.sbuf_bytes_per_partition
    out = []
    if layout.tp > 1:
        shapes = full_shapes(workload, layout)
        ch = tp.channels
        m, k, n = shapes["allgather_matmul"]
        ms = m // layout.tp
        t = choose_tiling(ms, k, n, ITEMSIZE, ITEMSIZE, sbuf_bytes=cap)
        how, chunk = tp_ring("allgather_matmul", ms, k, n, layout.tp, ch, layout.lnc, cap)
        out.append(KernelUse("allgather_matmul", "QKV and MLP-in projections (column-parallel) forward; "
                             "gradient of attention-out and MLP-out inputs backward", m, k, n, ch, chunk,
                             how, _tiling_text(t), t.sbuf_bytes(k, n, ITEMSIZE, ITEMSIZE), cap))
        m, k, n = shapes["matmul_reduce_scatter"]
        t = choose_tiling(m // layout.tp, k, n, ITEMSIZE, ITEMSIZE, addend=True, addend_itemsize=SUM_ITEMSIZE,
                          sbuf_bytes=cap)
        how, chunk = tp_ring("matmul_reduce_scatter", m // layout.tp, k, n, layout.tp, ch, layout.lnc, cap)
        out.append(KernelUse("matmul_reduce_scatter", "attention-out and MLP-out projections (row-parallel) "
                             "forward; gradient of QKV and MLP-in inputs backward", m, k, n, ch, chunk,
                             how, _tiling_text(t), t.sbuf_bytes(k, n, ITEMSIZE, ITEMSIZE, SUM_ITEMSIZE), cap))
    if ep is not None and mdl.moe is not None:
        ch = expert_channels(ep)
        tokens = workload.training.seq // layout.cp * layout.micro_batch // layout.tp * mdl.moe.top_k
        e_local = mdl.moe.experts // layout.ep
        # capacity slots per (source rank, expert) and sub-chunk; on the ring each core's
        # slots split in halves, one each way, so they round up to a multiple of 2 x LNC
        unit = 2 * layout.lnc if ch == 2 else 1
        c = max(1, -(-tokens // (layout.ep * e_local * 4)))
        c = -(-c // unit) * unit
        f = mdl.moe.expert_ffn
        t = choose_tiling(layout.ep * c, mdl.hidden, f, ITEMSIZE, ITEMSIZE, sbuf_bytes=cap)
        block = e_local * mdl.hidden * c * ITEMSIZE  # what one rank sends another per sub-chunk
        # per channel at the first step: the whole send buffer (all_to_all), or the half-blocks
        # the ring's direction carries
        chunk = layout.ep * block if ch == 1 else len(ring_alltoall.pieces(layout.ep, 0)) * block // 2
        out.append(KernelUse("alltoall_expert_matmul", f"MoE layers: dispatch, {e_local} local expert(s), combine "
                             f"(top-{mdl.moe.top_k}, 4 sub-chunks)", tokens, mdl.hidden, f, ch, chunk,
                             "all_to_all" if ch == 1 else "store and forward", _tiling_text(t),
                             t.sbuf_bytes(mdl.hidden, f, ITEMSIZE, ITEMSIZE), cap))
    return out


def tp_ring(kernel: str, ms: int, k: int, n: int, tp: int, channels: int, lnc: int,
            sbuf_bytes: int) -> tuple[str, int]:
    """How a TP kernel's ring runs at one rank's full shape: ``(description, bytes per
    channel of its widest step)``, from the plan the kernel takes for its first program
    (`allgather_matmul.gather_plan`, `scatter_sbuf.sbuf_ring_plan`; at LNC 2 both programs
    run such a ring on the same channels, so the bytes count both).

    ``ms``: rows of a shard (all-gather) or of a chunk of the sum (reduce-scatter); ``k``,
    ``n``: the kernel's contraction and output columns per rank. The description says
    where the chunks live (SBUF, "on chip", or HBM), the schedule (`ring.gather_steps`:
    one way on one channel, else both ways, about tp/2 steps, or halves, tp - 1) and the
    steps, the rank's own included."""
    if ms < channels * lnc:  # the kernels' precondition: each program's rows split over the channels
        return f"cannot run: {ms} rows per shard over {channels} channel(s) x {lnc} core(s)", 0
    if kernel == "allgather_matmul":  # each program takes part of every shard's rows
        base, mine = split_rows(ms, lnc)[0]
        plan = gather_plan(k, base, mine, n, tp, channels, ITEMSIZE, ITEMSIZE, sbuf_bytes, programs=lnc)
        steps, row_bytes = plan.steps, k * ITEMSIZE
        where = f"on chip ({plan.n_bufs} shard buffers)" if plan.n_bufs else "through HBM"
    else:  # each program takes part of the columns, the whole chunk's rows
        cols = split_rows(n, lnc)[0][1]
        plan = sbuf_ring_plan(ms, k, cols, tp, channels, ITEMSIZE, SUM_ITEMSIZE, sbuf_bytes)
        steps, row_bytes = (plan.steps if plan else scatter_steps(ms, tp, channels, False)), cols * SUM_ITEMSIZE
        where = f"on chip (weight in {plan.blocks} column block(s))" if plan else "through HBM"
    way = "one way" if channels == 1 else "both ways" if len(steps) <= tp // 2 + 1 else "halves"
    rows = max((ch.rows for st in steps for ch in st if ch.channel >= 0), default=0)
    return f"{where}, {way}, {len(steps)} steps", rows * row_bytes * lnc


def expert_channels(ep: GroupPlan) -> int:
    """The exchange of the expert kernel on EP group ``ep``: 2, store and forward on the
    ring's two directions (`ring_alltoall`), where the group is a ring of torus or
    UltraServer-ring links whose both directions it may use (``ep.channels`` >= 2); else 1,
    ``ncc.all_to_all`` (a switch or the scale-out network, where every pair of ranks has
    a path of its own, or a group within one chip or of two chips).

    On a ring the bisection bounds every all-to-all: a cut into two arcs is crossed by
    ep^2/4 blocks each way over two links (Dally and Towles, "Principles and Practices of
    Interconnection Networks", 2004, ch. 3), which the cost model charges
    (`collectives.coefficients`, all_to_all on a torus or ring) and store and forward
    meets; the ring variant makes that schedule the kernel's own."""
    return 2 if ep.channels >= 2 and ep.link_class in ("torus", "ring") else 1


def _tiling_text(t) -> str:
    return (f"{t.k_block}x{PMAX} K rows, {t.m_tiles}x128 rows x {t.n_tiles}x{MOVING_FMAX} cols per PSUM group"
            + (", weight resident in SBUF" if t.resident_w else ""))


def kernel_plan(workload: Workload, layout: Layout, target: Target) -> KernelPlan:
    """The plan of a solved layout (see the module docstring)."""
    tp = group_plan(layout, target, "tp")
    ep = group_plan(layout, target, "ep") if layout.ep > 1 else None
    notes = []
    if layout.tp > 1 and tp.link_class != "core" and tp.channels == 1 and tp.size >= 3:
        notes.append("two chips on a partial axis share one link: one channel")
    return KernelPlan(target.name, layout.describe(), layout.ranks, tp, ep,
                      tuple(kernel_uses(workload, layout, target, tp, ep)), tuple(notes), layout.lnc,
                      shape_class(workload.model.hidden), target.chip.sbuf_bytes_per_partition)


# -- the planned rings in the simulator ------------------------------------------------------------
def local_ring(group: tuple[int, ...]) -> tuple[int, ...]:
    """The ring of one replica group in simulator rank ids: rank r of the group runs as id
    ``sorted(group).index(r)``, so the ring order (not the id order) is what the kernel sees."""
    ids = {r: i for i, r in enumerate(sorted(group))}
    return tuple(ids[r] for r in group)
