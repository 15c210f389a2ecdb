"""solve's outputs when stdout closes early, one file named twice, and the numbers of an exit-3 explanation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from trnopt.optimizer.commands import solve as solve_command
from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.target import GIB, load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model
from trnopt.optimizer.search.domains import explain_infeasible, least_memory_found


def test_a_closed_stdout_keeps_the_files(tmp_path):
    cmd = (f"{sys.executable} -m trnopt.optimizer.commands.cli solve --target trn2u --model llama3-8b "
           "--ultraservers 1 --deterministic-limit 20 --top 0 --json b.json --rank-map b.csv | head -1")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("trnopt solve: llama3-8b")
    ranks = json.loads((tmp_path / "b.json").read_text())["rank_map"]["ranks"]
    assert len((tmp_path / "b.csv").read_text().splitlines()) == 1 + ranks  # header and every rank


@pytest.mark.parametrize("second", ["same.json", "./same.json", "sub/../same.json"])
def test_one_file_for_json_and_rank_map_is_refused_before_the_solve(tmp_path, capsys, monkeypatch, second):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(solve_command, "solve", lambda *a, **k: pytest.fail("solved before refusing"))
    assert main(["solve", "--target", "trn2u", "--model", "llama3-8b", "--ultraservers", "1",
                 "--json", "same.json", "--rank-map", second]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the same file as --json same.json" in err[0]
    assert not os.path.exists("same.json")


def test_an_infeasible_explanation_quotes_the_cost_model_for_the_layout_it_names():
    problem = Problem(Workload(load_model("llama3-405b"), Training()), load_target("trn2u"), 1)
    least = least_memory_found(problem, workers=1)
    assert least.found is not None
    again = problem.evaluate(least.found.layout).memory.total
    assert least.found.memory.total == again and again > least.floor * (1 - 1e-9)
    text = explain_infeasible(problem, workers=1)
    quoted = re.search(r"needs ([0-9.]+) GiB per chip", text)
    assert quoted and float(quoted.group(1)) == pytest.approx(again / GIB, abs=0.05)
    assert least.found.layout.describe() in text
    assert float(quoted.group(1)) > 86.4 and "86.4 GiB usable" in text  # it needs more than there is
