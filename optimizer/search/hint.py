"""A greedy layout: the CP-SAT search's starting point, and an answer when a limit ends it early."""

from __future__ import annotations

import math

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.search.space import Space


def greedy_layout(space: Space) -> Layout | None:
    """TP on the fastest axes (8 ranks, else the nearest degree), the rest data parallel; the first
    plan that fits."""
    p = space.problem
    for tp in sorted(space.degrees["tp"], key=lambda t: (abs(math.log2(t / 8)), -t)):
        for zero, rc in ((1, "selective"), (1, "full"), (3, "full")):
            if zero not in p.zero_stages:
                continue
            dp = space.ranks // tp
            try:
                rows = default_placement(space.axes, {"tp": tp, "dp": dp})
                layout = Layout(tp=tp, pp=1, dp=dp, axes=space.axes, placement=rows, zero=zero, recompute=rc,
                                micro_batch=1, lnc=space.lnc)
            except InputError:  # the degrees may not tile these axes; try the next
                continue
            if layout.workload_problems(p.workload):
                continue
            if p.evaluate(layout).fits:
                return layout
    return None
