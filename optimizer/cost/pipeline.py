"""Pipeline schedules: the bubble each leaves and the micro-batches the first stage holds.

p pipeline ranks, v stages a rank (``Layout.interleave``), m micro-batches a step, W the work
of one rank's stages over the m micro-batches (steptime.py). Each schedule's bubble is a
fraction of W, written ``num / (den * m)`` so that the search's integer form stays exact
(factors.py); its in-flight activations are counted in micro-batches of one rank's layers
(L / p), held by the first stage, which holds the most (the later stages of 1F1B hold fewer).

The zero-bubble and DualPipe figures assume what their papers' tables assume: a forward,
a backward for inputs and a backward for weights take the same time (T_F = T_B = T_W, so the
full backward is 2 T_F and W = 3 T_F per micro-batch and stage), and no credit for DualPipe's
overlap of a forward with a backward chunk's compute (F&B = F + B); what DualPipe does overlap,
its all-to-all and sends with the other chunk's compute, is ``dualpipe_overlap``.

- GPipe (Huang et al. 2019; Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters", sec. 2.2.1): bubble (p - 1) / m; every forward before any
  backward, so m micro-batches in flight.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2.1): bubble (p - 1) / m; the first
  stage holds min(m, p) micro-batches.
- Interleaved1F1B (ibid. sec. 2.2.2): bubble (p - 1) / (v m); the first stage holds
  min(m, p) (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", sec. 4.2.3).
- InterleavedZeroBubble: PyTorch's ScheduleInterleavedZeroBubble implements ZB1P (ZB-H1) of
  Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (sec. 2.1: one third of 1F1B's bubble,
  1F1B's peak memory) over interleaved stages: bubble (p - 1) / (3 v m), Interleaved1F1B's
  activations.
- ZBVZeroBubble (ZB-V, Qi et al.; its authors' comparison table at T_F = T_B = T_W): bubble 0,
  1F1B's activations (min(m, p)), twice 1F1B's pipeline sends (two stages a rank: v = 2 in
  steptime's sends).
- DualPipeV (DeepSeek-AI, DualPipe repository README, "Pipeline Bubbles and Memory Usage
  Comparison", for PP = 2p stages on p devices; DualPipe in the DeepSeek-V3 Technical Report
  2024, table 2): bubble (PP/2 - 1)(F&B + B - 3W) with a stage's F = T_F, B = 2 T_F,
  W = T_F and F&B = F + B is 2 (p - 1) T_F against 6 m T_F of work: (p - 1) / (3 m);
  activations PP + 1 = 2p + 1 stages' micro-batches of L / (2p) layers: min(2m, 2p + 1) / 2
  micro-batches of L / p layers.
"""

from __future__ import annotations

from trnopt.optimizer.cost import factors as f
from trnopt.optimizer.model.schedules import SCHEDULES, default_schedule

INTERLEAVED = ("Interleaved1F1B", "InterleavedZeroBubble")


def resolve(schedule: str | None, interleave: int) -> str:
    """The schedule a tree built for ``schedule`` runs at ``interleave``: None is the default
    schedule of that interleave (what the search's layouts carry)."""
    name = schedule or default_schedule(interleave)
    assert name in SCHEDULES, name
    return name


def tree_schedule(layout) -> str | None:
    """The schedule to build a layout's cost trees for: None for its interleave's default schedule
    (the trees the search builds, so both score it alike), else its own."""
    return layout.schedule or None


def bubble_num(schedule: str | None, pp: int) -> int:
    """num of the bubble ``num / (den * m) * W``: p - 1, or 0 for ZBVZeroBubble (module docstring)."""
    return 0 if schedule == "ZBVZeroBubble" else pp - 1


def bubble_den(schedule: str, interleave: int) -> int:
    """den of the bubble ``num / (den * m) * W`` (module docstring, per schedule)."""
    return {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": interleave, "InterleavedZeroBubble": 3 * interleave,
            "ZBVZeroBubble": 1, "DualPipeV": 3}[schedule]


def interleave_factor(schedule: str, pp: int, interleave: int) -> tuple[int, int]:
    """(num, den) of 1 + (p - 1) / (p v), the activations interleaving adds on the first stage
    (Korthikanti et al. 2022, sec. 4.2.3), for the interleaved schedules; 1 for the others."""
    if schedule in INTERLEAVED and interleave > 1:
        return pp * interleave + pp - 1, pp * interleave
    return 1, 1


def dualpipe_overlap(compute: f.Expr, ep: f.Expr, pp_send: f.Expr, left: float) -> tuple[f.Expr, f.Expr, f.Expr]:
    """(compute, exposed EP, exposed pipeline sends) under DualPipe(V): a forward chunk's dispatch and
    combine all-to-all and its pipeline sends run while the paired backward chunk computes and vice
    versa (DeepSeek-V3 report sec. 3.2.1: "both all-to-all and PP communication can be fully
    hidden"), compute at the share ``left`` of its rate the communication kernels leave
    (``Efficiency.overlap_compute``; H800: 112 of 132 SMs, sec. 3.2.2): compute' = compute / left,
    exposed EP = max(EP - compute', 0), exposed sends = max(EP + sends - compute', 0) - exposed EP."""
    slowed = f.prod(compute, coef=1 / left, name="compute")
    exposed_ep = f.maximum(f.sub(ep, slowed), f.prod(ep, coef=0.0), name="ep")
    both = f.maximum(f.sub(f.add(ep, pp_send), slowed), f.prod(ep, coef=0.0))
    return slowed, exposed_ep, f.sub(both, exposed_ep, name="pp_send")
