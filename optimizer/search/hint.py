"""A greedy layout: the CP-SAT search's starting point, and an answer when a limit ends it early."""

from __future__ import annotations

import math

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.search.space import Space, instance_blocks_hold


def greedy_layout(space: Space) -> Layout | None:
    """TP on the fastest axes (8 ranks, else the nearest degree), the fewest pipeline stages that let
    the data-parallel degree divide the batch, the rest data parallel; the first plan that fits."""
    p = space.problem
    batch = p.workload.training.global_batch
    plans = [(z, rc) for z, rc in ((1, "selective"), (1, "full"), (3, "full"))
             if z in p.zero_stages and rc in p.recompute]
    for tp in sorted(space.degrees["tp"], key=lambda t: (abs(math.log2(t / 8)), -t)):
        for pp in space.degrees["pp"]:
            if space.ranks % (tp * pp) or batch % (space.ranks // (tp * pp)):
                continue
            dp = space.ranks // (tp * pp)
            for zero, rc in plans:
                try:
                    rows = default_placement(space.axes, {"tp": tp, "dp": dp, "pp": pp})
                    layout = Layout(tp=tp, pp=pp, dp=dp, axes=space.axes, placement=rows, zero=zero, recompute=rc,
                                    micro_batch=1, lnc=space.lnc)
                except InputError:  # the degrees may not tile these axes; try the next
                    continue
                if layout.workload_problems(p.workload, p.rules):
                    continue
                if p.instance_blocks and not instance_blocks_hold(space.axes, rows, p.target.chips_per_instance):
                    continue
                if p.evaluate(layout).fits:
                    return layout
            break  # the fewest stages that divide the batch: more stages only add bubble
    return None
