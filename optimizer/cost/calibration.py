"""Published step times the cost model is calibrated on, and the calibration itself.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), Table 5: GPT models on A100 80GB (targets/a100.toml), sequence 2048, DP=1, each
with full recomputation and with sequence parallelism + selective recomputation. The
matmul efficiency of every target (Target.efficiency) is the point of a grid over
(max_matmul, half_width) with the least mean absolute error on these rows; no comparable
Trainium measurements are published, so the Trainium targets carry the same values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trnopt.optimizer.cost.evaluate import Evaluation, evaluate
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import Efficiency, Target
from trnopt.optimizer.model.workload import Training, Workload, load_model

# model, GPUs, TP, PP, global batch, micro-batch, full recompute (s), seq-par + selective (s)
TABLE5 = (
    ("megatron-22b", 8, 8, 1, 4, 4, 1.42, 1.10),
    ("megatron-175b", 64, 8, 8, 64, 1, 18.13, 13.75),
    ("megatron-530b", 280, 8, 35, 280, 1, 49.05, 37.83),
    ("megatron-1t", 512, 8, 64, 512, 1, 94.42, 71.49),
)
MAX_MATMUL_GRID = tuple(x / 100 for x in range(40, 101, 2))
HALF_WIDTH_GRID = (0, 32, 64, 128, 192, 256, 320, 384, 448, 512, 768, 1024, 1536)


@dataclass(frozen=True)
class Row:
    label: str
    published_s: float
    evaluation: Evaluation

    @property
    def error(self) -> float:
        return self.evaluation.step.total / self.published_s - 1


def table5_rows(target: Target) -> list[Row]:
    """The model's evaluation of every Table 5 row on ``target`` (the a100 target)."""
    out = []
    for name, gpus, tp, pp, batch, micro, full, selective in TABLE5:
        workload = Workload(load_model(name), Training(seq=2048, global_batch=batch))
        axes = target.axes(1, gpus // target.chips_per_domain)
        placement = default_placement(axes, {"tp": tp, "pp": pp})
        for recompute, published in (("full", full), ("selective", selective)):
            layout = Layout(tp=tp, pp=pp, dp=1, axes=axes, placement=placement, zero=0, recompute=recompute,
                            micro_batch=micro, lnc=1)
            out.append(Row(f"{name} {recompute}", published, evaluate(workload, layout, target)))
    return out


def mean_abs_error(target: Target) -> float:
    rows = table5_rows(target)
    return sum(abs(r.error) for r in rows) / len(rows)


def fit(target: Target) -> tuple[float, Efficiency]:
    """(mean |error|, efficiency) at the grid point with the least mean absolute error."""
    best = None
    for max_matmul in MAX_MATMUL_GRID:
        for half_width in HALF_WIDTH_GRID:
            eff = Efficiency(max_matmul, half_width)
            score = mean_abs_error(dataclasses.replace(target, efficiency=eff))
            if best is None or score < best[0]:
                best = (score, eff)
    return best
