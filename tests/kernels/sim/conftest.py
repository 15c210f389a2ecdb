"""Shared fixtures of the simulator tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture()
def legacy():
    """The pre-0.6 front end installed as ``neuronxcc.nki``: (nki, nl, nisa), uninstalled after."""
    from trnopt.kernels.sim import shim
    shim.install_legacy()
    from neuronxcc import nki
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl
    yield nki, nl, nisa
    shim.uninstall_legacy()
