"""The cost model on the published runs it is calibrated on, and the fit behind the shipped values."""

import dataclasses

import pytest

from trnopt.optimizer.cost.calibration import (FAMILIES, GPU_FREE, band, fit, framework_constants, h100_cases, held_out, held_out_errors, moe_cases,
                                               held_out_table, rows, step_band, table5_cases, trn1_cases)
from trnopt.optimizer.cost.steptime import model_flops
from trnopt.optimizer.model.target import BUILTIN_TARGETS, load_target

TRAINIUM = ("trn1", "trn2", "trn2u", "trn3-gen1", "trn3-gen2")


def test_trn1_published_runs_within_the_goal():
    scored = rows(load_target("trn1"), trn1_cases())
    errors = [abs(r.error) for r in scored]
    assert len(scored) == 6
    assert sum(errors) / len(errors) <= 0.10, [f"{r.label} {r.error:+.1%}" for r in scored]
    assert max(errors) <= 0.20, [f"{r.label} {r.error:+.1%}" for r in scored]


def test_table5_errors_within_the_goal():
    scored = rows(load_target("a100"), table5_cases())
    errors = [abs(r.error) for r in scored]
    assert len(scored) == 8
    assert sum(errors) / len(errors) <= 0.05, [f"{r.label} {r.error:+.1%}" for r in scored]


def test_shipped_trainium_efficiency_is_the_trn1_fit_and_carried_to_trn2_and_trn3():
    trn1 = load_target("trn1")
    found = fit(trn1, trn1_cases())
    best = found.efficiency
    assert dataclasses.replace(best, fitted_on=trn1.efficiency.fitted_on) == trn1.efficiency
    assert all(a.achievable == found.link_share for a in trn1.domain_axes)
    for name in TRAINIUM:
        e = load_target(name).efficiency
        assert framework_constants(e) == framework_constants(best), name
        assert "trn1" in e.fitted_on, name


def test_shipped_gpu_efficiency_is_the_table5_fit_and_carried_to_h100():
    a100 = load_target("a100")
    best = fit(a100, table5_cases(), GPU_FREE).efficiency
    assert dataclasses.replace(best, fitted_on=a100.efficiency.fitted_on) == a100.efficiency
    h100 = load_target("h100").efficiency
    assert framework_constants(h100) == framework_constants(best) and "a100" in h100.fitted_on


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_every_target_states_its_chips_matmul_share_with_a_source(name):
    """The chip's achievable GEMM share is each chip's own named constant, never the 1.0 default."""
    e = load_target(name).efficiency
    assert 0 < e.chip_matmul < 1 and e.chip_matmul_source.split()[0] in ("simulated", "measured:"), name
    assert e.gemm_share == pytest.approx(e.chip_matmul * e.matmul)


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_every_target_says_what_its_efficiency_was_fitted_on(name):
    assert load_target(name).efficiency.fitted_on


def test_band_brackets_the_rows():
    low, high = band([0.10, -0.05, 0.02])
    assert low == pytest.approx(1 / 1.10) and high == pytest.approx(1 / 0.95)
    assert band([0.0]) == (1.0, 1.0)


def test_stored_held_out_errors_are_the_leave_one_out_refits():
    """targets/measured/held-out.json holds what ``held_out`` computes: each row scored by the fit of the others."""
    for family, (cases_of, base, free) in FAMILIES.items():
        target, cases = load_target(base), cases_of()
        stored = held_out_table()[family]
        assert stored["free"] == list(free)
        computed = held_out(target, cases, free)
        assert [r["label"] for r in stored["rows"]] == [c.label for c in cases]
        for r, h, f in zip(stored["rows"], computed, rows(target, cases)):
            assert r["held_out_error"] == pytest.approx(h.error, abs=6e-5), r["label"]
            assert r["fit_error"] == pytest.approx(f.error, abs=6e-5), r["label"]


def test_a_held_out_row_is_scored_by_parameters_fitted_without_it():
    """Leaving a row out changes what the fit sees: a row whose presence moves the fit predicts worse held out."""
    target, cases = load_target("a100"), table5_cases()
    predicted = held_out(target, cases[:3], GPU_FREE)
    for i, h in enumerate(predicted):
        others = cases[:i] + cases[i + 1:3]
        refit = fit(target, others, GPU_FREE).applied(target, GPU_FREE)
        assert h.evaluation.step.total == pytest.approx(cases[i].row(refit).evaluation.step.total)


def test_the_band_rests_on_the_held_out_errors():
    low, high, source = step_band(load_target("trn2u"))
    errors = list(held_out_errors("trn1-published").values())
    assert (low, high) == band(errors)
    assert "held-out" in source and "carried over from trn1" in source
    assert step_band(load_target("a100"))[2].endswith("fitted on a100")


def test_the_h100_band_rests_on_its_own_published_runs():
    """h100 has published runs, none fitted: its band is their prediction errors, stored as computed."""
    target = load_target("h100")
    stored = held_out_errors("h100")
    computed = {c.label: c.row(target).error for c in h100_cases()}
    assert stored.keys() == computed.keys()
    for label, error in stored.items():
        assert error == pytest.approx(computed[label], abs=6e-5), label
    low, high, source = step_band(target)
    assert (low, high) == band(list(stored.values())) and "none fitted" in source


def test_h100_published_rows_convert_their_metric_to_a_step_time():
    cases = h100_cases()
    assert len(cases) == 9
    # torchtitan Table 1: 16 sequences of 8192 tokens at 5,762 tokens/s on each of 8 GPUs
    assert cases[0].published_s == pytest.approx(16 * 8192 / (5762 * 8))
    # Meta Table 4 row 1: trnopt's model FLOPs of a 2048 x 8192-token step at 430 TFLOPs on each of 8,192 GPUs
    assert cases[6].published_s == pytest.approx(model_flops(cases[6].workload) / (430e12 * 8192))
    assert all(c.row(load_target("h100")).evaluation.step.total > 0 for c in cases)


def test_h100_rows_carry_their_gpus_power_limited_peak_and_attention_kernel():
    """torchtitan's 500 W H100s (peak between SXM's 989 and NVL's 835: 912) run every engine slower, and
    their FlashAttention-2 matmuls at 35% of the peak; Meta's rows keep the target's part and GEMM share."""
    target, cases = load_target("h100"), h100_cases()
    titan, meta = cases[0], cases[6]
    assert titan.clock_share == pytest.approx(912 / 989) and titan.attention == 0.35
    assert meta.clock_share == 1.0 and meta.attention is None and meta.framework.startswith("Meta")
    full_clock = dataclasses.replace(titan, clock_share=1.0)
    ratio = titan.row(target).evaluation.step.compute / full_clock.row(target).evaluation.step.compute
    assert 1.0 < ratio <= 989 / 912 + 1e-9  # the engine-bound parts slow by 989/912, the HBM-bound ones not
    layout = meta.layout_of(target)
    assert (layout.interleave, layout.recompute) == (8, "none")  # Llama 3 paper section 3.3.2


def test_deepseek_v3_row_runs_dualpipe_and_fp8_gemms_as_published_and_meets_the_moe_goal():
    """DeepSeek-V3 report 3.2-3.3: DualPipe (modelled as DualPipeV) hides the all-to-all under compute on
    112 of 132 SMs, and the linear layers' GEMMs run in FP8; the row is a prediction (never fitted)."""
    (name, case), = moe_cases()
    target = load_target(name)
    layout = case.layout_of(target)
    assert (name, layout.pipeline_schedule, case.workload.training.fp8_gemms) == ("h800", "DualPipeV", True)
    row = case.row(target)
    assert row.evaluation.step.ep == 0.0  # hidden: the stage's compute outlasts its all-to-all
    assert abs(row.error) <= 0.15, f"{row.error:+.1%}"
