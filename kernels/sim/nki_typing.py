"""``nki.typing``: names for type annotations of kernels. The simulator provides ``tensor``
(an NKI tensor: ``nki.language.NkiTensor``)."""

from __future__ import annotations

from .tensor import NkiTensor as tensor

__all__ = ["tensor"]
