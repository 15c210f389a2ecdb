"""The compact rank map (per instance, per rank on demand) agrees with the one built rank by rank."""

import math
import random

import pytest

from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.placement import (TpSummary, groups, instance_ranks, place_of, planned_map, rank_map,
                                              rank_of, stage, tp_group, tp_summary)
from trnopt.optimizer.model.target import load_target


def random_layouts(target, lnc, domains, n, seed):
    rng = random.Random(seed)
    axes = target.axes(lnc, domains)
    for _ in range(n):
        rows = [[1] * len(axes) for _ in DIMS]
        for j, a in enumerate(axes):
            rest = a.size
            for i in rng.sample(range(len(DIMS)), len(DIMS)):
                f = rng.choice([d for d in range(1, rest + 1) if rest % d == 0])
                rows[i][j] *= f
                rest //= f
            rows[rng.randrange(len(DIMS))][j] *= rest
        deg = {d: math.prod(r) for d, r in zip(DIMS, rows)}
        yield Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"] * deg["ep"], ep=deg["ep"], cp=deg["cp"], lnc=lnc,
                     axes=axes, placement=tuple(tuple(r) for r in rows))


def summary_from_every_rank(layout, places):
    tp = groups(layout, places, "tp")
    return TpSummary(len(tp), len(tp[0]), len({(p.domain, p.instance, p.chip) for p in tp[0]}),
                     max(len({(p.domain, p.instance) for p in g}) for g in tp),
                     max(len({p.domain for p in g}) for g in tp))


@pytest.mark.parametrize("name", ["trn2", "trn2u", "trn3-gen2", "a100"])
def test_compact_map_matches_the_rank_by_rank_map(name):
    target = load_target(name)
    for layout in random_layouts(target, target.chip.lnc_default, 2, 12, seed=len(name)):
        places = rank_map(layout, target)
        assert tp_summary(layout, target) == summary_from_every_rank(layout, places)
        planned = planned_map(layout, target)
        group_of = {p.rank: g for g, grp in enumerate(groups(layout, places, "tp")) for p in grp}
        for p in places:
            assert (planned.domain[p.rank], planned.instance[p.rank], planned.chip[p.rank],
                    planned.core[p.rank]) == (p.domain, p.instance, p.chip, p.core)
            assert tp_group(p.rank, layout) == group_of[p.rank] and stage(p.rank, layout) == p.coords["pp"]
        for p in places[::7]:
            assert place_of(layout, target, p.rank) == p
            assert rank_of(layout, layout.rank_coordinates(p.rank)[1]) == p.rank
        on = {}
        for p in places:
            on.setdefault((p.domain, p.instance), []).append(p.rank)
        for (d, i), ranks in on.items():
            assert sorted(instance_ranks(layout, target, d, i)) == sorted(ranks)
