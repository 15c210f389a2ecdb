"""CP-SAT against brute force on spaces small enough to enumerate, and the seed's worked example."""

import itertools
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.errors import InfeasibleError
from trnopt.optimizer.cost.evaluate import objective_value
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.search.domains import explain_infeasible
from trnopt.optimizer.search.driver import score_layout, solve, solve_space
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.search.intmodel import IntModel, const
from trnopt.optimizer.search.solver import STATUS, solver_for
from trnopt.optimizer.search.space import Space
from trnopt.optimizer.model.target import load_target, parse_target
from trnopt.optimizer.model.workload import Training, Workload, load_model, parse_model

from test_framework_search import _trn2_like


@st.composite
def small_problems(draw):
    cores = draw(st.sampled_from([1, 2, 4]))
    lnc_allowed = draw(st.sampled_from([[1], [1, 2]] if cores % 2 == 0 else [[1]]))
    axes, chips = [], 1
    for i in range(draw(st.integers(1, 2))):
        size = draw(st.sampled_from([1, 2, 3, 4]))
        chips *= size
        axes.append({"name": f"a{i}", "size": size, "kind": draw(st.sampled_from(["torus", "ring", "switch"])),
                     "bandwidth_gbs": draw(st.sampled_from([25, 100, 400])),
                     "latency_us": draw(st.sampled_from([0, 1, 5]))})
    domains = draw(st.sampled_from([1, 2]))
    if cores * chips * domains > 12:
        axes, chips = axes[:1], axes[0]["size"]
        if cores * chips * domains > 12:
            domains, cores, lnc_allowed = 1, 1, [1]
    per_instance = draw(st.sampled_from([d for d in range(1, chips + 1) if chips % d == 0]))
    target = parse_target({
        "name": "random", "description": "hypothesis target", "instance": "box",
        "chips_per_instance": per_instance, "runtime_reserve_gib": draw(st.sampled_from([0, 0.5])),
        "chip": {"name": "chip", "physical_cores": cores, "lnc_default": 1, "lnc_allowed": lnc_allowed,
                 "hbm_gib": draw(st.sampled_from([2, 4, 8, 32])), "hbm_bandwidth_gbs": 1000, "bf16_tflops": 100,
                 "fp8_tflops": 200, "sbuf_kib_per_partition": 192, "on_chip_bandwidth_gbs": 1000},
        "axes": axes,
        "scale_out": {"name": "net", "bandwidth_gbps_per_instance": 800, "latency_us": 10},
        "reliability": {"instance_mtbf_hours": 1000, "checkpoint_gbs_per_instance": 5, "restart_minutes": 5},
        "efficiency": {"matmul": draw(st.sampled_from([0.3, 0.7])), "elementwise": 0.5, "microbatch_overhead_us": draw(st.sampled_from([0, 100])),
                       "collective_fixed_share": draw(st.sampled_from([0.1, 1.0])), "fitted_on": "test"},
        "engines": {"tensor_ghz": 1.0, "pe_rows": 128, "stationary_fmax": 128, "moving_fmax": 512, "matmul_min_cycles": 64,
                    "vector_ghz": 1.0, "vector_lanes": 128, "scalar_ghz": 1.0, "scalar_lanes": 128},
    }, "hypothesis")
    heads = draw(st.sampled_from([4, 8, 12]))
    model = {"name": "tiny", "layers": draw(st.sampled_from([2, 3, 4, 6])), "hidden": 64 * heads, "heads": heads,
             "kv_heads": draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0])), "ffn": 1024,
             "vocab": draw(st.sampled_from([1000, 32000]))}
    if draw(st.booleans()):
        model["moe"] = {"experts": draw(st.sampled_from([2, 4])), "top_k": 1, "expert_ffn": 512}
    training = Training(seq=draw(st.sampled_from([512, 2048, 32768])), global_batch=draw(st.sampled_from([4, 8, 12])))
    workload = Workload(parse_model(model, "hypothesis"), training)
    return Problem(workload, target, domains, headroom=0.1,
                   objective=draw(st.sampled_from(["step-time", "step-time", "goodput"])), hsdp=draw(st.booleans()),
                   instance_blocks=draw(st.booleans()))


@settings(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 40)), deadline=None, derandomize=not os.environ.get("TRNOPT_EXAMPLES"),
          suppress_health_check=[HealthCheck.too_slow])
@given(problem=small_problems())
def test_cp_sat_equals_brute_force(problem):
    reference = brute_force(problem)
    results = [solve_space(Space(problem, lnc), time_limit=30, workers=1) for lnc in problem.lnc_values]
    if reference.best is None:
        assert all(r.status == "INFEASIBLE" for r in results)
        return
    assert any(r.status == "OPTIMAL" for r in results), [(r.lnc, r.status) for r in results]
    assert all(r.status in ("OPTIMAL", "INFEASIBLE") for r in results)
    best = min((r for r in results if r.evaluation), key=lambda r: r.objective)
    expected = objective_value(reference.best, problem.objective)
    # the integer model may be off the cost model by its own rounding, on either layout
    _, reference_rounding = score_layout(Space(problem, reference.best.layout.lnc), reference.best.layout)
    assert expected * (1 - 1e-12) <= best.objective <= expected + best.rounding + reference_rounding, (
        f"CP-SAT {best.evaluation.layout.describe()} [{best.evaluation.layout.placement_text()}] vs brute force "
        f"{reference.best.layout.describe()} [{reference.best.layout.placement_text()}]; "
        f"{best.evaluation.step} vs {reference.best.step}; {best.evaluation.reliability} vs {reference.best.reliability}")
    assert best.evaluation.fits


def seed_problem():
    return Problem(Workload(load_model("llama3-405b"), Training()), load_target("trn2u"), domains=2)


def test_seed_worked_example_solver_beats_the_hand_layout():
    p = seed_problem()
    axes = p.target.axes(2, 2)
    hand = Layout(tp=64, pp=4, dp=2, axes=axes, placement=default_placement(axes, {"tp": 64, "pp": 4, "dp": 2}),
                  zero=1, recompute="full", lnc=2)
    hand_eval = p.evaluate(hand)
    assert hand_eval.fits
    result = solve(p, time_limit=60, top=0)
    assert result.best.fits
    assert result.best.step.total <= hand_eval.step.total
    print(f"solver {result.best.step.total:.1f} s vs hand {hand_eval.step.total:.1f} s: "
          f"{100 * (1 - result.best.step.total / hand_eval.step.total):.1f}% faster")


def test_deterministic_for_a_seed_and_worker_count():
    p = Problem(Workload(load_model("llama3-8b"), Training(global_batch=64)), load_target("trn2"), 1)
    # a deterministic budget, so that a loaded machine gives the same answer as an idle one
    first = solve(p, time_limit=600, workers=2, seed=7, top=0, deterministic_limit=120)
    second = solve(p, time_limit=600, workers=2, seed=7, top=0, deterministic_limit=120)
    assert first.best.layout == second.best.layout
    assert first.status == "OPTIMAL"


def test_infeasible_gets_an_explanation():
    p = Problem(Workload(load_model("llama3-405b"), Training()), load_target("trn2"), domains=1)
    with pytest.raises(InfeasibleError):
        solve(p, time_limit=30, top=0)
    text = explain_infeasible(p)
    assert "the least-memory layout" in text and "GiB per chip" in text
    assert "--instances" in text


def test_time_limit_gives_best_found_with_gap():
    p = Problem(Workload(load_model("llama3-405b"), Training()), load_target("trn2u"), domains=16, lnc=(2,))
    # a deterministic budget CP-SAT cannot prove this in: the same on a loaded machine as on an idle one
    result = solve(p, time_limit=60.0, top=0, deterministic_limit=0.5)
    assert result.best.fits
    assert result.status in ("OPTIMAL", "FEASIBLE")
    assert math.isfinite(result.gap) and result.gap >= 0


def test_model_scores_every_layout_like_the_cost_model():
    problem = Problem(Workload(load_model("mixtral-8x7b"), Training(seq=4096, global_batch=32)),
                      load_target("trn2u"), 1, lnc=(2,))
    space = Space(problem, 2)
    layouts = list(itertools.islice(space.layouts(), 0, None, 997))[:25]
    assert len(layouts) >= 10
    for layout in layouts:
        value, rounding = score_layout(space, layout)
        e = problem.evaluate(layout)
        assert abs(value - e.step.total) <= rounding + 1e-9 * e.step.total, layout.describe()


def test_the_integer_model_scores_hsdp_layouts_as_the_cost_model_does():
    # a trn2-like box of 2 instances: a dozen HSDP layouts of the space (replicas across the
    # scale-out axis) scored by CP-SAT with its decisions fixed, against the float cost model
    machine = _trn2_like()
    machine["scale_out"]["bandwidth_gbps_per_instance"] = 400
    target = parse_target(machine, "t")
    p = Problem(Workload(load_model("llama3-8b"), Training(seq=2048, global_batch=16)), target, 2,
                zero_stages=(1, 3), hsdp=True)
    space = Space(p, 1)
    hsdp = [lay for lay in space.layouts() if lay.dp_replicate > 1]
    assert hsdp and all(lay.dp_replicate == 2 for lay in hsdp)
    for lay in hsdp[::max(1, len(hsdp) // 12)]:
        objective, rounding = score_layout(space, lay)
        assert abs(objective - p.score(p.evaluate(lay))) <= rounding + 1e-9 * objective, lay.describe()


def test_a_product_with_a_table_rounded_to_zero_keeps_its_rounding_error():
    # every entry of a table rounded to 0 ticks (err 0.5 each) times a count of 7: the product is 0
    # and may be off by up to 3.5 ticks; an error of 0 would let the referee's check fail
    md = IntModel()
    zeros = md.table(const(0), [0, 0, 0], "rounded", err=0.5)
    count = md.var(0, 10, "count")
    md.model.add(count.expr == 7)
    product = md.mul(zeros, count, "product")
    solver = solver_for(10.0, 1, 0)
    assert STATUS[solver.solve(md.model)] == "OPTIMAL"
    assert solver.value(product.expr) == 0 and product.error(solver.value) == pytest.approx(3.5)
