"""The least bottleneck of one layout's uneven splits, by a feasibility test that is monotone in it.

With ``SplitData``'s integers, stage s holding x layers takes t_s(x) = a x + d (x // k) + c - o_s
(o_s the LM head on every stage but the last) and (D + 1)(f_s + x b_s) bytes. With a, d, b_s >= 0,
both only grow with x. For a bottleneck B let cap_s(B) be the most layers stage s can hold with
t_s <= B and within the capacity. Then

    some split has bottleneck <= B  <=>  cap_s(B) >= 1 for every s and sum_s cap_s(B) >= L.

(=>) each x_s <= cap_s(B) and sum x_s = L. (<=) lower the caps, never below one layer, until they
add up to L: every stage's time and bytes only fall. The test is monotone in B, and the least
bottleneck is one stage's time at some x, so a binary search over the sorted values
{t_s(x) : s, 1 <= x <= L} finds it exactly in O(p log L) tests (the split returned lowers the
longest stage first, so that among the splits with that bottleneck it is an even one): the same optimum as the CP-SAT
model (search/stagesplit.py) and the enumeration (search/stageenum.py), which the tests check. It
is what the joint search (search/jointsplit.py) screens each candidate layout with; the layouts that
would beat its incumbent are then solved by CP-SAT.
"""

from __future__ import annotations

import numpy as np

from trnopt.optimizer.cost.memory import FRAGMENTATION_DIVISOR
from trnopt.optimizer.search.stagesplit import SplitData


def least_bottleneck(data: SplitData) -> tuple[int, tuple[int, ...]] | None:
    """(the least bottleneck in ns, a split that has it) over every split of ``data`` that fits; None
    when none fits. ValueError when a work or byte coefficient is negative (the test above needs
    them to grow with the layers)."""
    if min(data.per_layer, data.per_kth, *data.layer_bytes) < 0:
        raise ValueError("a stage's work or bytes fall with its layers: the monotone test does not hold")
    L, p, last = data.layers, data.stages, data.stages - 1
    n = np.arange(1, L + 1, dtype=np.int64)
    work = data.per_layer * n + data.per_kth * (n // data.every) + data.base  # work(x), x = 1..L, non-decreasing
    offset = np.array([data.head if s < last else 0 for s in range(p)], dtype=np.int64)
    room = data.capacity // (FRAGMENTATION_DIVISOR + 1)  # (D + 1) y <= capacity  <=>  y <= capacity // (D + 1)
    most = np.array([min(L, (room - f) // b) if b else (L if f <= room else 0)
                     for f, b in zip(data.fixed_bytes, data.layer_bytes)], dtype=np.int64)
    if most.min() < 1 or most.sum() < L:
        return None

    def caps(bound: int) -> np.ndarray:
        # layers x with work(x) - o_s <= bound: a prefix of the non-decreasing work table
        return np.minimum(np.searchsorted(work, bound + offset, side="right"), most)

    values = np.unique(np.concatenate([work, work - data.head]))
    lo, hi = 0, len(values) - 1
    if not _feasible(caps(int(values[hi])), L):
        return None
    while lo < hi:  # the least value whose test passes
        mid = (lo + hi) // 2
        if _feasible(caps(int(values[mid])), L):
            hi = mid
        else:
            lo = mid + 1
    return int(values[lo]), _lower_to(caps(int(values[lo])), L, lambda s, x: int(work[x - 1] - offset[s]))


def _feasible(cap: np.ndarray, layers: int) -> bool:
    return bool(cap.min() >= 1 and cap.sum() >= layers)


def _lower_to(cap: np.ndarray, layers: int, seconds) -> tuple[int, ...]:
    """The caps lowered one layer at a time until they add up to ``layers``, each time on the stage that
    takes the longest (``seconds(s, x)``; on a tie the earlier stage, which holds more micro-batches in
    flight under 1F1B) and holds more than one: the bottleneck stays, and the other stages come out as
    even as the caps let them."""
    split, extra = [int(c) for c in cap], int(cap.sum()) - layers
    for _ in range(extra):
        s = max((s for s in range(len(split)) if split[s] > 1), key=lambda s: (seconds(s, split[s]), -s))
        split[s] -= 1
    return tuple(split)
