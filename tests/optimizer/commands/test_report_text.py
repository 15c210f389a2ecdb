"""What the reports print: percentages in fixed point, Neuron settings only for Neuron targets,
no ZeRO stage named where one data-parallel rank leaves nothing to shard."""

import json

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.search.driver import change_text


def run(capsys, *argv):
    code = main([*map(str, argv)])
    out, _ = capsys.readouterr()
    return code, out


def test_large_differences_print_in_fixed_point():
    assert change_text(6.7) == "slower by 570.0%"
    assert change_text(0.968) == "faster by 3.2%"
    assert "e+" not in change_text(120.0)


def test_neuron_settings_only_on_neuron_targets(capsys):
    gpu = ("evaluate", "--target", "h100", "--model", "llama3-8b", "--tp", 8, "--dp", 1, "--global-batch", 8)
    code, out = run(capsys, *gpu)
    assert code in (0, 1) and "NEURON" not in out and "--logical-nc-config" not in out
    code, out = run(capsys, *gpu, "--json", "-")
    assert "lnc_settings" not in json.loads(out)
    code, out = run(capsys, "evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 4, "--dp", 16,
                    "--global-batch", 64)
    assert code in (0, 1) and "NEURON_LOGICAL_NC_CONFIG=2" in out


def test_no_zero_stage_named_with_one_data_parallel_rank(capsys):
    code, out = run(capsys, "evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 8, "--pp", 8, "--dp", 1,
                    "--zero", 3, "--global-batch", 64)
    layout = next(line for line in out.splitlines() if line.startswith("layout:"))
    assert "ZeRO" not in layout.replace("no ZeRO sharding (DP1)", ""), layout
    assert "DP1" in layout


def test_near_ties_rest_on_the_held_out_errors():
    """A difference inside the calibration rows' mean held-out error is a near-tie, even beyond --uncertainty."""
    from trnopt.optimizer.commands.report import near_tie_line
    from trnopt.optimizer.cost.calibration import held_out_errors, held_out_mean
    from trnopt.optimizer.model.target import load_target
    mean, source = held_out_mean(load_target("trn2u"))
    errors = list(held_out_errors("trn1-published").values())
    assert mean == sum(abs(x) for x in errors) / len(errors) and "held-out" in source
    line = near_tie_line(1 + mean * 0.9, 0.0, (mean, source))
    assert line.startswith("near-tie") and "held-out" in line
    assert near_tie_line(1 + mean * 1.1, 0.0, (mean, source)) == ""
    assert "uncertainty" in near_tie_line(1.02, 0.03, None)
