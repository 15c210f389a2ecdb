"""Exit 3 without search only when no parallel degrees can tile the machine (a proof, with what would tile)."""

import pytest

from trnopt.optimizer.commands.degrees import Degrees, check_degrees
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def workload(model="llama3-8b", batch=1024, seq=8192):
    return Workload(load_model(model), Training(seq=seq, global_batch=batch))


def test_degrees_fit_exactly_the_products_the_rules_allow():
    d = Degrees(workload(seq=4096))  # tp | 32 heads (kv 8), pp <= 32 layers, dp | 1024, cp 1 below CP_MIN_SEQ
    assert d.fit(64) and d.fit(32 * 32 * 1024) and not d.fit(32 * 32 * 1024 * 2) and not d.fit(37 * 64)
    assert d.largest() == 32 * 32 * 1024
    assert d.most_domains(64, 100_000) == 32 * 32 * 1024 // 64
    assert all(d.fit(64 * n) == (d.most_domains(64, n) == n) for n in range(1, 400))


def test_proof_and_what_would_tile():
    target = load_target("trn2")
    assert check_degrees(workload(seq=4096), target, (1, 2), 1) == 1
    with pytest.raises(InfeasibleError) as err:
        check_degrees(workload(seq=4096), target, (1, 2), 100_000)
    text = str(err.value)
    assert "whatever the memory" in text and "largest is 1,048,576" in text and "--instances 16384" in text
    with pytest.raises(InfeasibleError) as err:  # 6,400,000 = 2^11 * 5^5 ranks: 5^5 fits no degree
        check_degrees(workload(), target, (2,), 100_000)
    assert "--instances 98304" in str(err.value)  # 64 * 98304 = 2^21 * 3


def test_no_domain_count_tiles():
    # one head, one layer, a batch of one: one rank at most, and a trn2 domain has 64
    tiny = Workload(load_model("llama3-8b"), Training(seq=8192, global_batch=1))
    object.__setattr__(tiny.model, "layers", 1)
    object.__setattr__(tiny.model, "heads", 1)
    object.__setattr__(tiny.model, "kv_heads", 1)
    with pytest.raises(InfeasibleError, match="no layout of llama3-8b exists on 1 to 64 trn2 domains"):
        check_degrees(tiny, load_target("trn2"), (2,), None)
    assert check_degrees(workload(), load_target("trn2"), (2,), None) == 64
