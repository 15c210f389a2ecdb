"""The simulator's ``nki.collectives`` (ncc), run across the rank threads of ``run_ranks``.

Over ~450 lines: every nki.collectives entry point shares one rendezvous and one
ReplicaGroup check; split, each file would re-import the whole state machine.

Semantics from the "nki.collectives" API pages (NKI 0.6/0.7):
- ``ReplicaGroup``: a list of rank-lists; the collective runs independently inside each
  rank-list, which must not overlap. The order of a rank-list is the ring order.
- ``all_gather``/``reduce_scatter``/``all_to_all`` concatenate or split along
  ``collective_dim`` in rank-list order; ``op`` is nl.add, nl.minimum or nl.maximum,
  reduced in FP32. srcs/dsts are lists (coalesced); all on HBM or all on SBUF.
- ``collective_permute_implicit``: on each channel every rank sends its src to its
  successor in the ring and receives its predecessor's into dst;
  ``..._reduce`` sends ``op(srcs0, srcs1)`` instead; up to 4 channels.
- ``collective_permute_implicit_current_processing_rank_id(i, g, c)``: the rank whose data
  is in hand after ``i`` ring steps (``i = 0``: this rank).
Simulator convention (the pages leave it open; channels run in both directions of a
torus ring): even channel ids send to the next rank of the rank-list,
odd channel ids to the previous one; current_processing_rank_id follows the same rule.

Timing, on engine ``CC<channel>`` with the channel's LinkModel (bandwidth B, hop latency
a), for a group of n ranks and S bytes of this rank's src: all_gather (n-1)(S/B + a);
reduce_scatter (n-1)(S/n/B + a); all_to_all (n-1)(S/n/B * f + a) with f the link's
``bisection_factor`` (1 by default: full bisection; see ``rates.LinkModel`` for ring and
torus values); all_reduce 2(n-1)(S/n/B + a); one permute step S/B + a. Group collectives
start when every member's data is ready; a permute step starts when this rank and its
predecessor are ready.

Channels of group collectives: the reference signatures of all_gather, reduce_scatter,
all_reduce, all_to_all and collective_permute (NKI 0.6/0.7, ``nki_signatures.json``)
have no channel parameter; the runtime picks how the library collective uses the links.
The simulator runs them on engine CC0 with ``link[0]``. To model a library collective
that drives both directions of a ring, give channel 0 the bandwidth of both (e.g.
``link={0: LinkModel(2 * B, a)}``) in the collective-alone run.
"""

from __future__ import annotations

import functools
import os
from enum import Enum
from typing import Any

import numpy as np

from . import checks
from . import unimplemented as _unimplemented
from . import language as nl
from .errors import ConstraintError, SimulatorError, SymmetryError
from .instruction import NkiInstruction
from .language import NKIObject
from .registers import VirtualRegister
from .registers import runtime_int as _int
from .rendezvous import Deposit
from .state import current as _current
from .tensor import MemoryRegion, NkiTensor


class ReplicaGroup(NKIObject):
    """The set of ranks a collective runs on, as a list of disjoint rank-lists,
    e.g. ``ReplicaGroup([[0, 1, 2, 3], [4, 5, 6, 7]])``. A flat list is one rank-list."""

    def __init__(self, replica_groups: Any) -> None:
        groups = list(replica_groups)
        if groups and not isinstance(groups[0], (list, tuple)):
            groups = [groups]
        self.groups: tuple[tuple[int, ...], ...] = tuple(tuple(int(r) for r in g) for g in groups)
        seen: set[int] = set()
        for g in self.groups:
            if not g:
                raise ConstraintError(f"ReplicaGroup {self.groups}: empty rank-list")
            dup = seen.intersection(g) | {r for r in g if g.count(r) > 1}
            if dup:
                raise ConstraintError(f"ReplicaGroup {[list(x) for x in self.groups]}: rank(s) {sorted(dup)} "
                                      f"appear in more than one place; rank-lists must be disjoint")
            seen.update(g)

    def __repr__(self) -> str:
        return f"ReplicaGroup({[list(g) for g in self.groups]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplicaGroup) and other.groups == self.groups

    def __hash__(self) -> int:
        return hash(self.groups)


def _ctx(op: str) -> Any:
    ctx = _current()
    if ctx is None:
        raise SimulatorError(f"ncc.{op} called outside a simulated kernel (use nki.simulate or run_ranks)")
    return ctx


def _my_list(ctx: Any, group: Any, w: str) -> tuple[int, ...]:
    if not isinstance(group, ReplicaGroup):
        raise ConstraintError(f"{w}: replica_group must be an ncc.ReplicaGroup, got {type(group).__name__}")
    for g in group.groups:
        bad = [r for r in g if not 0 <= r < ctx.world]
        if bad:
            raise ConstraintError(f"{w}: {group} names rank(s) {bad} outside the {ctx.world} ranks of the run")
    if ctx.rendezvous.symmetric:
        _check_symmetric_group(ctx, group.groups, w)
    for g in group.groups:
        if ctx.rank in g:
            return g
    raise ConstraintError(f"{w}: rank {ctx.rank} is in no rank-list of {group}")


def _check_symmetric_group(ctx: Any, groups: tuple[tuple[int, ...], ...], w: str) -> None:
    """A symmetric run assumes every rank is in a rank-list of the same size (so every rank
    issues the same collective with the same timing); refuse a group that breaks this."""
    sizes = {len(g) for g in groups}
    covered = sum(len(g) for g in groups)
    if len(sizes) != 1 or covered != ctx.world:
        raise SymmetryError(
            f"{w}: symmetric run needs replica groups whose rank-lists all have the same size and "
            f"together hold all {ctx.world} ranks; got rank-list sizes {[len(g) for g in groups]} "
            f"covering {covered} ranks (run with symmetric=False)")


def _tensors(xs: Any, w: str, role: str) -> list[NkiTensor]:
    xs = [xs] if isinstance(xs, NkiTensor) else list(xs)
    if not xs:
        raise ConstraintError(f"{w}: {role} is empty")
    return [checks.tensor_arg(x, w, role) for x in xs]


# The collectives whose Neuron SDK 2.33 pages ("nki.collectives.all_gather", ".all_reduce",
# ".reduce_scatter") state "When LNC degree is 1, the srcs must be on private_hbm; only the
# dsts may be shared, and only when NKI_LNC1_SHARED_HBM=1 is set". The pages of
# collective_permute, collective_permute_implicit(_reduce) and all_to_all state no such
# rule (only "tensors must reside on HBM" or HBM/SBUF, not a mix), so their HBM tensors may
# be private_hbm or shared_hbm at any LNC degree.
LNC1_PRIVATE_SRCS = frozenset({"all_gather", "all_reduce", "reduce_scatter"})


def _placement(ctx: Any, op: str, name: str | None, tensors: list[NkiTensor], w: str,
               hbm_only: bool = False, n_srcs: int | None = None) -> None:
    """Placement rules of collective tensors (``tensors``: the srcs first, ``n_srcs`` of them).

    From the nki.collectives pages (Neuron SDK 2.33): tensors on HBM or SBUF, not a mix,
    never PSUM (stated for all_reduce, all_gather and reduce_scatter; the implicit permutes'
    pages state no memory rule, and the simulator holds them to the same one); HBM srcs all private_hbm or all shared_hbm, and likewise the dsts; for the
    collectives in ``LNC1_PRIVATE_SRCS``, with LNC degree 1 HBM srcs must be private_hbm. A
    kernel argument is an HBM tensor the caller owns (shared_hbm in the simulator), so at
    LNC 1 it cannot be a collective src: kernels copy it into a private_hbm buffer first.
    HBM dsts likewise all private or all shared, and shared_hbm dsts at LNC 1 only when
    NKI_LNC1_SHARED_HBM=1 is set (read from the environment). Kernel outputs never take part
    in a collective (checks.kernel_output: a simulator convention, not from the pages).
    """
    kinds = {t.buffer.is_hbm for t in tensors}
    if any(t.buffer is MemoryRegion.psum for t in tensors):
        raise ConstraintError(f"{w}: collective tensors must be on HBM or SBUF, not PSUM")
    if len(kinds) > 1:
        raise ConstraintError(f"{w}: collective tensors mix HBM and SBUF; all must be on HBM or all on SBUF")
    if hbm_only and kinds != {True}:
        raise ConstraintError(f"{w}: {op} tensors must reside on HBM")
    label = f"{op}(name={name!r})" if name else op
    srcs = tensors[:n_srcs] if n_srcs is not None else []
    if srcs and srcs[0].buffer.is_hbm:
        regions = {t.buffer for t in srcs}
        if len(regions) > 1:
            raise ConstraintError(f"{w}: collective srcs mix private_hbm and shared_hbm; on HBM they must be "
                                  f"all private_hbm or all shared_hbm")
        if ctx.lnc == 1 and op in LNC1_PRIVATE_SRCS and regions != {MemoryRegion.private_hbm}:
            t = next(t for t in srcs if t.buffer is not MemoryRegion.private_hbm)
            what = ("the kernel's own input tensor " if t.alloc.kind == "input" or t.alloc.id in ctx.inputs
                    else "tensor ") + t.alloc.label()
            raise ConstraintError(
                f"{w}: collective src {what} is in {t.buffer.name}; with LNC degree 1 collective srcs on HBM "
                f"must be in private_hbm (nki.collectives.all_gather / all_reduce pages, Neuron SDK 2.33); "
                f"copy it into an nl.private_hbm buffer first")
    dsts = tensors[n_srcs:] if n_srcs is not None else []
    if dsts and dsts[0].buffer.is_hbm:
        if len({t.buffer for t in dsts}) > 1:
            raise ConstraintError(f"{w}: collective dsts mix private_hbm and shared_hbm; on HBM they must be "
                                  f"all private_hbm or all shared_hbm")
        shared = [t for t in dsts if t.buffer is MemoryRegion.shared_hbm]
        if ctx.lnc == 1 and op in LNC1_PRIVATE_SRCS and shared and os.environ.get("NKI_LNC1_SHARED_HBM") != "1":
            raise ConstraintError(
                f"{w}: collective dst {shared[0].alloc.label()} is in shared_hbm; with LNC degree 1 a shared_hbm "
                f"dst needs NKI_LNC1_SHARED_HBM=1 (nki.collectives.all_gather / all_reduce pages, Neuron SDK "
                f"2.33); use an nl.private_hbm buffer")
    for t in tensors:
        if t.buffer.on_chip:
            checks.partition_dim(t.shape[0], w, f"collective tensor shape {t.shape}")
        t.alloc.collective_touched = t.alloc.collective_touched or f"{label} on rank {ctx.rank}"


def _sig(ts: list[NkiTensor]) -> tuple:
    return tuple((t.shape, t.dtype.name) for t in ts)


def _data(ctx: Any, ts: list[NkiTensor], op: str, name: str | None) -> list[np.ndarray] | None:
    if not ctx.numerics:
        return None
    return [np.array(ctx.read(t, op, name, "collective src")) for t in ts]


def _finish(ctx: Any, op: str, name: str | None, engine: str, start: float, end: float,
            reads: list[NkiTensor], writes: list[NkiTensor], sent: int, read_end: float | None = None) -> NkiInstruction:
    """Place a collective on its engine; its ``sent`` bytes also take this core's DMA
    bandwidth (the collective's DMA rings share the engines and HBM port of compute DMAs),
    paced over its link time: the rings read no faster than the link drains."""
    ctx.accesses(op, name, reads, writes)
    if sent and end > start:
        end = max(end, ctx.timeline.dma_traffic(start, sent, op, name, span=end - start))
    ctx.timeline.occupy(engine, start, end, op, name)
    ctx.timeline.record(reads, writes, end if read_end is None else max(read_end, end), end)
    return NkiInstruction(op, name, start, end)


def _group_collective(op: str, name: str | None, srcs: Any, dsts: Any, replica_group: Any,
                      params: tuple, duration: Any, compute: Any, hbm_only: bool = False) -> NkiInstruction:
    """Shared path of all_reduce / all_gather / reduce_scatter / all_to_all."""
    ctx = _ctx(op)
    w = ctx.where(op, name)
    srcs, dsts = _tensors(srcs, w, "srcs"), _tensors(dsts, w, "dsts")
    if len(srcs) != len(dsts):
        raise ConstraintError(f"{w}: {len(srcs)} srcs but {len(dsts)} dsts")
    _placement(ctx, op, name, srcs + dsts, w, hbm_only, n_srcs=len(srcs))
    if len(srcs) > 1 and not srcs[0].buffer.is_hbm:
        raise ConstraintError(f"{w}: coalesced collectives (several tensors) need HBM tensors")
    ranks = _my_list(ctx, replica_group, w)
    n, pos = len(ranks), ranks.index(ctx.rank)
    for s, d in zip(srcs, dsts):
        compute.check(s, d, n, w)
    ready = max(ctx.timeline.ready(srcs, dsts), ctx.timeline.engine_free.get("CC0", 0.0))
    dep = Deposit(ctx.who, f"{op}(name={name!r})" if name else op,
                  (op, _sig(srcs), _sig(dsts)) + params, (ready, _data(ctx, srcs, op, name)))
    members = tuple((r, ctx.program) for r in ranks)
    got = ctx.rendezvous.exchange(dep, members)
    start = max(got[m].payload[0] for m in members)
    nbytes = sum(s.nbytes for s in srcs)
    dur = duration(n, nbytes, ctx.link(0)) if n > 1 else 0.0
    if ctx.numerics:
        for i, d in enumerate(dsts):
            ctx.write(d, compute([got[m].payload[1][i] for m in members], pos, n).reshape(d.shape))
    # bytes this rank's DMA engines send: all_gather / all_to_all (n-1)/n of the result or the
    # src, all_reduce twice (reduce-scatter + all-gather phases) its src's (n-1)/n
    factor = {"all_reduce": 2.0}.get(op, 1.0) * (n - 1) / n if n > 1 else 0.0
    sent = int(factor * sum(d.nbytes if op == "all_gather" else s.nbytes for s, d in zip(srcs, dsts)))
    return _finish(ctx, op, name, "CC0", start, start + dur, srcs, dsts, sent)


def _reduce(op: Any, w: str) -> Any:
    if op not in nl._REDUCE_OPS:
        raise ConstraintError(f"{w}: op must be nl.add, nl.minimum or nl.maximum, got {op!r}")
    return lambda arrays: functools.reduce(lambda a, b: op(a, b), [a.astype(np.float32) for a in arrays])


class _Compute:
    def __init__(self, fn: Any, check: Any) -> None:
        self.fn, self.check = fn, check

    def __call__(self, arrays: list[np.ndarray], pos: int, n: int) -> np.ndarray:
        return self.fn(arrays, pos, n)


def _dim_check(dim: int, grow: bool, split: bool) -> Any:
    def check(s: NkiTensor, d: NkiTensor, n: int, w: str) -> None:
        if not 0 <= dim < s.ndim:
            raise ConstraintError(f"{w}: collective_dim {dim} out of range for src shape {s.shape}")
        want = list(s.shape)
        if grow:
            want[dim] *= n
        if split:
            if s.shape[dim] % n:
                raise ConstraintError(f"{w}: src dim {dim} of size {s.shape[dim]} does not split over {n} ranks")
            want[dim] //= n
        if tuple(want) != d.shape:
            raise ConstraintError(f"{w}: dst shape {d.shape} != {tuple(want)} expected from src {s.shape} "
                                  f"over {n} ranks on collective_dim {dim}")
    return check


def _same_shape_check(s: NkiTensor, d: NkiTensor, n: int, w: str) -> None:
    if s.shape != d.shape:
        raise ConstraintError(f"{w}: dst shape {d.shape} != src shape {s.shape}")


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """Every rank of a rank-list gets op-reduction of all their srcs (FP32 accumulation)."""
    red = _reduce(op, "all_reduce")
    return _group_collective("all_reduce", name, srcs, dsts, replica_group, (op.__name__,),
                      lambda n, b, link: 2 * (n - 1) * link.transfer_s(b / n),
                      _Compute(lambda arrays, pos, n: red(arrays), _same_shape_check))


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """dst = concatenation of the rank-list's srcs along ``collective_dim``, in list order."""
    dim = int(collective_dim)
    return _group_collective("all_gather", name, srcs, dsts, replica_group, (dim,),
                      lambda n, b, link: (n - 1) * link.transfer_s(b),
                      _Compute(lambda arrays, pos, n: np.concatenate(arrays, axis=dim),
                               _dim_check(dim, grow=True, split=False)))


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """The op-reduction of the srcs, split along ``collective_dim``; list position k gets chunk k."""
    dim, red = int(collective_dim), _reduce(op, "reduce_scatter")
    return _group_collective("reduce_scatter", name, srcs, dsts, replica_group, (dim, op.__name__),
                      lambda n, b, link: (n - 1) * link.transfer_s(b / n),
                      _Compute(lambda arrays, pos, n: np.array_split(red(arrays), n, axis=dim)[pos],
                               _dim_check(dim, grow=False, split=True)))


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Chunk j of every src goes to list position j; dst concatenates the received chunks in list order."""
    dim = int(collective_dim)
    return _group_collective("all_to_all", name, srcs, dsts, replica_group, (dim,),
                      lambda n, b, link: link.alltoall_s(n, b),
                      _Compute(lambda arrays, pos, n: np.concatenate(
                          [np.array_split(a, n, axis=dim)[pos] for a in arrays], axis=dim),
                          _dim_check(dim, grow=False, split=False)),
                      hbm_only=True)


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """Each (source, target) pair sends the source rank's src into the target rank's dst."""
    op = "collective_permute"
    ctx = _ctx(op)
    w = ctx.where(op, name)
    srcs, dsts = _tensors(srcs, w, "srcs"), _tensors(dsts, w, "dsts")
    if len(srcs) != 1 or len(dsts) != 1:
        raise ConstraintError(f"{w}: collective_permute takes exactly one src and one dst tensor")
    _placement(ctx, op, name, srcs + dsts, w, hbm_only=True, n_srcs=len(srcs))
    pairs = tuple((int(s), int(t)) for s, t in source_target_pairs)
    targets = [t for _, t in pairs]
    if len(set(targets)) != len(targets):
        raise ConstraintError(f"{w}: source_target_pairs {list(pairs)} send twice to the same target")
    ranks = tuple(sorted({r for p in pairs for r in p}))
    if any(not 0 <= r < ctx.world for r in ranks):
        raise ConstraintError(f"{w}: source_target_pairs {list(pairs)} name ranks outside 0..{ctx.world - 1}")
    if ctx.rendezvous.symmetric and (sorted(s for s, _ in pairs) != list(range(ctx.world))
                                     or sorted(targets) != list(range(ctx.world))):
        raise SymmetryError(f"{w}: symmetric run needs source_target_pairs in which every one of the "
                            f"{ctx.world} ranks sends once and receives once; got {list(pairs)} "
                            f"(run with symmetric=False)")
    if ctx.rank not in ranks:
        return NkiInstruction(op, name, 0.0, 0.0)
    _same_shape_check(srcs[0], dsts[0], 2, w)
    ready = max(ctx.timeline.ready(srcs, dsts), ctx.timeline.engine_free.get("CC0", 0.0))
    dep = Deposit(ctx.who, f"{op}(name={name!r})" if name else op, (op, _sig(srcs), _sig(dsts), pairs),
                  (ready, _data(ctx, srcs, op, name)))
    members = tuple((r, ctx.program) for r in ranks)
    got = ctx.rendezvous.exchange(dep, members)
    start = max(got[m].payload[0] for m in members)
    end = start + ctx.link(0).transfer_s(srcs[0].nbytes)
    source = [s for s, t in pairs if t == ctx.rank]
    writes = []
    if source:
        writes = dsts
        if ctx.numerics:
            ctx.write(dsts[0], got[(source[0], ctx.program)].payload[1][0].reshape(dsts[0].shape))
    sends = any(s == ctx.rank for s, _ in pairs)
    return _finish(ctx, op, name, "CC0", start, end, srcs, writes, srcs[0].nbytes if sends else 0)


def _ring_step(ctx: Any, op: str, name: str | None, srcs_by_channel: list, dsts_by_channel: Any,
               replica_group: Any, channel_ids: Any, reducer: Any) -> NkiInstruction:
    """One step of the implicit ring permute (with reduction when ``reducer`` is given)."""
    w = ctx.where(op, name)
    ranks = _my_list(ctx, replica_group, w)
    n, pos = len(ranks), ranks.index(ctx.rank)
    chans = [int(c) for c in channel_ids]
    dst_lists = [_tensors(d, w, "dsts_by_channel entry") for d in dsts_by_channel]
    src_lists = [[_tensors(s, w, "srcs_by_channel entry") for s in group] for group in srcs_by_channel]
    if not (len(chans) == len(dst_lists) and all(len(s) == len(chans) for s in src_lists)):
        raise ConstraintError(f"{w}: channel_ids {chans} but {len(dst_lists)} dst lists and "
                              f"{[len(s) for s in src_lists]} src lists; one list per channel")
    if len(set(chans)) != len(chans) or len(chans) > 4 or any(c < 0 for c in chans):
        raise ConstraintError(f"{w}: channel_ids {chans} must be distinct, non-negative, at most 4")
    for lists in [dst_lists] + src_lists:
        if any(len(x) != 1 for x in lists):
            raise ConstraintError(f"{w}: each channel takes exactly one tensor (coalescing not supported)")
    dsts = [d[0] for d in dst_lists]
    srcs = [[s[c][0] for s in src_lists] for c in range(len(chans))]
    flat_srcs = [t for ss in srcs for t in ss]
    _placement(ctx, op, name, flat_srcs + dsts, w, n_srcs=len(flat_srcs))
    for c, (ss, d) in enumerate(zip(srcs, dsts)):
        for s in ss:
            if s.shape != d.shape:
                raise ConstraintError(f"{w}: channel {chans[c]}: src shape {s.shape} != dst shape {d.shape}")
    tl = ctx.timeline
    readies = [max(tl.ready(ss, [d]), tl.engine_free.get(f"CC{ch}", 0.0)) for ss, d, ch in zip(srcs, dsts, chans)]
    outgoing = None
    if ctx.numerics:
        outgoing = []
        for ss, d in zip(srcs, dsts):
            vals = [ctx.read(s, op, name, "src").astype(np.float32) if reducer else ctx.read(s, op, name, "src")
                    for s in ss]
            outgoing.append(np.array(reducer(*vals) if reducer else vals[0]).astype(d.dtype))
    sig = (op, tuple(chans), tuple(_sig(ss) for ss in srcs), _sig(dsts), reducer.__name__ if reducer else None)
    dep = Deposit(ctx.who, f"{op}(name={name!r})" if name else op, sig, (readies, outgoing))
    members = tuple((r, ctx.program) for r in ranks)
    got = ctx.rendezvous.exchange(dep, members)
    ends = []
    for c, ch in enumerate(chans):
        step = 1 if ch % 2 == 0 else -1
        pred, succ = members[(pos - step) % n], members[(pos + step) % n]
        hop = ctx.link(ch).transfer_s(dsts[c].nbytes) if n > 1 else 0.0
        start = max(readies[c], got[pred].payload[0][c])
        succ_start = max(got[succ].payload[0][c], readies[c]) if n > 1 else start
        if ctx.numerics:
            ctx.write(dsts[c], got[pred].payload[1][c])
        ends.append(_finish(ctx, op, name, f"CC{ch}", start, start + hop, srcs[c], [dsts[c]],
                            dsts[c].nbytes if n > 1 else 0, read_end=max(start, succ_start) + hop))
    return NkiInstruction(op, name, min(e.start_s for e in ends), max(e.end_s for e in ends))


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=[0],
                                priority=None, name=None):
    """One ring step: on each channel, send src to the successor, receive the predecessor's src into dst."""
    ctx = _ctx("collective_permute_implicit")
    return _ring_step(ctx, "collective_permute_implicit", name, [srcs_by_channel], dsts_by_channel,
               replica_group, channel_ids, None)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group,
                                       op, channel_ids=[0], priority=None, name=None):
    """One ring step sending ``op(srcs0, srcs1)`` (FP32) to the successor; dst gets the predecessor's."""
    ctx = _ctx("collective_permute_implicit_reduce")
    w = ctx.where("collective_permute_implicit_reduce", name)
    if not callable(op):
        raise ConstraintError(f"{w}: op must be an nl function such as nl.add, got {op!r}")
    return _ring_step(ctx, "collective_permute_implicit_reduce", name, [srcs0_by_channel, srcs1_by_channel],
               dsts_by_channel, replica_group, channel_ids, op)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0,
                                                           name=None):
    """Rank whose data this rank holds after ``iteration_id`` ring steps on ``channel_id``
    (0: its own; even channels receive from the previous list entry, odd from the next),
    as a scalar register (``registers``): form offsets with register arithmetic and use
    them in ``tensor.ap(scalar_offset=...)`` or ``nl.ds``."""
    op = "collective_permute_implicit_current_processing_rank_id"
    ctx = _ctx(op)
    w = ctx.where(op, name)
    _my_list(ctx, replica_group, w)
    step = 1 if _int(channel_id, "channel_id") % 2 == 0 else -1
    it = _int(iteration_id, "iteration_id")

    def held(r: int) -> int:
        ranks = next(g for g in replica_group.groups if r in g)
        return ranks[(ranks.index(r) - step * it) % len(ranks)]
    values = [held(r) if any(r in g for g in replica_group.groups) else r for r in range(ctx.world)]
    return VirtualRegister.per_rank(values, ctx.rank, ctx.rendezvous.symmetric)


def rank_id(name=None):
    """This rank's id (0 .. number of ranks - 1), as a scalar register (``registers``)."""
    ctx = _ctx("rank_id")
    return VirtualRegister.per_rank(list(range(ctx.world)), ctx.rank, ctx.rendezvous.symmetric)


# --- variable-length collectives ("nki.collectives.all_to_all_v" / "all_gather_v", SDK 2.33) ---
def _metadata(ctx: Any, metadata_tensor: Any, n_rows: int, w: str) -> np.ndarray | None:
    meta = checks.tensor_arg(metadata_tensor, w, "metadata_tensor")
    if meta.ndim != 2 or not n_rows <= meta.shape[0] <= 4 or meta.shape[1] < ctx.world:
        raise ConstraintError(f"{w}: metadata_tensor must be ({n_rows}..4, world_size={ctx.world}), got {meta.shape}")
    if not ctx.numerics:
        return None
    return np.asarray(ctx.read(meta, "metadata_tensor", None, "metadata_tensor")).astype(np.int64)


def _v_collective(op: str, srcs: Any, dsts: Any, replica_group: Any, metadata_tensor: Any, recv_counts_known: bool,
                  has_rdispls: bool, name: str | None, meta: np.ndarray | None = None) -> NkiInstruction:
    """all_to_all_v / all_gather_v on flat element buffers (counts and displacements in
    elements, row-major). all_to_all_v: row 0 send counts and row 1 send displacements per
    destination rank (column = rank id). all_gather_v: only column 0 of rows 0/1 (the one
    chunk every destination gets); the chunk of list position s lands in slot s of dst
    (dst split into equal slots per rank). Rows 2/3, when present, hold receive counts and
    displacements per source rank. Without receive displacements, all_to_all_v packs the
    received chunks in rank-list order (ASSUMPTION: the pages leave it open)."""
    ctx = _ctx(op)
    w = ctx.where(op, name)
    srcs, dsts = _tensors(srcs, w, "srcs"), _tensors(dsts, w, "dsts")
    if len(srcs) != 1 or len(dsts) != 1:
        raise ConstraintError(f"{w}: {op} takes exactly one src and one dst tensor")
    _placement(ctx, op, name, srcs + dsts, w, hbm_only=True, n_srcs=1)
    ranks = _my_list(ctx, replica_group, w)
    n = len(ranks)
    if meta is None:
        meta = _metadata(ctx, metadata_tensor, 2 + int(recv_counts_known) + int(has_rdispls), w)
    src, dst = srcs[0], dsts[0]
    ready = max(ctx.timeline.ready(srcs, dsts), ctx.timeline.engine_free.get("CC0", 0.0))
    flat = np.array(ctx.read(src, op, name, "src")).reshape(-1) if ctx.numerics else None
    dep = Deposit(ctx.who, f"{op}(name={name!r})" if name else op, (op, _sig(srcs), _sig(dsts)),
                  (ready, flat, meta))
    members = tuple((r, ctx.program) for r in ranks)
    got = ctx.rendezvous.exchange(dep, members)
    start = max(got[m].payload[0] for m in members)
    sent_elems = src.size
    if ctx.numerics:
        out = np.array(dst.array()).reshape(-1)
        written = np.array(dst.written_mask()).reshape(-1)
        at = 0
        for s, m in enumerate(members):
            data, pm = got[m].payload[1], got[m].payload[2]
            if op == "all_to_all_v":
                cnt, disp = int(pm[0, ctx.rank]), int(pm[1, ctx.rank])
            else:
                cnt, disp = int(pm[0, 0]), int(pm[1, 0])
            chunk = data[disp:disp + cnt]
            if op == "all_gather_v" and not has_rdispls:
                at = s * (dst.size // n)
            elif has_rdispls:
                at = int(meta[3, m[0]])
            if at + cnt > dst.size or disp + cnt > data.size:
                raise ConstraintError(f"{w}: chunk of {cnt} elements from rank {m[0]} (displacement {disp}) does "
                                      f"not fit src of {data.size} / dst of {dst.size} elements at {at}")
            out[at:at + cnt] = chunk
            written[at:at + cnt] = True
            at += cnt
        ctx.write(dst, out.reshape(dst.shape))
        dst.set_written(written.reshape(dst.shape))
        sent_elems = int(meta[0, :ctx.world].sum()) if op == "all_to_all_v" else int(meta[0, 0]) * (n - 1)
    dur = (n - 1) * ctx.link(0).latency_s + sent_elems * src.dtype.itemsize / ctx.link(0).bandwidth_Bps if n > 1 else 0.0
    return _finish(ctx, op, name, "CC0", start, start + dur, srcs, dsts, sent_elems * src.dtype.itemsize)


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None):
    """All-to-all with per-destination counts and displacements from ``metadata_tensor``."""
    return _v_collective("all_to_all_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known,
                         has_rdispls, name)


def all_gather_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None):
    """All-gather of one variable-length chunk per rank, from ``metadata_tensor``."""
    return _v_collective("all_gather_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known,
                         has_rdispls, name)


class _Prepared(NkiInstruction):
    """What a ``*_prepare`` returns: the instruction handle plus the arguments its trigger reuses."""

    def __init__(self, op: str, name: str | None, start: float, args: tuple) -> None:
        super().__init__(op + "_prepare", name, start, start)
        self.kind, self.args, self.used = op, args, False


def _prepare(op: str, srcs: Any, dsts: Any, replica_group: Any, metadata_tensor: Any, recv_counts_known: bool,
             has_rdispls: bool, name: str | None) -> NkiInstruction:
    ctx = _ctx(op + "_prepare")
    w = ctx.where(op + "_prepare", name)
    pending = getattr(ctx, "pending_prepare", None)
    if pending is not None and not pending.used:
        raise ConstraintError(f"{w}: a {pending.op} is still waiting for its trigger; prepares share one slot "
                              f"(each prepare must be followed by exactly one trigger)")
    meta = _metadata(ctx, metadata_tensor, 2 + int(recv_counts_known) + int(has_rdispls), w)
    start = ctx.timeline.ready([metadata_tensor], [])
    ctx.pending_prepare = _Prepared(op, name, start, (srcs, dsts, replica_group, metadata_tensor, recv_counts_known,
                                                      has_rdispls, name, meta))
    return ctx.pending_prepare


def _trigger(op: str, prepare_instr: Any, name: str | None) -> NkiInstruction:
    ctx = _ctx(op + "_trigger")
    w = ctx.where(op + "_trigger", name)
    if not isinstance(prepare_instr, _Prepared) or prepare_instr.kind != op or prepare_instr.used:
        raise ConstraintError(f"{w}: prepare_instr must be the unused instruction returned by {op}_prepare, "
                              f"got {prepare_instr!r}")
    prepare_instr.used = True
    return _v_collective(op, *prepare_instr.args)


def all_to_all_v_prepare(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                         priority=None, name=None):
    """First half of a split all_to_all_v: reads the metadata now; the trigger moves the data."""
    return _prepare("all_to_all_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known, has_rdispls, name)


def all_to_all_v_trigger(prepare_instr, name=None):
    """Second half of a split all_to_all_v (the arguments of its prepare)."""
    return _trigger("all_to_all_v", prepare_instr, name)


def all_gather_v_prepare(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                         priority=None, name=None):
    """First half of a split all_gather_v: reads the metadata now; the trigger moves the data."""
    return _prepare("all_gather_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known, has_rdispls, name)


def all_gather_v_trigger(prepare_instr, name=None):
    """Second half of a split all_gather_v (the arguments of its prepare)."""
    return _trigger("all_gather_v", prepare_instr, name)


class rg_partition_op(Enum):
    """How ``ReplicaGroup.from_partition_op`` maps a rank to its rank-list id."""

    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


def _from_partition_op(world_size, op, operand):
    """Rank-lists of the ranks [0, world_size) sharing ``op(rank, operand)``, e.g.
    (8, div, 4) -> [[0..3], [4..7]], (8, mod, 4) -> [[0, 4], [1, 5], [2, 6], [3, 7]]."""
    fn = {rg_partition_op.bitwise_and: lambda r: r & operand, rg_partition_op.div: lambda r: r // operand,
          rg_partition_op.mod: lambda r: r % operand}[op]
    lists: dict[int, list[int]] = {}
    for r in range(int(world_size)):
        lists.setdefault(fn(r), []).append(r)
    return ReplicaGroup([lists[k] for k in sorted(lists)])


ReplicaGroup.from_partition_op = staticmethod(_from_partition_op)  # type: ignore[attr-defined]


_unimplemented.fill(globals(), "nki.collectives")
