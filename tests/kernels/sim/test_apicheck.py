"""The simulator's public API matches the NKI 0.7 reference table (names, params, defaults,
classes, names of every module and submodule); what it does not implement raises
NotImplementedError naming the function and the version."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnopt.kernels.sim import apicheck


def _shared_signatures() -> Path | None:
    """../shared/nki-api/signatures.json (the NKI 0.6 table) beside the repository."""
    here = Path(__file__).resolve()
    repo = here.parents[3]
    for cand in (repo / ".." / "shared" / "nki-api" / "signatures.json",
                 repo / "shared" / "nki-api" / "signatures.json"):
        if cand.is_file():
            return cand
    return None


def test_simulator_matches_the_07_reference() -> None:
    assert apicheck.api_differences(apicheck.load_reference()) == []


def test_reference_is_07_with_its_submodules() -> None:
    ref = apicheck.load_reference()
    assert {"nki", "nki.language", "nki.isa", "nki.isa.constants", "nki.collectives", "nki.typing",
            "nki.dtype"} <= set(ref)
    assert {"all_gather_v_prepare", "all_gather_v_trigger", "all_to_all_v_prepare",
            "all_to_all_v_trigger"} <= set(ref["nki.collectives"]["functions"])
    assert "from_partition_op" in ref["nki.collectives"]["classes"]["ReplicaGroup"]["members"]
    assert {"oob_mode", "dge_mode", "engine"} <= set(ref["nki.isa.constants"]["classes"])


def test_07_table_extends_the_06_table_unchanged() -> None:
    path = _shared_signatures()
    if path is None:
        pytest.skip("shared/nki-api/signatures.json not found beside the repository")
    old, new = apicheck.load_reference(path), apicheck.load_reference()
    for mod, spec in old.items():
        for name, params in spec["functions"].items():
            assert new[mod]["functions"][name] == params, f"{mod}.{name}"


def test_unimplemented_functions_say_so_with_name_and_version() -> None:
    from trnopt.kernels.sim import isa, unimplemented

    ref = apicheck.load_reference()
    missing = [n for n, f in apicheck.provided_functions(isa).items() if not apicheck.is_implemented(f)]
    assert missing == []  # local_gather, the last one, is implemented
    stub = unimplemented.stub("nki.isa", "local_gather", ref["nki.isa"]["functions"]["local_gather"], "a reason")
    with pytest.raises(NotImplementedError, match=r"nki\.isa\.local_gather \(NKI 0\.7 \(Neuron SDK 2\.33\)\) is not "
                                                  r"implemented by the trnopt simulator: a reason"):
        stub(None, None, None)
    counts = apicheck.implemented_counts(ref)
    assert counts["nki.isa"] == (52, 52)


def test_core_api_implemented() -> None:
    mods = apicheck.modules()
    names = {m: {n for n, f in apicheck.provided_functions(mod).items() if apicheck.is_implemented(f)}
             for m, mod in mods.items()}
    assert {"jit", "simulate"} <= names["nki"]
    assert {"ndarray", "load", "store", "broadcast_to", "sum", "max", "gelu", "gelu_apprx_sigmoid"} <= names["nki.language"]
    assert {"dma_copy", "nc_matmul", "tensor_reduce", "tensor_tensor_scan", "dma_transpose", "sendrecv", "core_barrier",
            "nonzero_with_count", "register_alloc", "iota"} <= names["nki.isa"]
    assert {"all_gather_v", "all_to_all_v", "all_to_all_v_prepare", "all_to_all_v_trigger"} <= names["nki.collectives"]


def test_nki_api_falls_back_to_simulator() -> None:
    from trnopt.kernels import nki_api
    from trnopt.kernels.sim import collectives, isa, language, nki

    if nki_api.USING_REAL_NKI:
        pytest.skip("real nki installed")
    assert (nki_api.nki, nki_api.nl, nki_api.nisa, nki_api.ncc) == (nki, language, isa, collectives)
