"""The search proposes only what the framework can run: torchtitan's launch can produce every layout."""

import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.frameworks.profile import NXD, TORCHTITAN
from trnopt.optimizer.model.target import load_target, parse_target
from trnopt.optimizer.model.workload import Training, Workload, load_model, parse_model
from trnopt.optimizer.search.bruteforce import brute_force
from trnopt.optimizer.search.driver import solve_space
from trnopt.optimizer.search.space import Space

ENGINES = {"tensor_ghz": 1.0, "pe_rows": 128, "stationary_fmax": 128, "moving_fmax": 512, "matmul_min_cycles": 64,
           "vector_ghz": 1.0, "vector_lanes": 128, "scalar_ghz": 1.0, "scalar_lanes": 128}


@st.composite
def machines(draw):
    """Small targets whose instances hold part of a domain: a torus or a switch cut by instances."""
    kind = draw(st.sampled_from(["torus", "switch"]))
    sizes = draw(st.sampled_from([[2, 2], [4], [2, 3]] if kind == "torus" else [[4], [6], [8]]))
    chips = 1
    for n in sizes:
        chips *= n
    per_instance = draw(st.sampled_from([d for d in range(1, chips + 1) if chips % d == 0]))
    return parse_target({
        "name": "random", "description": "hypothesis", "instance": "box", "chips_per_instance": per_instance,
        "runtime_reserve_gib": 0,
        "chip": {"name": "chip", "physical_cores": draw(st.sampled_from([1, 2])), "lnc_default": 1,
                 "lnc_allowed": [1], "hbm_gib": 8, "hbm_bandwidth_gbs": 1000, "bf16_tflops": 100, "fp8_tflops": 200,
                 "sbuf_kib_per_partition": 192, "on_chip_bandwidth_gbs": 1000},
        "axes": [{"name": f"a{i}", "size": n, "kind": kind, "bandwidth_gbs": draw(st.sampled_from([25, 400])),
                  "latency_us": 1} for i, n in enumerate(sizes)],
        "scale_out": {"name": "net", "bandwidth_gbps_per_instance": 800, "latency_us": 10},
        "reliability": {"instance_mtbf_hours": 1000, "checkpoint_gbs_per_instance": 5, "restart_minutes": 5},
        "efficiency": {"matmul": 0.5, "elementwise": 0.5, "microbatch_overhead_us": 0, "collective_fixed_share": 1,
                       "fitted_on": "test"},
        "engines": ENGINES}, "hypothesis")


@settings(max_examples=int(os.environ.get("TRNOPT_EXAMPLES", 25)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(target=machines(), domains=st.sampled_from([1, 2]), heads=st.sampled_from([4, 6, 8]))
def test_every_layout_proposed_under_torchtitan_is_producible_and_optimal_among_producible(target, domains, heads):
    model = parse_model({"name": "tiny", "layers": 4, "hidden": 64 * heads, "heads": heads, "kv_heads": 2,
                         "ffn": 1024, "vocab": 1000}, "hypothesis")
    problem = Problem(Workload(model, Training(seq=512, global_batch=12)), target, domains,
                      zero_stages=TORCHTITAN.zero_stages, recompute=TORCHTITAN.recompute,
                      interleave=TORCHTITAN.interleaved, hsdp=TORCHTITAN.hsdp, rules=TORCHTITAN.rules,
                      instance_blocks=True)
    result = solve_space(Space(problem, 1), time_limit=30, workers=1)
    assert result.status in ("OPTIMAL", "INFEASIBLE")
    # the referee enumerates the same space (the same block rule, HSDP included); every layout in
    # it is one the framework runs and its launch can produce
    best = brute_force(problem).best
    for layout in Space(problem, 1).layouts():
        assert TORCHTITAN.supports(layout, problem.workload) is None, layout.describe()
        assert TORCHTITAN.producible(layout, target) is None, layout.placement_text()
    if best is None:
        assert result.status == "INFEASIBLE"
        return
    assert result.status == "OPTIMAL"
    assert TORCHTITAN.producible(result.evaluation.layout, target) is None, result.evaluation.layout.placement_text()
    assert TORCHTITAN.supports(result.evaluation.layout, problem.workload) is None
    assert problem.score(best) * (1 - 1e-12) <= result.objective <= problem.score(best) * (1 + 1e-9) + result.rounding


def test_nxd_is_never_offered_zero3_or_hsdp():
    t = parse_target(_trn2_like(), "t")
    w = Workload(load_model("llama3-8b"), Training(seq=2048, global_batch=16))
    problem = Problem(w, t, 1, zero_stages=NXD.zero_stages, recompute=NXD.recompute, interleave=NXD.interleaved,
                      instance_blocks=True)
    ref = brute_force(problem)
    assert ref.best is None or ref.best.layout.zero in (0, 1)
    result = solve_space(Space(problem, 1), time_limit=30, workers=1)
    if result.evaluation is not None:
        assert result.evaluation.layout.zero in (0, 1) and result.evaluation.layout.dp_replicate == 1


def _trn2_like() -> dict:
    return {"name": "small", "description": "t", "instance": "box", "chips_per_instance": 2, "runtime_reserve_gib": 0,
            "chip": {"name": "chip", "physical_cores": 2, "lnc_default": 1, "lnc_allowed": [1], "hbm_gib": 96,
                     "hbm_bandwidth_gbs": 2900, "bf16_tflops": 667, "fp8_tflops": 1299, "sbuf_kib_per_partition": 192,
                     "on_chip_bandwidth_gbs": 2900},
            "axes": [{"name": "x", "size": 2, "kind": "torus", "bandwidth_gbs": 512, "latency_us": 1.5}],
            "scale_out": {"name": "efa", "bandwidth_gbps_per_instance": 3200, "latency_us": 15},
            "reliability": {"instance_mtbf_hours": 3170, "checkpoint_gbs_per_instance": 10, "restart_minutes": 10},
            "efficiency": {"matmul": 0.5, "elementwise": 0.5, "microbatch_overhead_us": 0, "collective_fixed_share": 1,
                           "fitted_on": "test"},
            "engines": ENGINES}


def test_hsdp_is_chosen_where_it_wins_and_the_same_layout_without_it_is_slower():
    # 70B, short sequences: one micro-batch's compute is short, so FSDP's per-micro-batch
    # gathers across the scale-out network are exposed; HSDP keeps them inside the domain
    problem = Problem(Workload(load_model("llama3-70b"), Training(seq=1024, global_batch=1024)),
                      load_target("trn3-gen2"), 4, zero_stages=TORCHTITAN.zero_stages,
                      recompute=TORCHTITAN.recompute, interleave=TORCHTITAN.interleaved, hsdp=TORCHTITAN.hsdp,
                      rules=TORCHTITAN.rules, instance_blocks=True)
    result = solve_space(Space(problem, 2), time_limit=120, workers=1, deterministic_limit=30)
    hsdp = result.evaluation.layout
    assert hsdp.dp_replicate == 4 and hsdp.dp_shard > 1, hsdp.describe()
    assert TORCHTITAN.supports(hsdp, problem.workload) is None and TORCHTITAN.producible(hsdp, problem.target) is None
    plain = problem.evaluate(replace(hsdp, dp_replicate=1))
    assert plain.step.zero3 > 10 * result.evaluation.step.zero3
    assert problem.score(plain) > problem.score(result.evaluation)
    # under nxd (no HSDP) the same problem never proposes it
    nxd = solve_space(Space(replace(problem, hsdp=NXD.hsdp, zero_stages=NXD.zero_stages), 2), time_limit=120,
                      workers=1, deterministic_limit=30)
    assert nxd.evaluation is None or nxd.evaluation.layout.dp_replicate == 1
