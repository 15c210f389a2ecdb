"""Layouts with pipeline stages for the uneven-split tests (cost/stages.py, search/stagesplit.py)."""

from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def piped(model: str, tp: int, pp: int, recompute: str = "full", target: str = "trn2u", domains: int = 1,
          micro_batch: int = 1, schedule: str = "", headroom: float = 0.1):
    """(problem, layout): ``model`` at TP ``tp`` x PP ``pp``, the rest data parallel, on ``domains``
    domains of ``target`` at its default LNC."""
    t = load_target(target)
    axes = t.axes(t.chip.lnc_default, domains)
    ranks = t.ranks(t.chip.lnc_default, domains)
    deg = dict(tp=tp, pp=pp, dp=ranks // (tp * pp), ep=1, cp=1)
    layout = Layout(tp=tp, pp=pp, dp=deg["dp"], axes=axes, placement=default_placement(axes, deg),
                    recompute=recompute, micro_batch=micro_batch, schedule=schedule, lnc=t.chip.lnc_default)
    return Problem(Workload(load_model(model), Training()), t, domains, headroom), layout
