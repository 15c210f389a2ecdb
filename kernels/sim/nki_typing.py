"""``nki.typing``: names for type annotations of kernels. ``tensor`` is an NKI tensor
(``nki.language.NkiTensor``); ``mutable_tensor`` annotates a kernel argument the kernel
writes in place (an output passed in: nki-library's ``router_topk`` takes its three outputs
so, and the compiler requires at least one store to each, error NCC_IGCA090, per that
kernel's comments and aws-neuron-sdk nki/library/api/router-topk.rst). An argument is the
same tensor either way; the simulator lets every HBM argument be written, so it is an alias."""

from __future__ import annotations

from .tensor import NkiTensor as tensor

mutable_tensor = tensor

__all__ = ["tensor", "mutable_tensor"]
