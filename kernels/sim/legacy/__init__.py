"""The pre-0.6 NKI front end (``neuronxcc.nki``) over the simulator's engines; see
``nki``, ``language``, ``isa`` and ``index`` (arange / mgrid / masks)."""

from __future__ import annotations

from . import nki  # noqa: F401
