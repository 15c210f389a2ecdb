"""Uneven pipeline stages: what each stage of a split costs, from the one cost model's terms.

A split gives pipeline stage s (of p, one stage a rank: the 1F1B and GPipe schedules) x_s of the
model's L layers, sum x_s = L. Everything here is derived from the terms steptime.py and memory.py
already compute for the layout; nothing is a second model:

- Stage work. ``work(n)`` is the layout's per-stage work W (compute + TP + CP + EP + pipeline
  sends, steptime.py) of a model whose every stage holds n layers, read off the cost model's own
  trees for that model. Per layer it is affine, except under every-k recompute, where n // k of a
  stage's layers repeat their forward (layout.full_layers): work(n) = a n + d (n // k) + c, three
  evaluations fix a, d, c. The cost model charges the LM head and loss on every stage (the last
  stage's, on the 1F1B critical path); with a split only the last stage runs it:
      t_s(x) = W + work(x) - work(ceil(L / p)) - [s < p - 1] m head,
  W the layout's own work, head = compute.head_seconds of one micro-batch. The embedding lookup
  is a gather the cost model does not time (0 s on the first stage).
- Step time. Every stage runs the same m micro-batches; the busiest stage sets the pace of the
  schedule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", sec. 2.2.1: 1F1B and GPipe take (m + p - 1) t_stage, i.e. W (1 + (p - 1) / m)), so
      step(split) = step(layout) + (1 + num / (den m)) (max_s t_s - W),
  the bubble fraction num / (den m) of cost/pipeline.py. The terms after the pipeline (DP
  exposure, ZeRO-3, the optimizer step) stay the layout's. An even split whose last stage holds
  ceil(L / p) layers has max_s t_s = W and so exactly the layout's step time.
- Memory of stage s, per chip (memory.py's kinds): the training state of its x_s layers plus the
  embedding on the first stage and the output head and final norm on the last (the cost model
  spreads those over all stages; here they sit where they run), under the layout's ZeRO stage:
  per-layer and non-layer bytes from the state trees of a 1- and a 2-layer model; activations
  A(recompute, tp, cp) b x_s times the micro-batches stage s holds in flight (1F1B: min(m, p - s),
  the first stage the most, Narayanan et al. 2021 sec. 2.2.1; GPipe: m), plus the FP32 logits on
  the last stage and a recomputed layer's working set; the ZeRO-3 buffers and the runtime reserve
  as the layout's; fragmentation 1/20 of the rest (memory.FRAGMENTATION_DIVISOR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Mapping

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.cost.compute import head_seconds
from trnopt.optimizer.cost.memory import (FRAGMENTATION_DIVISOR, Memory, activation_bytes_per_layer, logits_bytes,
                                          memory_per_chip, memory_terms, recompute_working_set, usable_hbm)
from trnopt.optimizer.cost.pipeline import bubble_den, bubble_num
from trnopt.optimizer.cost.steptime import StepTime, step_time
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, every_nth
from trnopt.optimizer.model.target import Axis, Target
from trnopt.optimizer.model.workload import Workload

WORK = ("compute", "tp", "cp", "ep", "pp_send")  # StepTime's terms that make up one stage's work W
STATE = ("weights", "gradients", "optimizer")


def split_problem(workload: Workload, layout: Layout, split: tuple[int, ...] | None = None) -> str | None:
    """Why this layout (and ``split``, when given) cannot have uneven stages; None when it can."""
    mdl = workload.model
    if layout.interleave != 1:
        return (f"uneven stages are modelled for one stage a rank (1F1B, GPipe); the layout runs "
                f"{layout.pipeline_schedule} with interleave {layout.interleave}")
    if mdl.moe is not None and mdl.moe.dense_layers:
        return (f"{mdl.name} mixes {mdl.dense_layers} dense and {mdl.moe_layers} MoE layers; uneven stages are "
                "modelled for models whose layers are all alike")
    if split is None:
        return None
    if len(split) != layout.pp:
        return f"gives {len(split)} stages, the layout has pp={layout.pp}"
    if any(x < 1 for x in split):
        return f"every stage needs at least one layer, got {','.join(map(str, split))}"
    if sum(split) != mdl.layers:
        return f"the layers per stage add up to {sum(split)}, {mdl.name} has {mdl.layers}"
    return None


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs of one layout, for any split of its layers (module docstring)."""

    layers: int
    """L: the model's layers, which the stages share."""
    per_layer: float
    """a: seconds one more layer adds to a stage's work over the step."""
    per_kth: float
    """d: seconds one more fully recomputed layer (every k-th, under every-k recompute) adds; 0 otherwise."""
    every: int
    """k: every k-th layer of a stage recomputes its forward in full (1 when d is 0)."""
    even_layers: int
    """ceil(L / p): the layers of the layout's busiest stage."""
    head: float
    """Seconds of the LM head and loss over the step's m micro-batches (on the last stage only)."""
    even_work: float
    """W: the layout's own stage work (ceil(L / p) layers and the head)."""
    bubble: tuple[int, int]
    """(num, den m): the schedule's bubble num / (den m) of the busiest stage's work (cost/pipeline.py)."""
    even_step: float
    """The layout's step time (the even split's)."""
    state_layer: tuple[float, float, float]
    """Bytes per chip of one layer's weights, gradients and optimizer state (memory.py's kinds)."""
    state_fixed: tuple[tuple[float, float, float], ...]
    """Per stage: the same kinds of the embedding (first stage) and the output head and final norm (last)."""
    act_layer: tuple[float, ...]
    """Per stage: activation bytes per chip of one layer times the micro-batches the stage holds in flight."""
    act_fixed: tuple[float, ...]
    """Per stage: the FP32 logits (last stage) and a recomputed layer's working set, bytes per chip."""
    gathered: float
    """ZeRO-3 gathered layer buffers, bytes per chip (the layout's, on every stage)."""
    reserve: float
    """The runtime's reserve, bytes per chip."""
    usable: float
    """HBM a stage may fill, bytes per chip (capacity less the headroom)."""

    @property
    def stages(self) -> int:
        return len(self.act_layer)

    @property
    def pipeline_factor(self) -> float:
        """1 + num / (den m): the schedule's step per unit of the busiest stage's work."""
        return 1 + self.bubble[0] / self.bubble[1]

    @property
    def layer_bytes(self) -> tuple[float, ...]:
        """Per stage: bytes per chip one more layer adds."""
        return tuple(sum(self.state_layer) + a for a in self.act_layer)

    @property
    def fixed_bytes(self) -> tuple[float, ...]:
        """Per stage: bytes per chip with no layer, before fragmentation and the reserve."""
        return tuple(sum(st) + a + self.gathered for st, a in zip(self.state_fixed, self.act_fixed))

    def work(self, n: int) -> float:
        """work(n) = W + a (n - ceil(L / p)) + d (n // k - ceil(L / p) // k): a stage's work with n layers."""
        k, e = self.every, self.even_layers
        return self.even_work + self.per_layer * (n - e) + self.per_kth * (n // k - e // k)

    def stage_seconds(self, split) -> list[float]:
        """t_s of each stage of ``split``: work(x_s), less the head on every stage but the last."""
        last = self.stages - 1
        return [self.work(x) - (self.head if s < last else 0.0) for s, x in enumerate(split)]

    def step(self, split) -> float:
        """step(split) = step(layout) + (1 + num / (den m)) (max_s t_s - W)."""
        return self.even_step + self.pipeline_factor * (max(self.stage_seconds(split)) - self.even_work)

    def stage_bytes(self, split) -> list[float]:
        """Bytes per chip of each stage: (fixed + x layer) (1 + 1/20) + reserve."""
        grow = 1 + 1 / FRAGMENTATION_DIVISOR
        return [(f + x * a) * grow + self.reserve for f, a, x in zip(self.fixed_bytes, self.layer_bytes, split)]

    def fits(self, split) -> bool:
        return max(self.stage_bytes(split)) <= self.usable

    def even_split(self) -> tuple[int, ...]:
        """ceil(L / p) layers on the last stages, floor on the first: the split the layout's step time assumes."""
        p, L = self.stages, self.layers
        return tuple(L // p + (1 if s >= p - L % p else 0) for s in range(p))


def _with_layers(workload: Workload, layers: int) -> Workload:
    return replace(workload, model=replace(workload.model, layers=layers))


def _work(workload: Workload, layout: Layout, target: Target, overlap, n: int) -> float:
    """W of the layout for a model of n layers on every stage (n p layers in all)."""
    st = step_time(_with_layers(workload, n * layout.pp), layout, target, overlap)
    return sum(getattr(st, name) for name in WORK)


def work_coefficients(workload: Workload, layout: Layout, target: Target, overlap) -> tuple[float, float, int]:
    """(a, d, k) of work(n) = a n + d (n // k) + c (module docstring), from three or two of the cost
    model's evaluations; d = 0 and k = 1 without every-k recompute."""
    k = every_nth(layout.recompute)
    if not k:
        w1, w2 = (_work(workload, layout, target, overlap, n) for n in (1, 2))
        return w2 - w1, 0.0, 1
    wk, wk1, w2k = (_work(workload, layout, target, overlap, n) for n in (k, k + 1, 2 * k))
    a = wk1 - wk
    return a, w2k - wk - a * k, k


def stage_costs(workload: Workload, layout: Layout, target: Target, headroom: float,
                overlap: Mapping[str, float] | None = None) -> StageCosts:
    """The per-stage costs of ``layout``'s splits (module docstring); InputError when it cannot be split."""
    if why := split_problem(workload, layout):
        raise InputError("layout", "stage_layers", why)
    mdl, p = workload.model, layout.pp
    st: StepTime = step_time(workload, layout, target, overlap)
    W = sum(getattr(st, name) for name in WORK)
    m = layout.micro_batches(workload)
    sched = layout.pipeline_schedule
    bubble = (bubble_num(sched, p), bubble_den(sched, 1) * m)
    a, d, k = work_coefficients(workload, layout, target, overlap)
    head = m * head_seconds(workload, target, layout.lnc, layout.tp, layout.cp, layout.micro_batch) if p > 1 else 0.0
    return StageCosts(mdl.layers, a, d, k, math.ceil(mdl.layers / p), head, W, bubble, st.total, *stage_bytes(workload, layout, target),
                      target.runtime_reserve_bytes, usable_hbm(target, headroom))


def in_flight(schedule: str, m: int, p: int, s: int) -> int:
    """Micro-batches whose activations stage s holds at its peak: GPipe m, 1F1B min(m, p - s)
    (Narayanan et al. 2021 sec. 2.2.1: stage s runs p - s - 1 warm-up forwards, then one more)."""
    return m if schedule == "GPipe" else min(m, p - s)


def stage_bytes(workload: Workload, layout: Layout, target: Target) -> tuple:
    """StageCosts' memory fields: state_layer, state_fixed, act_layer, act_fixed, gathered."""
    mdl, p, c = workload.model, layout.pp, layout.axes[0].size
    tp, cp, b, rc = layout.tp, layout.cp, layout.micro_batch, layout.recompute
    one, two = (memory_per_chip(_with_layers(workload, n), layout, target) for n in (1, 2))
    # the state trees spread a model's state over p stages: p (K(2) - K(1)) a layer, p (2 K(1) - K(2)) the rest
    state_layer = tuple(p * (getattr(two, k) - getattr(one, k)) for k in STATE)
    other = tuple(p * (2 * getattr(one, k) - getattr(two, k)) for k in STATE)
    first_share = embedding_share(mdl)
    shares = [(first_share if s == 0 else 0.0) + (1 - first_share if s == p - 1 else 0.0) for s in range(p)]
    act = activation_bytes_per_layer(workload, tp, cp, 1, rc) * b * c
    m = layout.micro_batches(workload)
    working = recompute_working_set(workload, tp, cp, 1, rc) * b * c
    logits = logits_bytes(workload, tp, cp, 1) * b * c
    return (state_layer, tuple(tuple(x * sh for x in other) for sh in shares),
            tuple(act * in_flight(layout.pipeline_schedule, m, p, s) for s in range(p)),
            tuple(working + (logits if s == p - 1 else 0.0) for s in range(p)),
            memory_per_chip(workload, layout, target).gathered)


def embedding_share(mdl) -> float:
    """The share of the non-layer parameters on the first stage (the embedding and learned positions); the
    rest (the output head, when untied, and the final norm) is on the last."""
    return (mdl.vocab + mdl.learned_positions) * mdl.hidden / mdl.embedding_params()


def split_memory(costs: StageCosts, split) -> Memory:
    """The Memory of the split's fullest stage, by kind (what a report prints for a split layout)."""
    s = max(range(len(split)), key=costs.stage_bytes(split).__getitem__)
    x = split[s]
    weights, grads, opt = (costs.state_fixed[s][i] + x * costs.state_layer[i] for i in range(3))
    acts = costs.act_fixed[s] + x * costs.act_layer[s]
    raw = weights + grads + opt + acts + costs.gathered
    return Memory(weights, grads, opt, acts, costs.gathered, raw / FRAGMENTATION_DIVISOR, costs.reserve)


def split_memory_terms(workload: Workload, target: Target, axes: tuple[Axis, ...],
                       even: dict[str, f.Expr] | None = None) -> dict[str, f.Expr]:
    """A floor on the fullest stage's bytes per chip over EVERY split of a layout's layers, as trees of
    factors by Memory kind (cost/memory.py ``memory_terms``; ``even``: those trees, whose state kinds are
    reused): a layout none of whose splits fits the usable HBM has this floor above it, so the joint
    search (search/jointsplit.py) may drop by it a layout whose even split does not fit.

    Claim: for a layout of p stages (one a rank) and any split x (x_s >= 1, sum_s x_s = L),
        max_s bytes_s >= (1 + 1/D) (S + G + w + (A L + g) / p) + R,
    S the layout's state per chip (weights, gradients, optimizer: the even memory's state kinds),
    G the ZeRO-3 buffers, w a recomputed layer's working set, A = A(recompute, tp, cp) b c a layer's
    activations of one micro-batch, g = the FP32 logits b c, R the reserve, D the fragmentation divisor.
    Proof, with ``stage_bytes``' per-stage memory: raw_s = state_s + x_s A i_s + w + [s = p - 1] g + G,
    i_s >= 1 the micro-batches stage s holds in flight (``in_flight``: min(m, p - s) or m). The state
    trees are affine in the layer count (parameters = embedding and head + L per layer), so the
    stages' state, the fixed part where it sits and x_s layers each, adds up to p S: the even memory
    spreads the same total over p stages. Hence
        sum_s raw_s = p (S + w + G) + g + A sum_s x_s i_s >= p (S + w + G) + g + A L,
    and the fullest stage holds at least the mean; bytes_s = (1 + 1/D) raw_s + R grows with raw_s.
    The floor is at most the even memory (its activations max(A ceil(L / p) min(m, p), A ceil(L / p) + g)
    + w are at least (A L + g) / p + w), so it drops no layout the even rule keeps; with p = 1 the two
    agree. It assumes one stage a rank: an interleaved layout cannot be split and keeps the even rule.
    """
    mdl = workload.model
    c = axes[0].size
    even = even if even is not None else memory_terms(workload, target, axes)
    b = f.decision("micro_batch")
    per_layer = f.table(("recompute", "tp", "cp"),
                        lambda rc, tp, cp: activation_bytes_per_layer(workload, tp, cp, 1, rc), "activations_per_layer")
    logits = f.table(("tp", "cp"), lambda tp, cp: logits_bytes(workload, tp, cp, 1), "logits")
    working = f.table(("recompute", "tp", "cp"),
                      lambda rc, tp, cp: recompute_working_set(workload, tp, cp, 1, rc), "recompute_working_set")
    mean = f.ratio(f.add(f.prod(per_layer, b, coef=c * mdl.layers), f.prod(logits, b, coef=c)), f.decision("pp"),
                   name="mean_stage_activations")
    activations = f.add(mean, f.prod(working, b, coef=c), name="split_activations")
    kinds = {k: even[k] for k in ("weights", "gradients", "optimizer", "gathered")}
    kinds["activations"] = activations
    kinds["fragmentation"] = f.ratio(f.add(*kinds.values()), FRAGMENTATION_DIVISOR, name="split_fragmentation")
    kinds["reserve"] = even["reserve"]
    return kinds


def split_memory_parts(workload: Workload, target: Target, axes: tuple[Axis, ...],
                       even: dict[str, f.Expr]) -> dict[str, f.Expr]:
    """Trees of the parts of ``stage_bytes`` at a point, for ``fits_some_split`` in NumPy: the state per chip
    of the model (``state``, the even memory's kinds) and of its 1-layer version (``state_one``), a layer's
    activations of one micro-batch (``activation``, A), a recomputed layer's working set, the FP32 logits and
    the ZeRO-3 buffers, bytes per chip."""
    mdl = workload.model
    c = axes[0].size
    one = memory_terms(replace(workload, model=replace(mdl, layers=1)), target, axes)
    b = f.decision("micro_batch")
    return {
        "state": f.add(*(even[k] for k in STATE)), "state_one": f.add(*(one[k] for k in STATE)),
        "activation": f.prod(f.table(("recompute", "tp", "cp"), lambda rc, tp, cp: activation_bytes_per_layer(
            workload, tp, cp, 1, rc), "activations_per_layer"), b, coef=c),
        "working": f.prod(f.table(("recompute", "tp", "cp"), lambda rc, tp, cp: recompute_working_set(
            workload, tp, cp, 1, rc), "recompute_working_set"), b, coef=c),
        "logits": f.prod(f.table(("tp", "cp"), lambda tp, cp: logits_bytes(workload, tp, cp, 1), "logits"), b, coef=c),
        "gathered": even["gathered"]}


def fits_some_split(parts: Mapping[str, "np.ndarray"], mdl, pp: int, micro_batches, usable: float,
                    reserve: float, slack: float = 1e-9):
    """Whether some split of each point's layers may fit the usable HBM under 1F1B (bool array), from
    ``split_memory_parts``' arrays and the points' micro-batch counts m: the per-stage memory of
    ``stage_bytes`` and the test of search/stagebottleneck.py at an unbounded bottleneck.

    Stage s of a split holds (1 + 1/D)(F_s + x_s B_s) + R bytes, with B_s = pΔ + A min(m, p - s) and
    F_s = p (S_1 - Δ) e_s + w + [s = p - 1] g + G, where S is the state per chip of the L-layer model and S_1
    of the 1-layer one: the state trees are affine in the layer count, so one layer adds Δ = (S - S_1)/(L - 1)
    a chip and p Δ on its stage, and the non-layer state p (S_1 - Δ) sits on the end stages by their shares
    e_s (``stage_bytes``). The most layers stage s can hold is c_s = floor(((U - R)/(1 + 1/D) - F_s) / B_s),
    and some split fits iff every c_s >= 1 and sum_s min(c_s, L) >= L (=>: x_s <= c_s, sum x_s = L; <=: lower
    the caps, never below one, until they add up to L; bytes only fall). ``slack`` (relative) rounds each
    c_s up past float noise, so the test never says no where the exact one (search/stagebottleneck.py) says
    yes: it may let a point through that the exact test then drops."""
    import numpy as np
    L = mdl.layers
    grow = 1 + 1 / FRAGMENTATION_DIVISOR
    delta = (parts["state"] - parts["state_one"]) / (L - 1)
    other = pp * (parts["state_one"] - delta)
    first = embedding_share(mdl)
    room = (usable - reserve) / grow
    m = np.asarray(micro_batches)
    total = np.zeros(np.shape(m), dtype=np.int64)
    ok = np.ones(np.shape(m), dtype=bool)
    for s in range(pp):
        share = (first if s == 0 else 0.0) + (1 - first if s == pp - 1 else 0.0)
        fixed = other * share + parts["working"] + parts["gathered"] + (parts["logits"] if s == pp - 1 else 0.0)
        per_layer = pp * delta + parts["activation"] * np.minimum(m, pp - s)
        cap = np.floor((room - fixed) / per_layer * (1 + slack) + slack)
        ok &= cap >= 1
        total += np.clip(cap, 0, L).astype(np.int64)
    return ok & (total >= L)
