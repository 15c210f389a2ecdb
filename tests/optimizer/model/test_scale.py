"""Products of sizes stay in CP-SAT's integer range: parameters and activation elements are bounded."""

from dataclasses import replace

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.scale import check_scale
from trnopt.optimizer.model.workload import PRESETS, Training, Workload, load_model


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_at_a_million_tokens_passes(name):
    check_scale(Workload(load_model(name), Training(seq=2**20, global_batch=1)), name, "--model", "--seq", "seq")


def test_parameters_and_activations_over_the_bounds_are_refused():
    model = load_model("llama3-405b")
    big = Workload(replace(model, hidden=2**22, layers=2**14), Training())
    with pytest.raises(InputError, match="^big.toml: --model: .* parameters; at most 1e\\+15"):
        check_scale(big, "big.toml", "--model", "--seq", "seq")
    long = Workload(replace(model, layers=2**12), Training(seq=2**26))
    with pytest.raises(InputError, match="^--seq: seq: seq x hidden x layers"):
        check_scale(long, "m", "--model", "--seq", "seq")
