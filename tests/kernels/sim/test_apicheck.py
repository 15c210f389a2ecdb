"""The simulator's public functions match the NKI API reference (names, params, defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnopt.kernels.sim import apicheck


def _shared_signatures() -> Path | None:
    """../shared/nki-api/signatures.json beside the repository (/work/main or a CI clone)."""
    here = Path(__file__).resolve()
    repo = here.parents[3]
    for cand in (repo / ".." / "shared" / "nki-api" / "signatures.json",
                 repo / "shared" / "nki-api" / "signatures.json"):
        if cand.is_file():
            return cand
    return None


def test_packaged_subset_matches_simulator() -> None:
    ref = apicheck.load_reference()
    assert apicheck.api_differences(ref) == []


def test_every_reference_function_in_the_subset_is_provided() -> None:
    ref = apicheck.load_reference()
    for mod, module in apicheck.MODULES.items():
        provided = apicheck.provided_functions(module)
        assert set(ref[mod]["functions"]) == set(provided), mod


def test_simulator_matches_shared_reference() -> None:
    path = _shared_signatures()
    if path is None:
        pytest.skip("shared/nki-api/signatures.json not found beside the repository")
    ref = apicheck.load_reference(path)
    assert apicheck.api_differences(ref) == []
    # the packaged copy is an exact subset of the shared table
    packaged = apicheck.load_reference()
    for mod in apicheck.MODULES:
        for name, params in packaged[mod]["functions"].items():
            assert ref[mod]["functions"][name] == params, f"{mod}.{name}"


def test_core_api_present() -> None:
    names = {m: set(apicheck.provided_functions(mod)) for m, mod in apicheck.MODULES.items()}
    assert {"jit", "simulate"} <= names["nki"]
    assert {"ndarray", "zeros", "ds", "affine_range", "program_id"} <= names["nki.language"]
    assert {"dma_copy", "nc_matmul", "tensor_copy", "tensor_tensor", "memset", "activation"} <= names["nki.isa"]
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
            "collective_permute_implicit", "collective_permute_implicit_reduce",
            "collective_permute_implicit_current_processing_rank_id", "rank_id"} <= names["nki.collectives"]


def test_nki_api_falls_back_to_simulator() -> None:
    from trnopt.kernels import nki_api
    from trnopt.kernels.sim import collectives, isa, language, nki

    if nki_api.USING_REAL_NKI:
        pytest.skip("real nki installed")
    assert (nki_api.nki, nki_api.nl, nki_api.nisa, nki_api.ncc) == (nki, language, isa, collectives)
