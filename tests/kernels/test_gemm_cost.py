"""One GEMM timed twice: by the simulator's timeline and by the cost model, on the same engine rates."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from trnopt.kernels.sim import TensorSpec, rates, run_ranks
from trnopt.kernels.tiling import matmul
from trnopt.optimizer.cost.compute import Rank, gemm_seconds
from trnopt.optimizer.model.target import load_target


def test_the_simulator_runs_trn2s_tensor_engine_rates():
    e = load_target("trn2").engines
    assert e.tensor_hz == rates.TENSOR_ENGINE_HZ
    assert e.matmul_min_cycles == rates.MATMUL_MIN_CYCLES
    assert (e.pe_rows, e.stationary_fmax, e.moving_fmax) == (rates.PMAX, rates.GEMM_STATIONARY_FMAX,
                                                              rates.GEMM_MOVING_FMAX)


@pytest.mark.parametrize("m,k,n", [(2048, 4096, 4096), (1024, 2048, 8192)])
def test_a_gemm_takes_the_same_time_in_the_simulator_and_the_cost_model(m, k, n):
    t = load_target("trn2")
    t = dataclasses.replace(t, efficiency=dataclasses.replace(t.efficiency, matmul=1.0))  # the engine's own rate
    bf16 = np.dtype(ml_dtypes.bfloat16)
    simulated = run_ranks(matmul, [(TensorSpec((k, m), bf16), TensorSpec((k, n), bf16))], numerics=False)
    modelled = gemm_seconds(t, Rank(1, t.chip.hbm_bandwidth / t.chip.physical_cores), m, k, n)
    assert modelled == pytest.approx(simulated.timeline.total_s, rel=0.05)
