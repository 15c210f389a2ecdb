"""``neuronxcc.nki.typing``: annotation names of pre-0.6 kernels ("nki.typing"):
``tensor`` and ``mutable_tensor`` (also subscripted, ``nt.tensor[(128, 512), nl.float32]``)."""

from __future__ import annotations

from typing import Any

from ..tensor import NkiTensor


class _Annotation:
    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getitem__(self, item: Any) -> "_Annotation":
        return self

    def __repr__(self) -> str:
        return f"nt.{self.__name__}"


tensor = _Annotation("tensor")
mutable_tensor = _Annotation("mutable_tensor")
scalar = _Annotation("scalar")
Tensor = NkiTensor
