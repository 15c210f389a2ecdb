"""Whether a workload's sizes stay in the range the cost model and CP-SAT compute exactly.

Each key of a model file has its own bound (bounds.py), but their products can still leave
the range of 64-bit integers that CP-SAT works in (hidden 2^24 x layers 2^16 x seq 2^26 is
2^66 activation elements). Two products bound them, each far above any real run:

- parameters at most ``MAX_PARAMS`` = 1e15 (2026's largest models have ~2e12: 500x);
- activation elements of one sequence over all layers, seq x hidden x layers, at most
  ``MAX_ACTIVATION_ELEMENTS`` = 2^50 (~1.1e15; Llama 3 405B at a 128k context has 2.7e11:
  4,000x), so that the bytes of a step stay below 2^63.
"""

from __future__ import annotations

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.workload import Workload

MAX_PARAMS = 10**15
MAX_ACTIVATION_ELEMENTS = 2**50


def check_scale(workload: Workload, model_source: str, model_key: str, seq_source: str, seq_key: str) -> None:
    """InputError naming where the model (parameters) or the sequence (activations) came from."""
    m, t = workload.model, workload.training
    params = m.total_params()
    if params > MAX_PARAMS:
        raise InputError(model_source, model_key, f"{m.name} has {params:.3g} parameters; at most "
                         f"{MAX_PARAMS:.0e} (no model is near it)")
    elements = t.seq * m.hidden * m.layers
    if elements > MAX_ACTIVATION_ELEMENTS:
        raise InputError(seq_source, seq_key, f"seq x hidden x layers = {t.seq:,} x {m.hidden:,} x {m.layers:,} = "
                         f"{elements:.3g} activation elements per sequence; at most 2^50 = "
                         f"{MAX_ACTIVATION_ELEMENTS:.3g}")
