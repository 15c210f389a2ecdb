"""The step-time trees under two overlap tables: one object for every tree no table changes,
new ones for the TP term and the terms that contain it, and the same numbers as trees built anew."""

from trnopt.optimizer.cost import steptime
from trnopt.optimizer.cost.overlap import NO_OVERLAP, measured
from trnopt.optimizer.cost.steptime import TERMS, step_terms, step_time
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model

DEPEND_ON_TABLE = {"tp", "pp_bubble", "dp"}  # TP, and the bubble and DP window over the work that holds it


def case():
    t = load_target("trn2u")
    axes = t.axes(2, 2)
    lay = Layout(tp=16, pp=4, dp=8, axes=axes, placement=default_placement(axes, {"tp": 16, "pp": 4, "dp": 8}),
                 zero=1, recompute="full", lnc=2)
    return t, lay, Workload(load_model("llama3-405b"), Training())


def test_trees_no_table_changes_are_shared():
    t, lay, w = case()
    hidden, bare = (step_terms(w, t, lay.axes, lay.lnc, table) for table in (measured(), NO_OVERLAP))
    for name in TERMS:
        assert (hidden[name] is bare[name]) == (name not in DEPEND_ON_TABLE), name


def test_shared_trees_give_the_numbers_of_trees_built_anew():
    t, lay, w = case()
    steps = {table is NO_OVERLAP: step_time(w, lay, t, table) for table in (measured(), NO_OVERLAP)}
    assert steps[False].tp < steps[True].tp  # the table hides some of TP on this layout
    steptime._step_terms.cache_clear()
    steptime._overlap_free.cache_clear()
    for table in (NO_OVERLAP, measured()):  # the other order: the table-free trees built under NO_OVERLAP
        assert step_time(w, lay, t, table) == steps[table is NO_OVERLAP]
