"""Pre-0.6 NKI instructions on runtime addresses: ``nisa.tensor_copy_dynamic_src`` /
``tensor_copy_dynamic_dst`` (a copy whose source or destination sits at an offset read from
an SBUF tile), ``nisa.local_gather`` returning its tile, and ``nl.atomic_rmw`` (an add into
HBM rows picked by an index tile). Each runs on the 0.6+ engines of ``kernels.sim.isa``."""

from __future__ import annotations

import numpy as np

from .. import isa as _isa
from .. import language as _nl
from ..constants import engine
from ..errors import ConstraintError
from ..isa_vector import LOCAL_GATHER_PARTITIONS
from ..state import here
from ..tensor import MemoryRegion, NkiTensor
from .language import resolve


def tensor_copy_dynamic_src(src, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """A copy of ``src`` into a new SBUF tile, ``src`` indexed at a runtime offset within each
    partition (``t[ix, offsets[0, i] + iy]``: the offset a value of an SBUF tile, read when the
    view is made; "nki.isa.tensor_copy_dynamic_src"). Timed as tensor_copy (ASSUMPTION: the
    reference's floor of ~600 engine cycles per dynamic-source copy is not modelled)."""
    from .isa import _dt, _run
    return _run("tensor_copy_dynamic_src", src.shape, _dt(dtype, src), MemoryRegion.sbuf,
                lambda dst, **o: _isa.tensor_copy(dst, o["s"], engine=engine), mask, {"s": src})


def tensor_copy_dynamic_dst(dst, src, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """Copy ``src`` into ``dst`` indexed at a runtime offset ("nki.isa.tensor_copy_dynamic_dst")."""
    if mask is not None:
        raise NotImplementedError(f"{here('nisa.tensor_copy_dynamic_dst')}: a mask is not simulated here")
    return _isa.tensor_copy(resolve(dst, "nisa.tensor_copy_dynamic_dst"),
                            resolve(src, "nisa.tensor_copy_dynamic_dst"), engine=engine)


def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, mask=None, **kwargs):
    """The gathered tile [P, num_valid_indices, num_elem_per_idx] (the shape of the reference's
    NumPy semantics, "nki.isa.local_gather"; ``num_valid_indices`` defaults to all the indices
    of a 16-partition slice)."""
    from .isa import _run
    p = src_buffer.shape[0]
    valid = index.size // max(1, p // LOCAL_GATHER_PARTITIONS) if num_valid_indices is None else num_valid_indices
    return _run("local_gather", (p, int(valid), int(num_elem_per_idx)), src_buffer.dtype, MemoryRegion.sbuf,
                lambda dst, **o: _isa.local_gather(dst, o["s"], o["i"], num_elem_per_idx, num_valid_indices),
                mask, {"s": src_buffer, "i": index})


def atomic_rmw(dst, value, op, mask=None, **kwargs):
    """``dst = op(dst, value)`` on HBM rows picked by an index tile (``t[idx_tile, ix]``), as
    one atomic read-modify-write per element ("nki.language.atomic_rmw": only np.add). Run as
    the DMA engines' read-modify-write (``nisa.dma_compute``); rows picked more than once
    accumulate in partition order, one run of distinct rows after another."""
    w = here("nl.atomic_rmw")
    if getattr(op, "__name__", "") != "add":
        raise ConstraintError(f"{w}: op must be np.add (the only atomic op), got {op!r}")
    if mask is not None:
        raise NotImplementedError(f"{w}: a mask is not simulated here")
    d = resolve(dst, "nl.atomic_rmw")
    if d.buffer.on_chip:
        raise ConstraintError(f"{w}: dst must be an HBM tensor, got {d.buffer.name}")
    v = resolve(value, "nl.atomic_rmw") if isinstance(value, NkiTensor) else _nl.full(tuple(d.shape), value, d.dtype)
    rows = d._rows
    if rows is None or len(np.unique(rows)) == len(rows):
        return _isa.dma_compute(d, [d, v], _nl.add)
    start, seen = 0, set()
    for p, r in enumerate(list(rows) + [None]):
        if r is None or int(r) in seen:
            part = d._gather_partitions(start, p)
            _isa.dma_compute(part, [part, v[start:p]], _nl.add)
            start, seen = p, set()
        if r is not None:
            seen.add(int(r))
    return None

