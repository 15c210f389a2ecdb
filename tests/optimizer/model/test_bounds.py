"""Physical sanity bounds: a 2030 accelerator at 10x (and 100x) today's rates loads; 1e-300 and 1e300 do not."""

import tomllib
from importlib import resources

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import BUILTIN_TARGETS, parse_target

RATES = {"chip": ("hbm_gib", "hbm_bandwidth_gbs", "bf16_tflops", "fp8_tflops", "on_chip_bandwidth_gbs"),
         "scale_out": ("bandwidth_gbps_per_instance",), "reliability": ("instance_mtbf_hours",
                                                                         "checkpoint_gbs_per_instance")}


def shipped(name: str) -> dict:
    return tomllib.loads(resources.files("trnopt.targets").joinpath(f"machines/{name}.toml").read_text("utf-8"))


def scaled(data: dict, factor: float) -> dict:
    for table, keys in RATES.items():
        for key in keys:
            data[table][key] *= factor
    for axis in data["axes"]:
        axis["bandwidth_gbs"] *= factor
    data["runtime_reserve_gib"] *= min(1, factor)  # a small old chip has a small reserve
    return data


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
@pytest.mark.parametrize("factor", [1e-2, 10, 100])
def test_future_and_old_machines_load(name, factor):
    target = parse_target(scaled(shipped(name), factor), "future.toml")
    assert target.chip.bf16_flops == pytest.approx(shipped(name)["chip"]["bf16_tflops"] * factor * 1e12)


@pytest.mark.parametrize("table,key", [(t, k) for t, ks in RATES.items() for k in ks] + [("axes", "bandwidth_gbs")])
@pytest.mark.parametrize("value", [1e-300, 1e300])
def test_absurd_rates_are_refused(table, key, value):
    data = shipped("trn2")
    (data["axes"][0] if table == "axes" else data[table])[key] = value
    with pytest.raises(InputError) as err:
        parse_target(data, "absurd.toml")
    assert err.value.rule.startswith("too small" if value < 1 else "too large")
    assert key in err.value.key


def test_latency_of_1e300_is_refused_and_zero_allowed():
    data = shipped("trn2")
    data["axes"][0]["latency_us"] = 0
    parse_target(data, "ideal.toml")
    data["axes"][0]["latency_us"] = 1e300
    with pytest.raises(InputError, match="axes\\[0\\].latency_us: too large"):
        parse_target(data, "slow.toml")


def test_runtime_reserve_must_leave_hbm():
    data = shipped("trn2")
    data["runtime_reserve_gib"] = data["chip"]["hbm_gib"]
    with pytest.raises(InputError, match="runtime_reserve_gib: .* leaves nothing"):
        parse_target(data, "full.toml")
