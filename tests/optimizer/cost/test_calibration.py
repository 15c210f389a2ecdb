"""The cost model on the published runs it is calibrated on (Korthikanti et al. 2022, Table 5)."""

from trnopt.optimizer.cost.calibration import fit, table5_rows
from trnopt.optimizer.model.target import BUILTIN_TARGETS, load_target


def test_table5_errors_within_the_goal():
    rows = table5_rows(load_target("a100"))
    errors = [abs(r.error) for r in rows]
    assert len(rows) == 8
    assert sum(errors) / len(errors) <= 0.05
    assert max(errors) <= 0.10


def test_shipped_efficiency_is_the_fit_and_carried_to_every_target():
    a100 = load_target("a100")
    _, best = fit(a100)
    assert best == a100.efficiency
    for name in BUILTIN_TARGETS:
        assert load_target(name).efficiency == a100.efficiency, name
