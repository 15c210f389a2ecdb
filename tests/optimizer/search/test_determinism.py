"""One question, one answer: the JSON of a solve is the same byte for byte when the machine is slow.

The search reads the wall clock in one place (search/clock.py ``CLOCK``), and only for the
--time-limit safety stop. A slow machine is one on which more seconds pass for the same
work, so the second run replaces that clock with one that runs 20 times fast: every wall
time the search could consult (the build of a model, what is left of the limit) looks 20
times longer. Work budgets, not seconds, must decide, so the whole JSON (which holds no
timings) must not change. The second test makes the safety stop bind and checks that the
answer says so.
"""

import json
import time

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.search import clock

# a mixture-of-experts space of 25 million points, several LNCs, the robust choice and runner-ups on
CASE = ("solve", "--model", "mixtral-8x22b", "--target", "trn2u", "--ultraservers", "1")


def _solve(capsys, path, *extra) -> tuple[int, bytes, str]:
    code = main([*CASE, "--json", str(path), *extra])
    _, err = capsys.readouterr()
    return code, path.read_bytes() if path.exists() else b"", err


def test_same_json_under_a_slow_clock(capsys, monkeypatch, tmp_path):
    code, first, err = _solve(capsys, tmp_path / "first.json", "--time-limit", "600")
    assert code == 0, err
    assert json.loads(first)["stopped_by"] is None and json.loads(first)["status"] == "OPTIMAL"
    real = time.perf_counter
    start = real()
    monkeypatch.setattr(clock, "CLOCK", lambda: start + 20 * (real() - start))
    code, second, err = _solve(capsys, tmp_path / "second.json", "--time-limit", "600")
    assert code == 0, err
    assert second == first


def test_the_safety_stop_is_reported(capsys, monkeypatch, tmp_path):
    # a clock that advances 100 s per reading and not otherwise: the search reads it at points
    # its work decides, so the reading at which the limit binds is the same on every machine
    reads = [0]

    def ticking() -> float:
        reads[0] += 1
        return 100.0 * reads[0]

    monkeypatch.setattr(clock, "CLOCK", ticking)
    code, whole, err = _solve(capsys, tmp_path / "whole.json", "--time-limit", "600000")
    assert code == 0, err
    assert json.loads(whole)["stopped_by"] is None
    total = reads[0]
    assert total > 4
    reads[0] = 0
    # the solve runs two searches (the answer, then the answer with no overlap): a limit at a
    # quarter of the readings binds inside the first
    code, cut, err = _solve(capsys, tmp_path / "cut.json", "--time-limit", str(100.0 * (total // 4)))
    assert code == 0, err
    data = json.loads(cut)
    assert data["stopped_by"] == "time limit"
    assert "time limit reached" in err and "may differ on another machine" in err


def test_the_safety_stop_interrupts_work_that_checks_no_clock():
    # pure-Python work that never reads a clock, as a model's build: the timer signal ends it
    with pytest.raises(clock.SafetyStop):
        with clock.interruptible(clock.clock() + 0.1):
            while True:
                pass
    # and the timer is gone afterwards
    with clock.interruptible(clock.clock() + 600):
        pass


def _problem(model: str, target: str):
    from trnopt.optimizer.cost.problem import Problem
    from trnopt.optimizer.model.target import load_target
    from trnopt.optimizer.model.workload import Training, Workload, load_model
    return Problem(Workload(load_model(model), Training(global_batch=1024)), load_target(target), 1,
                   instance_blocks=True)


def test_fewest_domains_is_the_same_under_a_slow_clock(monkeypatch):
    from trnopt.optimizer.search.domains import fewest_domains, least_memory_found
    # Llama 3 405B needs 6 trn2 instances (every ZeRO stage, no framework rules): five counts are
    # decided "no" before the answer
    problem = _problem("llama3-405b", "trn2")
    first = fewest_domains(problem, workers=1, deadline=clock.clock() + 600)
    least = least_memory_found(problem, workers=1, deadline=clock.clock() + 600)
    real = time.perf_counter
    start = real()
    monkeypatch.setattr(clock, "CLOCK", lambda: start + 20 * (real() - start))
    assert fewest_domains(problem, workers=1, deadline=clock.clock() + 600) == first == 6
    assert least_memory_found(problem, workers=1, deadline=clock.clock() + 600) == least


def test_fewest_domains_stops_with_an_error_not_another_count(monkeypatch):
    from trnopt.optimizer.errors import TimeLimitError
    from trnopt.optimizer.search.domains import fewest_domains
    # a clock that advances 100 s per reading: the limit binds at the second probe, and the
    # search must say so rather than skip ahead to a larger count
    reads = [0]

    def ticking() -> float:
        reads[0] += 1
        return 100.0 * reads[0]

    monkeypatch.setattr(clock, "CLOCK", ticking)
    with pytest.raises(TimeLimitError, match="fewest trn2 domains"):
        fewest_domains(_problem("llama3-405b", "trn2"), workers=1, deadline=clock.clock() + 150)
