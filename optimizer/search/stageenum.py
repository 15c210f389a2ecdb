"""Every uneven pipeline split of one layout, enumerated and scored in NumPy (no pruning).

The referee of search/stagesplit.py in the tests and the baseline of benchmarks/stage_split.py:
what a competent engineer would write without a solver. The compositions of L layers into p
stages of at least one layer each (C(L - 1, p - 1) of them) are built in chunks, a prefix of
stages times a suffix of the same total, and each split is scored by the same integer data
(stagesplit.SplitData): its stages' work, the least bottleneck among those whose every stage fits.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from trnopt.optimizer.cost.memory import FRAGMENTATION_DIVISOR
from trnopt.optimizer.search.stagesplit import SplitData

CHUNK = 1 << 20  # splits scored at once (rows of a chunk): a few tens of MB of int64


def count(layers: int, stages: int) -> int:
    """Splits of ``layers`` into ``stages`` stages of at least one layer: C(L - 1, p - 1)."""
    return math.comb(layers - 1, stages - 1) if layers >= stages >= 1 else 0


@lru_cache(maxsize=None)
def compositions(total: int, parts: int) -> np.ndarray:
    """Every composition of ``total`` into ``parts`` positive parts, one a row (int16)."""
    if parts == 1:
        return np.array([[total]], dtype=np.int16) if total >= 1 else np.zeros((0, 1), np.int16)
    rows = [np.column_stack([np.full(len(rest), first, np.int16), rest])
            for first in range(1, total - parts + 2) for rest in (compositions(total - first, parts - 1),)]
    return np.concatenate(rows) if rows else np.zeros((0, parts), np.int16)


def chunks(layers: int, stages: int):
    """Every split, in chunks of at most about CHUNK rows: prefix compositions of each total times
    the suffix compositions of the rest."""
    head = stages // 2
    for total in range(head, layers - (stages - head) + 1):
        pre, suf = compositions(total, head), compositions(layers - total, stages - head)
        step = max(1, CHUNK // max(1, len(suf)))
        for i in range(0, len(pre), step):
            block = pre[i:i + step]
            yield np.concatenate([np.repeat(block, len(suf), axis=0), np.tile(suf, (len(block), 1))], axis=1)


def best(data: SplitData) -> tuple[int | None, tuple[int, ...] | None, int]:
    """(least bottleneck in ns, a split that has it, splits scored) over every split of one layout that
    fits; (None, None, n) when none fits."""
    p, last = data.stages, data.stages - 1
    work = np.array([0] + [data.work(n) for n in range(1, data.layers + 1)], dtype=np.int64)
    offset = np.array([data.head if s < last else 0 for s in range(p)], dtype=np.int64)
    most = _most(data)
    top, where, scored = None, None, 0
    for block in chunks(data.layers, p):
        scored += len(block)
        seconds = (work[block] - offset).max(axis=1)
        seconds[(block > most).any(axis=1)] = NONE
        i = int(seconds.argmin())
        if seconds[i] != NONE and (top is None or seconds[i] < top):
            top, where = int(seconds[i]), tuple(int(v) for v in block[i])
    return top, where, scored


def best_joint(datas: list[SplitData]) -> tuple[int | None, tuple[int, ...] | None, int | None, int]:
    """(least step in ns, a split that has it, the layout's index, points scored) over every split of
    every layout (``stagesplit.best_joint``'s space: layouts x splits); (None, None, None, n) when none fits."""
    L, p = datas[0].layers, datas[0].stages
    last = p - 1
    tables = [np.array([0] + [d.work(n) for n in range(1, L + 1)], dtype=np.int64) for d in datas]
    offsets = [np.array([d.head if s < last else 0 for s in range(p)], dtype=np.int64) for d in datas]
    most = [_most(d) for d in datas]
    top, where, which, scored = None, None, None, 0
    for block in chunks(L, p):
        for i, d in enumerate(datas):
            scored += len(block)
            busiest = (tables[i][block] - offsets[i]).max(axis=1)
            step = d.step_base - (-d.step_num * busiest // d.step_den)
            step[(block > most[i]).any(axis=1)] = NONE
            j = int(step.argmin())
            if step[j] != NONE and (top is None or step[j] < top):
                top, where, which = int(step[j]), tuple(int(v) for v in block[j]), i
    return top, where, which, scored


NONE = np.iinfo(np.int64).max  # the score of a split over memory


def _most(data: SplitData) -> np.ndarray:
    """The most layers each stage can hold within the usable HBM: (D + 1)(fixed + x layer) <= capacity."""
    grow = FRAGMENTATION_DIVISOR + 1
    return np.array([(data.capacity // grow - f) // a if a else data.layers
                     for f, a in zip(data.fixed_bytes, data.layer_bytes)], dtype=np.int64)
