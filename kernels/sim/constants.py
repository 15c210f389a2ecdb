"""``nki.isa.constants``: the ISA configuration enums ("NKI ISA Config Enums", NKI 0.7):
engine, dge_mode, dma_engine, oob_mode, reduce_cmd, matmul_perf_mode, and nc_version.
``nki.isa`` re-exports them."""

from __future__ import annotations

from enum import Enum, IntEnum


class engine(Enum):
    """Neuron Device engines (values as in the SDK 2.33 nki.isa source)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class dge_mode(Enum):
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class dma_engine(Enum):
    dma = 0
    gpsimd_dma = 1


class oob_mode(Enum):
    error = 0
    skip = 1


class reduce_cmd(Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class matmul_perf_mode(Enum):
    none = 0
    double_row = 1


class nc_version(IntEnum):  # comparable with ints, as kernels write `get_nc_version() >= 3`
    gen2 = 2
    gen3 = 3
    gen4 = 4
