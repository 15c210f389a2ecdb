"""benchmarks/chip_matmul.py: the Trainium targets' ``chip_matmul`` is what the simulator gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import chip_matmul  # noqa: E402
import overlap_table  # noqa: E402

from trnopt.kernels import sim  # noqa: E402
from trnopt.optimizer.model.target import load_target  # noqa: E402


@pytest.mark.parametrize("gen,names", [("trn1", ["trn1"]), ("trn2", ["trn2", "trn2u"]),
                                       ("trn3", ["trn3-gen1", "trn3-gen2"])])
def test_each_trainium_target_states_its_generations_simulated_share(gen, names):
    busy, total = chip_matmul.tensor_share(gen)
    for name in names:
        target = load_target(name)
        assert overlap_table.SIM_GENERATION[target.chip.name] == gen
        eff = target.efficiency
        assert eff.chip_matmul == round(busy / total, 2), name
        assert f"simulator {sim.__version__}" in eff.chip_matmul_source
        assert f"{busy * 1e6:.1f} / {total * 1e6:.1f} us" in eff.chip_matmul_source, name


def test_a_size_that_is_not_whole_tiles_is_one_line_and_exit_2(capsys):
    assert chip_matmul.main(["--size", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "chip_matmul: --size 1000: must be a positive multiple of 512"
