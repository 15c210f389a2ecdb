"""The TP degrees a model admits and the one span per (degree, link class) a group can take."""

from __future__ import annotations

import itertools
import math

from trnopt.optimizer.cost.collectives import link_class
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.search.space import divisors, group_spans, tp_degrees


def names(span):
    return {a.name: f for a, f in span}


def test_tp_degrees_keep_whole_heads_and_whole_kv_replicas():
    assert tp_degrees(128, 8, 512) == (1, 2, 4, 8, 16, 32, 64, 128)      # Llama 3 405B
    assert tp_degrees(64, 8, 512) == (1, 2, 4, 8, 16, 32, 64)             # Llama 3 70B
    assert 6 not in tp_degrees(12, 4, 24)   # 6 splits neither the 4 KV heads nor a multiple of them
    assert 12 in tp_degrees(12, 4, 24)      # 3 ranks per KV head
    assert tp_degrees(128, 8, 96) == (1, 2, 4, 8, 16, 32)                 # and divides the ranks


def test_every_degree_and_link_class_of_a_placement_has_one_span():
    axes = load_target("trn2u").axes(2, 2)
    degrees = tp_degrees(128, 8, math.prod(a.size for a in axes))
    spans = group_spans(axes, degrees)
    brute = set()
    for fs in itertools.product(*(divisors(a.size) for a in axes)):
        span = tuple((a, f) for a, f in zip(axes, fs) if f > 1)
        if math.prod(fs) in degrees and span:
            brute.add((math.prod(fs), link_class(span)))
    assert set(spans) == brute
    for (d, cls), span in spans.items():
        assert math.prod(f for _, f in span) == d and link_class(span) == cls


def test_the_span_fills_the_innermost_axes_and_crosses_a_slow_class_once():
    spans = group_spans(load_target("trn2u").axes(2, 2), tp_degrees(128, 8, 512))
    assert names(spans[4, "core"]) == {"core": 4}
    assert names(spans[16, "torus"]) == {"core": 4, "x": 4}
    assert names(spans[16, "ring"]) == {"core": 4, "x": 2, "ring": 2}
    assert names(spans[128, "ring"]) == {"core": 4, "x": 4, "y": 4, "ring": 2}
    assert names(spans[2, "scale_out"]) == {"efa": 2}
    assert (128, "torus") not in spans    # 64 ranks in the torus at LNC 2
