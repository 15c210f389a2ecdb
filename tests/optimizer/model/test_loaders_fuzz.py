"""Fuzzing the target and model loaders: the only exception that may come out is InputError,
its message is one line ``FILE: KEY: RULE``, and valid files load.

Inputs: random valid files (written as TOML and loaded by path), built-in files with one
mutation (a key dropped, a value of the wrong type, zero or negative, a key added), broken
constraints (axes that do not multiply to a multiple of chips_per_instance, an LNC default
that is not allowed), garbage TOML, bytes that are not UTF-8, and unknown preset names.
"""

from __future__ import annotations

import copy
import json
import math
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, load_target, parse_target
from trnopt.optimizer.model.workload import PRESETS, load_model, parse_model

FUZZ = settings(derandomize=True, max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SOURCE = "fuzz.toml"


def _builtin(package: str, name: str) -> dict[str, Any]:
    return tomllib.loads(resources.files(package).joinpath(f"{name}.toml").read_text("utf-8"))


TARGET_FILES = {n: _builtin("trnopt.targets", "machines/" + n) for n in BUILTIN_TARGETS}
MODEL_FILES = {n: _builtin("trnopt.targets", "models/" + n) for n in PRESETS}


def assert_one_line(err: InputError, source: str) -> None:
    """``FILE: KEY: RULE`` on one line, FILE the file given, KEY and RULE not empty."""
    msg = str(err)
    assert msg == f"{err.source}: {err.key}: {err.rule}"
    assert err.source == source
    assert err.key and err.rule
    assert msg.isprintable() and len(msg.splitlines()) == 1, msg


def outcome(fn: Callable[[Any, str], Any], data: Any, source: str = SOURCE) -> Any:
    """The loader's result, or None after checking the InputError; any other exception fails the test."""
    try:
        return fn(data, source)
    except InputError as err:
        assert_one_line(err, source)
        return None


# -- a tiny TOML writer for the shapes of target and model files ---------------------------

def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_value(x) for x in v) + "]"


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    plain = [f"{k} = {_value(v)}" for k, v in data.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))]
    out = "\n".join(plain) + "\n"
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out += f"\n[{name}]\n" + to_toml(v, name + ".")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                out += f"\n[[{name}]]\n" + to_toml(item, name + ".")
    return out


def test_toml_writer_round_trips_the_builtin_files():
    for data in [*TARGET_FILES.values(), *MODEL_FILES.values()]:
        assert tomllib.loads(to_toml(data)) == data


# -- valid files ---------------------------------------------------------------------------

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def valid_targets(draw) -> dict[str, Any]:
    cores = draw(st.sampled_from([1, 2, 4, 8]))
    lnc_allowed = sorted(draw(st.sets(st.sampled_from([d for d in (1, 2, 4, 8) if cores % d == 0]), min_size=1)))
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
    chips = math.prod(sizes)
    per_instance = draw(st.sampled_from([d for d in range(1, chips + 1) if chips % d == 0]))
    axis_names = draw(st.lists(names.filter(lambda n: n not in ("core", "efa")), min_size=len(sizes),
                               max_size=len(sizes), unique=True))
    axes = [{"name": n, "size": s, "kind": draw(st.sampled_from(["torus", "ring", "switch"])),
             "bandwidth_gbs": draw(positive), "latency_us": draw(st.sampled_from([0, 0.5, 15]))}
            for n, s in zip(axis_names, sizes)]
    data = {
        "name": draw(names), "description": "fuzzed", "instance": "box", "chips_per_instance": per_instance,
        "runtime_reserve_gib": draw(st.sampled_from([0, 2, 1.5])),
        "chip": {"name": "chip", "physical_cores": cores, "lnc_default": draw(st.sampled_from(lnc_allowed)),
                 "lnc_allowed": lnc_allowed, "hbm_gib": draw(st.floats(2.5, 1e6)), "hbm_bandwidth_gbs": draw(positive),
                 "bf16_tflops": draw(positive), "fp8_tflops": draw(positive),
                 "sbuf_kib_per_partition": draw(st.integers(1, 512)), "on_chip_bandwidth_gbs": draw(positive)},
        "axes": axes,
        "scale_out": {"name": "efa", "bandwidth_gbps_per_instance": draw(positive), "latency_us": 15},
        "reliability": {"instance_mtbf_hours": draw(positive), "checkpoint_gbs_per_instance": draw(positive),
                        "restart_minutes": 10},
        "efficiency": {"matmul": draw(st.floats(0.01, 1.0)), "elementwise": draw(st.floats(0.01, 1.0)),
                       "microbatch_overhead_us": draw(st.floats(0, 1e4)), "fitted_on": "fuzz",
                       "collective_fixed_share": draw(st.floats(0.01, 1.0))},
        "engines": {"tensor_ghz": draw(st.floats(0.1, 10)), "pe_rows": 128, "stationary_fmax": 128, "moving_fmax": 512,
                    "matmul_min_cycles": 64, "vector_ghz": 1.0, "vector_lanes": 128, "scalar_ghz": 1.0, "scalar_lanes": 128},
    }
    if draw(st.booleans()):
        data["chips_per_domain"] = chips
    return data


@st.composite
def valid_models(draw) -> dict[str, Any]:
    kv = draw(st.integers(1, 8))
    heads = kv * draw(st.integers(1, 8))
    head_dim = draw(st.sampled_from([8, 16, 64, 128]))
    layers = draw(st.integers(1, 64))
    data: dict[str, Any] = {"name": draw(names), "layers": layers, "hidden": heads * head_dim, "heads": heads,
                            "kv_heads": kv, "vocab": draw(st.integers(1, 200_000)),
                            "gated_mlp": draw(st.booleans()), "tied_embeddings": draw(st.booleans())}
    if draw(st.booleans()):
        experts = draw(st.integers(1, 64))
        dense = draw(st.integers(0, layers - 1))
        data["moe"] = {"experts": experts, "top_k": draw(st.integers(1, experts)),
                       "expert_ffn": draw(st.integers(1, 4096)), "shared_experts": draw(st.integers(0, 2)),
                       "dense_layers": dense}
        if dense:
            data["ffn"] = draw(st.integers(1, 8192))
    else:
        data["ffn"] = draw(st.integers(1, 8192))
    if draw(st.booleans()):
        data["mla"] = {k: draw(st.integers(1, 512)) for k in
                       ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    if draw(st.booleans()):
        data["published_params_b"] = draw(positive)
    return data


@FUZZ
@given(data=valid_targets())
def test_valid_target_files_load(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("t") / "target.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    t = load_target(str(path))
    assert t.name == data["name"] and t.source == str(path)
    assert t.chips_per_domain == math.prod(a["size"] for a in data["axes"])
    assert t.chips_per_domain % t.chips_per_instance == 0
    assert t.scale_out.bandwidth == pytest.approx(
        data["scale_out"]["bandwidth_gbps_per_instance"] * GB / 8 / data["chips_per_instance"])
    lnc = t.chip.lnc_default
    assert t.ranks(lnc, 3) == math.prod(a.size for a in t.axes(lnc, 3))


@FUZZ
@given(data=valid_models())
def test_valid_model_files_load(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("m") / "model.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    m = load_model(str(path))
    assert (m.name, m.layers, m.hidden, m.heads, m.kv_heads) == (
        data["name"], data["layers"], data["hidden"], data["heads"], data["kv_heads"])
    assert sum(m.param_breakdown().values()) == m.total_params() >= m.active_params() > 0


# -- mutated files -------------------------------------------------------------------------

def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into a parsed file: dict keys and list indices, tables included."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    out = []
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _parent(root: Any, path: tuple) -> Any:
    for k in path[:-1]:
        root = root[k]
    return root


weird = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30), st.sampled_from([0, -1, -8, 2**41, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.5, 1e308, float("nan")]),
    st.text(max_size=8), st.sampled_from(["", "torus", "\n", "a\nb"]),
    st.lists(st.integers(-3, 9), max_size=4), st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(-2, 2), max_size=2), st.just([{}]), st.just({}),
)


@st.composite
def mutated(draw, files: dict[str, dict]) -> dict[str, Any]:
    data = copy.deepcopy(files[draw(st.sampled_from(sorted(files)))])
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _parent(data, path)
        op = draw(st.sampled_from(["drop", "set", "set", "add"]))
        if op == "drop":
            del parent[path[-1]]
        elif op == "set":
            parent[path[-1]] = draw(weird)
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(weird)
    return data


@FUZZ
@given(data=mutated(TARGET_FILES))
def test_mutated_targets_fail_cleanly(data):
    t = outcome(parse_target, data)
    if t is not None:  # the mutation kept the file valid (e.g. a new description)
        assert t.chips_per_domain % t.chips_per_instance == 0
        assert all(math.isfinite(a.bandwidth) and a.bandwidth > 0 for a in (*t.domain_axes, t.scale_out))
        assert t.chip.lnc_default in t.chip.lnc_allowed


@FUZZ
@given(data=mutated(MODEL_FILES))
def test_mutated_models_fail_cleanly(data):
    m = outcome(parse_model, data)
    if m is not None:
        assert m.total_params() >= m.active_params() > 0


@FUZZ
@given(data=weird)
def test_anything_at_all(data):
    assert outcome(parse_target, data) is None
    assert outcome(parse_model, data) is None


# -- specific broken rules -----------------------------------------------------------------

def _trn2() -> dict[str, Any]:
    return copy.deepcopy(TARGET_FILES["trn2"])


def _rejected(fn, data, key: str) -> str:
    with pytest.raises(InputError) as err:
        fn(data, SOURCE)
    assert_one_line(err.value, SOURCE)
    assert err.value.key == key
    return err.value.rule


OPTIONAL_TARGET_KEYS = ("achievable", "collectives", "calibration")  # defaults: datasheet rate, ring


@pytest.mark.parametrize("path", sorted(p for p in _paths(TARGET_FILES["trn2"])
                                        if isinstance(p[-1], str) and p[-1] not in OPTIONAL_TARGET_KEYS))
def test_dropping_any_target_key_is_rejected(path):
    data = _trn2()
    del _parent(data, path)[path[-1]]
    assert outcome(parse_target, data) is None


@pytest.mark.parametrize("path", sorted(_paths(MODEL_FILES["deepseek-v3"])))
def test_dropping_a_model_key(path):
    data = copy.deepcopy(MODEL_FILES["deepseek-v3"])
    del _parent(data, path)[path[-1]]
    m = outcome(parse_model, data)
    optional = {"source", "published_params_b", "published_active_params_b", "kv_heads", "head_dim",
                "moe", "mla", "shared_experts", "dense_layers", "route_nodes"}
    assert (m is not None) == (path[-1] in optional)


@pytest.mark.parametrize("value", [0, -4])
def test_zero_or_negative_axis_size(value):
    data = _trn2()
    data["axes"][1]["size"] = value
    assert _rejected(parse_target, data, "axes[1].size") == f"must be >= 1, got {value}"


@pytest.mark.parametrize("key", ["hbm_gib", "bf16_tflops", "hbm_bandwidth_gbs"])
def test_zero_or_negative_chip_figures(key):
    for value in (0, -1.5):
        data = _trn2()
        data["chip"][key] = value
        assert _rejected(parse_target, data, f"chip.{key}").startswith("must be > 0")


def test_axes_not_a_multiple_of_chips_per_instance():
    data = _trn2()
    data["axes"][0]["size"] = 3
    assert _rejected(parse_target, data, "chips_per_instance") == \
        "16 does not divide the 12 chips that the axes multiply to (3 x 4)"


def test_lnc_default_not_allowed():
    data = _trn2()
    data["chip"]["lnc_default"] = 4
    assert _rejected(parse_target, data, "chip.lnc_default") == "4 is not in lnc_allowed [1, 2]"


def test_wrong_types():
    data = _trn2()
    data["chips_per_instance"] = "16"
    assert _rejected(parse_target, data, "chips_per_instance") == "must be an integer, got '16'"
    data = _trn2()
    data["axes"][0]["kind"] = "mesh"
    assert _rejected(parse_target, data, "axes[0].kind") == "must be one of torus, ring, switch, got 'mesh'"
    data = _trn2()
    data["chip"]["hbm_gib"] = 10**400
    assert _rejected(parse_target, data, "chip.hbm_gib") == "must be finite"
    data = _trn2()
    data["chip"]["hbm_gib"] = 1e300
    assert _rejected(parse_target, data, "chip.hbm_gib").startswith("too large")


def test_unknown_key_with_a_line_break_stays_on_one_line():
    data = _trn2()
    data["chip"]["hbm\ngib"] = 1
    rule = _rejected(parse_target, data, "chip.hbm\\ngib")
    assert rule.startswith("unknown key; this table takes bf16_tflops, fp8_tflops, hbm_bandwidth_gbs")


def test_scale_out_named_like_an_axis():
    data = _trn2()
    data["scale_out"]["name"] = "x"
    assert _rejected(parse_target, data, "scale_out.name").startswith("'x' is already the name")


def test_repeated_lnc():
    data = _trn2()
    data["chip"]["lnc_allowed"] = [2, 2]
    assert _rejected(parse_target, data, "chip.lnc_allowed") == "must not repeat a value, got [2, 2]"


# -- files that are not TOML, paths that are not files, names that are not presets -------------

@FUZZ
@given(text=st.text(max_size=200))
def test_garbage_toml(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("g") / "garbage.toml"
    path.write_text(text, encoding="utf-8")
    for load in (load_target, load_model):
        try:
            load(str(path))
        except InputError as err:
            assert_one_line(err, str(path))
        else:
            pytest.fail("garbage loaded")


@FUZZ
@given(blob=st.binary(max_size=64))
def test_bytes_that_are_not_text(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("b") / "blob.toml"
    path.write_bytes(b"\xff\xfe" + blob)
    with pytest.raises(InputError) as err:
        load_target(str(path))
    assert err.value.rule == "not UTF-8 text"


@FUZZ
@given(name=st.text(max_size=20))
def test_unknown_names(name):
    """Any string as --target / --model: a built-in loads, anything else is one InputError."""
    for load, builtin in ((load_target, BUILTIN_TARGETS), (load_model, PRESETS)):
        try:
            load(name)
        except InputError as err:
            assert str(err).isprintable() and len(str(err).splitlines()) == 1
        else:
            assert name in builtin


def test_paths_that_are_not_files(tmp_path: Path):
    cases = {str(tmp_path): "is a directory, not a TOML file", str(tmp_path / "none.toml"): "file not found",
             "a\0b.toml": "not a usable path"}
    for path, rule in cases.items():
        for load in (load_target, load_model):
            with pytest.raises(InputError) as err:
                load(path)
            assert err.value.rule.startswith(rule)
            assert str(err.value).isprintable()
