"""Built-in targets against DESIGN section 3, and a user's target file by path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, GIB, load_target

TRN2_TEXT = resources.files("trnopt.targets").joinpath("machines/trn2.toml").read_text("utf-8")


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_every_builtin_target_loads(name):
    t = load_target(name)
    assert t.name == name
    assert t.source == f"targets/machines/{name}.toml"  # where the package holds it
    assert t.chips_per_domain % t.chips_per_instance == 0
    assert t.chip.lnc_default in t.chip.lnc_allowed


@pytest.mark.parametrize("name, chips", [("trn1", 16), ("trn2", 16), ("trn2u", 64), ("trn3-gen1", 64),
                                         ("trn3-gen2", 144), ("a100", 8), ("h100", 8)])
def test_chips_per_domain(name, chips):
    assert load_target(name).chips_per_domain == chips


@pytest.mark.parametrize("name, instances", [("trn2", 1), ("trn2u", 4), ("trn3-gen1", 4), ("trn3-gen2", 36)])
def test_instances_per_domain(name, instances):
    assert load_target(name).instances_per_domain == instances


@pytest.mark.parametrize("name", ["trn2", "trn2u", "trn3-gen1", "trn3-gen2"])
def test_scale_out_is_25_gb_per_chip(name):
    """EFA: 3,200 Gbps per 16-chip instance; 12,800 per 4 x 16 servers; 28,800 per 36 x 4 servers."""
    assert load_target(name).scale_out.bandwidth == pytest.approx(25 * GB)


def test_other_scale_out_rates():
    assert load_target("trn1").scale_out.bandwidth == pytest.approx(6.25 * GB)  # 800 Gbps / 16
    assert load_target("a100").scale_out.bandwidth == pytest.approx(25 * GB)   # DESIGN section 5
    assert load_target("h100").scale_out.bandwidth == pytest.approx(50 * GB)   # 400 Gbps NDR per GPU


def test_trn2u_axes_follow_design():
    """4x4 torus at 1,024 GB/s (both axes) and a ring of 4 at a quarter of that."""
    t = load_target("trn2u")
    assert [(a.name, a.size, a.kind) for a in t.domain_axes] == [("x", 4, "torus"), ("y", 4, "torus"),
                                                                 ("ring", 4, "ring")]
    torus = sum(a.bandwidth for a in t.domain_axes if a.kind == "torus")
    assert torus == pytest.approx(1024 * GB)
    assert t.domain_axes[2].bandwidth == pytest.approx(torus / 4)
    assert t.chips_per_domain * t.chip.hbm_bytes / GIB == pytest.approx(6144)  # DESIGN section 5


@pytest.mark.parametrize("name, size", [("trn3-gen1", 64), ("trn3-gen2", 144)])
def test_trn3_switch(name, size):
    t = load_target(name)
    (axis,) = t.domain_axes
    assert (axis.size, axis.kind) == (size, "switch")
    assert axis.bandwidth == pytest.approx(2048 * GIB, rel=1e-5)  # 2,048 GiB/s as 2,199.02 GB/s
    assert t.chip.hbm_bytes == 144 * GIB
    assert t.chip.sbuf_bytes_per_partition == 256 * 1024


def test_ranks_in_logical_cores():
    """DESIGN section 3: 64 ranks per trn2 instance at LNC=2, 256 per UltraServer."""
    assert load_target("trn2").ranks(2, 1) == 64
    assert load_target("trn2u").ranks(2, 1) == 256
    axes = load_target("trn2u").axes(2, 3)
    assert [a.name for a in axes] == ["core", "x", "y", "ring", "efa"]
    assert [a.size for a in axes] == [4, 4, 4, 4, 3]


def test_lnc_not_allowed():
    with pytest.raises(InputError, match="LNC=2 is not allowed on trn1"):
        load_target("trn1").axes(2, 1)


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_reliability_scales_with_chips_per_instance(name):
    """~50,700 h per accelerator (Llama 3 paper) divided by the chips of one instance."""
    t = load_target(name)
    per_accelerator_h = t.reliability.instance_mtbf_s / 3600 * t.chips_per_instance
    assert per_accelerator_h == pytest.approx(50_700, rel=2e-3)



def test_user_file_by_path(tmp_path: Path):
    path = tmp_path / "mine.toml"
    path.write_text(TRN2_TEXT.replace('name = "trn2"', 'name = "mine"').replace("hbm_gib = 96", "hbm_gib = 48"))
    t = load_target(str(path))
    assert (t.name, t.source, t.chip.hbm_bytes) == ("mine", str(path), 48 * GIB)
    assert t.chips_per_domain == 16


def test_user_file_errors_name_file_and_key(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text(TRN2_TEXT.replace("hbm_gib = 96", "hbm_gb = 96"))
    with pytest.raises(InputError) as err:
        load_target(str(path))
    assert str(err.value) == f"{path}: chip.hbm_gib: missing required key"


def test_unknown_target_name():
    with pytest.raises(InputError, match="unknown target; built-in targets are trn1, trn2"):
        load_target("trn9")
