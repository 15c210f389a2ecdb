"""How many of AWS's public NKI 0.6+ kernels run unmodified on trnopt's simulator and match NumPy.

    /work/venv/bin/python benchmarks/aws_kernels.py /work/scratch/aws-kernels [-k SUBSTRING]

(-k runs only the kernels whose ``file::kernel`` contains SUBSTRING; the count is then partial.)

FOLDER holds copies of the kernels, kept outside this repository:
  FOLDER/sdk/*.py  the 0.6+ files of aws-neuron-sdk nki/examples (``import nki``, not
                   ``neuronxcc.nki``);
  FOLDER/lib/src/nkilib_src/nkilib/...  aws-neuron/nki-library (its ``nkilib`` package).
Each kernel file is imported through ``trnopt.kernels.sim.install()`` (``import nki`` maps
to the simulator), run on generated inputs and compared with a NumPy reference written
here (or an expected error, for the examples that show a violation). Every public
``@nki.jit`` kernel found in the folder is listed; kernels without a case here are counted
in the total as "no case". Prints a table and the count; says "not run" when the folder is
missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass
class Case:
    """One kernel: where it is, its inputs (per rank), its NumPy reference."""

    file: str  # relative to FOLDER
    kernel: str
    inputs: Callable[[np.random.Generator, int], tuple[tuple, dict]]  # (rng, rank) -> (args, kwargs)
    reference: Callable[..., Any] | None  # (args, kwargs, rank, all_args) -> expected output(s)
    ranks: int = 1
    lnc: int | None = None
    rtol: float = 1e-5
    atol: float = 1e-5
    expect_error: str | None = None  # a regex the simulator's error must match
    hardware_only: str = ""  # why it cannot run on a CPU simulator (not counted)
    module: str | None = None  # import as a package module (nki-library)
    post: Callable[[Any], Any] | None = None  # the kernel's output into the reference's layout
    # for subkernels that take or return SBUF tensors: kernel -> a small kernel written here
    # that moves HBM arguments to SBUF, calls it, and copies its SBUF results to HBM
    wrap: Callable[[Any], Any] | None = None


def _f32(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


# --- NumPy references ------------------------------------------------------------------------
def ref_mamba(delta, u, A, B, C):
    """Selective scan: h_t = exp(delta_t A) h_{t-1} + delta_t u_t B_t; y_t = sum_n C_t h_t."""
    batch, ch, L = delta.shape
    out = np.zeros((batch, ch, L), np.float64)
    for b in range(batch):
        for n in range(A.shape[1]):
            dA = np.exp(delta[b] * A[:, n:n + 1])
            dBu = delta[b] * u[b] * B[b, n][None, :]
            h = np.zeros(ch)
            for t in range(L):
                h = dA[:, t] * h + dBu[:, t]
                out[b, :, t] += C[b, n, t] * h
    return out.astype(np.float32)


def ref_avgpool(x, pool):
    c, h, w = x.shape
    return x.astype(np.float32).reshape(c, h // pool, pool, w // pool, pool).mean(axis=(2, 4)).astype(x.dtype)


def ref_maxpool(x, pool):
    c, h, w = x.shape
    return x.reshape(c, h // pool, pool, w // pool, pool).max(axis=(2, 4))


def _matmul_case(kernel: str, k: int, m: int, n: int) -> Case:
    def inputs(rng, rank):
        return (rng.standard_normal((k, m)).astype(BF16), rng.standard_normal((k, n)).astype(BF16)), {}
    return Case("sdk/matrix_multiplication_nki_kernels.py", kernel, inputs,
                lambda a, kw, r, al: (a[0].astype(np.float32).T @ a[1].astype(np.float32)).astype(BF16),
                rtol=2e-2, atol=2e-1)


def _mamba_case(kernel: str) -> Case:
    def inputs(rng, rank):
        b, ch, L, n = 1, 256, 512, 16
        return (rng.uniform(0.1, 1, (b, ch, L)).astype(np.float32), rng.standard_normal((b, ch, L)).astype(np.float32),
                -rng.uniform(0.5, 1, (ch, n)).astype(np.float32), rng.standard_normal((b, n, L)).astype(np.float32),
                rng.standard_normal((b, n, L)).astype(np.float32)), {}
    return Case("sdk/mamba_nki_kernels.py", kernel, inputs, lambda a, kw, r, al: ref_mamba(*a), rtol=1e-3, atol=1e-3)


SDK_CASES = [
    Case("sdk/nki_simulate_example.py", "add_kernel",
         lambda rng, r: ((_f32(128, 512)(rng), _f32(128, 512)(rng)), {}), lambda a, kw, r, al: a[0] + a[1]),
    Case("sdk/getting_started_baremetal.py", "nki_tensor_add_kernel",
         lambda rng, r: ((np.ones((4, 3), np.float16), np.ones((4, 3), np.float16)), {}),
         lambda a, kw, r, al: a[0] + a[1]),
    Case("sdk/tensor_addition_nki_kernels.py", "nki_tensor_add",
         lambda rng, r: ((_f32(256, 1024)(rng), _f32(256, 1024)(rng)), {}), lambda a, kw, r, al: a[0] + a[1]),
    Case("sdk/average_pool2d_nki_kernels.py", "tensor_avgpool_kernel",
         lambda rng, r: ((np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6), 2), {}),
         lambda a, kw, r, al: ref_avgpool(*a), rtol=1e-3, atol=1e-2),
    Case("sdk/index-case-1.py", "tensor_split_kernel_",
         lambda rng, r: ((np.arange(4 * 5).reshape(4, 5).astype(BF16),), {}),
         lambda a, kw, r, al: (a[0][:, 0::2], a[0][:, 1::2])),
    Case("sdk/index-case-3.py", "tensor_maxpool_kernel_",
         lambda rng, r: ((np.arange(2 * 6 * 6).reshape(2, 6, 6).astype(BF16), 2), {}),
         lambda a, kw, r, al: ref_maxpool(*a)),
    Case("sdk/layout-pass.py", "tensor_exp_kernel_",
         lambda rng, r: ((rng.standard_normal((128, 512)).astype(BF16),), {}),
         lambda a, kw, r, al: np.exp(a[0].astype(np.float32)).astype(BF16), rtol=1e-2, atol=1e-2),
    Case("sdk/layout-violation.py", "tensor_exp_kernel_",
         lambda rng, r: ((np.ones((256, 512), BF16),), {}), None,
         expect_error=r"partition dimension 256 > 128"),
    Case("sdk/transpose2d_nki_kernels.py", "tensor_transpose2D_kernel_",
         lambda rng, r: ((np.arange(5 * 12, dtype=np.int8).reshape(5, 12), (3, 4)), {}),
         lambda a, kw, r, al: np.transpose(a[0].reshape(5, 3, 4), (0, 2, 1)).reshape(5, 12)),
    _matmul_case("nki_matmul_basic_", 128, 64, 512),
    _matmul_case("nki_matmul_tiled_", 256, 256, 1024),
    _matmul_case("nki_matmul_hoist_load_", 256, 256, 1024),
    _matmul_case("nki_matmul_block_free_dimension_", 256, 256, 2048),
    _matmul_case("nki_matmul_fully_optimized_", 4096, 2048, 2048),
    _mamba_case("mamba_v1"),
    _mamba_case("mamba_v2"),
    _mamba_case("mamba_v3"),
]

# Files that are documentation fragments, not runnable kernels (the SDK shows them as
# snippets): a syntax error on purpose, or a torch_neuronx import.
SDK_NOT_KERNELS = {"layout-dynamic-loop.py": "documentation fragment (does not parse)",
                   "layout-loop.py": "imports torch_neuronx (PyTorch integration, not a kernel file)"}

LIB = "lib/src/nkilib_src"


def _lib(path: str, kernel: str, inputs: Any, reference: Any, **kw: Any) -> Case:
    """A case of nki-library: ``path`` below nkilib/, imported as its package module."""
    module = "nkilib." + path[:-3].replace("/", ".")
    return Case(f"{LIB}/nkilib/{path}", kernel, inputs, reference, module=module, **kw)


def ref_conv1d(x, f, stride=1, dilation=1):
    k, cin, cout = f.shape
    L = x.shape[2]
    lout = (L - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], cout, lout), np.float64)
    for j in range(k):
        xs = x[:, :, j * dilation: j * dilation + stride * (lout - 1) + 1: stride].astype(np.float64)
        out += np.einsum("bcl,co->bol", xs, f[j].astype(np.float64))
    return out


def ref_depthwise(img, filt):
    n, c, _, w = img.shape
    s = filt.shape[3]
    q = w - s + 1
    out = np.zeros((n, c, 1, q), np.float64)
    for j in range(s):
        out[:, :, 0, :] += img[:, :, 0, j:j + q].astype(np.float64) * filt[None, :, 0, 0, j:j + 1].astype(np.float64)
    return out


def ref_rope(x, cos, sin):
    d = x.shape[0] // 2
    x1, x2 = x[:d].astype(np.float64), x[d:].astype(np.float64)
    c, s_ = cos.astype(np.float64)[:, :, None, :], sin.astype(np.float64)[:, :, None, :]
    return np.concatenate([x1 * c - x2 * s_, x2 * c + x1 * s_])


def ref_nonzero_with_count(x):
    nz = np.flatnonzero(x[0])
    out = np.full((1, x.shape[1] + 1), -1, np.int32)
    out[0, :nz.size] = nz
    out[0, -1] = nz.size
    return out


def ref_find_nonzero(x):
    t, c = x.shape
    idx = np.full((c, t), -1, np.int32)
    counts = np.zeros(c, np.int32)
    for j in range(c):
        nz = np.flatnonzero(x[:, j])
        idx[j, :nz.size] = nz
        counts[j] = nz.size
    return idx, counts


def ref_cross_entropy(logits, targets):
    z = logits.astype(np.float64)
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    return lse - z[np.arange(z.shape[0]), targets]


def _sparse_rows(rng: np.random.Generator, v: int, n: int, density: float = 0.3) -> np.ndarray:
    return (rng.random((n, v)) < density).astype(np.float32) * rng.integers(1, 5, (n, v)).astype(np.float32)


def _gathered(al: list, key: int = 0, axis: int = 0) -> np.ndarray:
    return np.concatenate([a[key] for a in al], axis=axis)


LIB_CASES: list[Case] = [
    _lib("core/cumsum/cumsum.py", "cumsum", lambda rng, r: ((_f32(64, 1000)(rng),), {}),
         lambda a, kw, r, al: np.cumsum(a[0].astype(np.float64), axis=-1), rtol=1e-3, atol=1e-3),
    _lib("core/max/cascaded_max.py", "cascaded_max", lambda rng, r: ((_f32(1, 1, 8192)(rng),), {}),
         lambda a, kw, r, al: (a[0].max(-1, keepdims=True), a[0].argmax(-1)[..., None])),
    _lib("core/embeddings/rope.py", "RoPE",
         lambda rng, r: ((_f32(64, 1, 2, 128)(rng), _f32(32, 1, 128)(rng), _f32(32, 1, 128)(rng)), {}),
         lambda a, kw, r, al: ref_rope(*a), rtol=1e-4, atol=1e-4),
    _lib("experimental/dynamic_shapes/dynamic_elementwise_add.py", "dynamic_elementwise_add",
         lambda rng, r: ((rng.standard_normal((256, 512)).astype(BF16), rng.standard_normal((256, 512)).astype(BF16),
                          np.array([[2]], np.int32)), {}),
         lambda a, kw, r, al: (a[0].astype(np.float32) + a[1].astype(np.float32)).astype(BF16), rtol=1e-2, atol=1e-2),
    _lib("experimental/conv/conv1d.py", "conv1d", lambda rng, r: ((_f32(1, 64, 128)(rng), _f32(3, 64, 32)(rng)), {}),
         lambda a, kw, r, al: ref_conv1d(*a), rtol=1e-3, atol=1e-3),
    _lib("experimental/conv/depthwise_conv1d.py", "depthwise_conv1d_implicit_gemm",
         lambda rng, r: ((_f32(1, 128, 1, 256)(rng), _f32(128, 1, 1, 3)(rng)), {"feature_group_count": 128}),
         lambda a, kw, r, al: ref_depthwise(*a), rtol=1e-3, atol=1e-3),
    _lib("experimental/benchmark/find_nonzero_indices_with_count.py", "find_nonzero_indices_with_count",
         lambda rng, r: ((_sparse_rows(rng, 512, 1),), {}), lambda a, kw, r, al: ref_nonzero_with_count(a[0])),
    _lib("core/subkernels/find_nonzero_indices.py", "find_nonzero_indices",
         lambda rng, r: ((_sparse_rows(rng, 16, 256),), {}), lambda a, kw, r, al: ref_find_nonzero(a[0])),
    _lib("experimental/loss/cross_entropy.py", "cross_entropy_forward",
         lambda rng, r: ((rng.standard_normal((64, 4096)).astype(np.float32), rng.integers(0, 4096, 64).astype(np.int32)),
                         {"positions_per_batch": 32, "chunk_size": 4096, "dtype": np.dtype(np.float32)}),
         lambda a, kw, r, al: ref_cross_entropy(*a), rtol=1e-3, atol=1e-3, lnc=2, post=lambda o: o[0]),
    _lib("experimental/collectives/fg_allgather.py", "fine_grained_allgather",
         lambda rng, r: ((rng.standard_normal((256, 256)).astype(BF16), 4, 1), {}),
         lambda a, kw, r, al: _gathered(al), ranks=4, lnc=2, post=lambda o: o.reshape(-1, o.shape[-1])),
    _lib("experimental/collectives/sb2sb_allgather.py", "allgather_sb2sb_tiled",
         lambda rng, r: ((rng.standard_normal((128, 128)).astype(BF16), _rg(4), 4), {}),
         lambda a, kw, r, al: _gathered(al, axis=1), ranks=4),
    _lib("experimental/collectives/sb2sb_allgather.py", "allgather_sb2sb",
         lambda rng, r: ((rng.standard_normal((128, 128)).astype(BF16), _rg(4), 4), {}),
         lambda a, kw, r, al: _gathered(al, axis=1), ranks=4),
]


def ref_rope_hf(q, k, cos, sin):
    def rot(x):
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    c, s_ = cos[:, None].astype(np.float64), sin[:, None].astype(np.float64)
    return tuple(x.astype(np.float64) * c + rot(x.astype(np.float64)) * s_ for x in (q, k))


def _topk_input(rng: np.random.Generator, t: int = 8, k: int = 2, h: int = 128, pad: int = 4) -> np.ndarray:
    rows = np.zeros((t * k + pad, h + 2), BF16)
    order = rng.permutation(t * k)
    vals = rng.integers(-4, 5, (t * k, h)).astype(np.float32)
    rows[:t * k, :h] = vals[order].astype(BF16)
    idx = np.repeat(np.arange(t, dtype=np.int32), k)[order]
    rows[:t * k, h:] = idx.view(np.uint16).reshape(-1, 2).view(BF16)
    rows[t * k:, h:] = np.full((pad,), -1, np.int32).view(np.uint16).reshape(-1, 2).view(BF16)
    return rows


def ref_topk_reduce(x, t, k):
    h = x.shape[1] - 2
    idx = x[:, h:].view(np.uint16).reshape(-1).view(np.int32)
    out = np.zeros((t, h), np.float64)
    for r, i in enumerate(idx):
        if 0 <= i < t:
            out[i] += x[r, :h].astype(np.float64)
    return out


def ref_ce_backward(logits, targets, scale):
    z = logits.astype(np.float64)
    p_ = np.exp(z - z.max(1, keepdims=True))
    p_ /= p_.sum(1, keepdims=True)
    p_[np.arange(z.shape[0]), targets] -= 1
    return p_ * scale


def _ce_bwd_inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
    logits = rng.standard_normal((64, 4096)).astype(np.float32)
    targets = rng.integers(0, 4096, 64).astype(np.int32)
    z = logits.astype(np.float64)
    lse = (np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)).astype(np.float32)
    return (logits, targets, lse), {"reduction": "mean", "positions_per_batch": 32, "chunk_size": 4096,
                                    "dtype": np.dtype(np.float32), "inplace": False}


LIB_CASES += [
    _lib("core/embeddings/rope_hf.py", "rope_hf",
         lambda rng, r: ((_f32(1, 2, 128, 64)(rng), _f32(1, 1, 128, 64)(rng), np.zeros((1, 2, 128, 64), np.float32),
                          np.zeros((1, 1, 128, 64), np.float32), _f32(1, 128, 64)(rng), _f32(1, 128, 64)(rng)), {}),
         lambda a, kw, r, al: ref_rope_hf(a[0], a[1], a[4], a[5]), rtol=1e-4, atol=1e-4),
    _lib("core/output_projection/output_projection_tkg.py", "output_projection_tkg",
         lambda rng, r: ((_f32(64, 2, 2, 1)(rng), _f32(128, 512)(rng)), {}),
         lambda a, kw, r, al: np.einsum("dbns,ndh->bsh", a[0].astype(np.float64),
                                        a[1].reshape(2, 64, 512).astype(np.float64)).reshape(2, 512),
         rtol=1e-3, atol=1e-3),
    _lib("core/output_projection/output_projection_cte/output_projection_cte.py", "output_projection_cte",
         lambda rng, r: ((_f32(1, 2, 64, 128)(rng), _f32(128, 512)(rng)), {}),
         lambda a, kw, r, al: np.einsum("bnds,ndh->bsh", a[0].astype(np.float64),
                                        a[1].reshape(2, 64, 512).astype(np.float64)), rtol=1e-3, atol=1e-3),
    _lib("experimental/loss/cross_entropy.py", "cross_entropy_backward", _ce_bwd_inputs,
         lambda a, kw, r, al: ref_ce_backward(a[0], a[1], 1.0 / a[0].shape[0]), rtol=1e-3, atol=1e-6, lnc=2),
    _lib("experimental/collectives/topk_reduce.py", "topk_reduce", lambda rng, r: ((_topk_input(rng), 8, 2), {}),
         lambda a, kw, r, al: ref_topk_reduce(*a), rtol=1e-2, atol=1e-2),
    _lib("experimental/collectives/fgcc.py", "allgather_compute_matmul",
         lambda rng, r: ((rng.integers(-2, 3, (128, 256)).astype(BF16), rng.integers(-2, 3, (256, 128)).astype(BF16),
                          4, 1), {}),
         lambda a, kw, r, al: _gathered(al).astype(np.float64) @ a[1].astype(np.float64), ranks=4, lnc=2,
         rtol=1e-2, atol=1e-2, post=lambda o: o.reshape(-1, o.shape[-1])),
]

def ref_attention(q, k, v, causal=True):
    """softmax(q k^T [causal]) v per batch; q (b, s, d), k (b, d, s), v (b, s, d)."""
    s_ = np.einsum("bqd,bdk->bqk", q.astype(np.float64), k.astype(np.float64))
    if causal:
        n = s_.shape[1]
        s_ = np.where(np.tril(np.ones((n, s_.shape[2]), bool)), s_, -np.inf)
    p_ = np.exp(s_ - s_.max(-1, keepdims=True))
    p_ /= p_.sum(-1, keepdims=True)
    return np.einsum("bqk,bkd->bqd", p_, v.astype(np.float64))


def _no_inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
    return (), {}


LIB_CASES += [
    _lib("core/attention/attention_cte.py", "attention_cte",
         lambda rng, r: ((rng.standard_normal((1, 256, 64)).astype(BF16), rng.standard_normal((1, 64, 256)).astype(BF16),
                          rng.standard_normal((1, 256, 64)).astype(BF16)), {"scale": 1.0}),
         lambda a, kw, r, al: ref_attention(*a), rtol=2e-2, atol=2e-2),
    # files that fail to import here: the case records the import error
    _lib("core/mlp/mlp.py", "mlp", _no_inputs, None),
    _lib("core/moe_block/moe_block_tkg.py", "moe_block_tkg", _no_inputs, None),
    _lib("core/topk/rotational_topk.py", "rotational_topk", _no_inputs, None),
    _lib("experimental/transformer/attention_block_tkg.py", "attention_block_tkg", _no_inputs, None),
]

def ref_indexed_flatten(x, f_len, output_len, row_offsets, padding_val=-1):
    e, t = x.shape
    blocks = np.full((output_len // f_len, f_len), padding_val, dtype=x.dtype)
    parts = x.reshape(e, t // f_len, f_len)
    for r in range(e):
        for j in range(t // f_len):
            b = int(row_offsets[r]) + j
            if 0 <= b < blocks.shape[0]:
                blocks[b] = parts[r, j]
    return blocks.reshape(-1)


def _flatten_inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
    e, t, f = 4, 512, 32
    x = rng.integers(0, 100, (e, t)).astype(np.int32)
    offsets = (np.arange(e) * (t // f) + np.array([0, 1, 3, 4])).astype(np.int32)  # gaps stay padding
    return (x, f, e * t + 8 * f, offsets), {}


LIB_CASES.append(_lib("core/subkernels/indexed_flatten.py", "indexed_flatten", _flatten_inputs,
                      lambda a, kw, r, al: ref_indexed_flatten(*a), lnc=2))

def _moe_inputs(block: int) -> Callable[[np.random.Generator, int], tuple[tuple, dict]]:
    """Top-1 routed tokens in blocks of ``block`` per expert (padding token id T, zero row)."""
    def make(rng: np.random.Generator, r: int, t: int = 256, h: int = 512, e: int = 4, i: int = 512):
        x = np.zeros((t + 1, h), np.float32)
        x[:t] = rng.standard_normal((t, h)) * 0.5
        expert = rng.integers(0, e, t)
        aff = np.zeros((t + 1, e), np.float32)
        aff[np.arange(t), expert] = rng.uniform(0.5, 1, t)
        pos, b2e = [], []
        for k in range(e):
            toks = list(np.flatnonzero(expert == k))
            for b0 in range(0, max(len(toks), 1), block):
                blk = toks[b0:b0 + block]
                pos += blk + [t] * (block - len(blk))
                b2e.append(k)
        wg = rng.standard_normal((e, h, 2, i)) * 0.05
        wd = rng.standard_normal((e, i, h)) * 0.05
        return (x.astype(BF16), aff.reshape(-1, 1).astype(BF16), wg.astype(BF16), wd.astype(BF16), block,
                np.array(pos, np.int32), np.array(b2e, np.int32).reshape(-1, 1)), {}
    return make


def ref_moe(x, aff, wg, wd, block, pos, b2e):
    """out[t] = affinity * (silu(x Wg) * (x Wu)) Wd of the token's expert (affinity after the MLP)."""
    x, wg, wd = x.astype(np.float64), wg.astype(np.float64), wd.astype(np.float64)
    e = wg.shape[0]
    a = aff.astype(np.float64).reshape(-1, e)
    t = x.shape[0] - 1
    out = np.zeros((t, x.shape[1]))
    for tok in range(t):
        k = int(np.argmax(a[tok]))
        g, u = x[tok] @ wg[k, :, 0], x[tok] @ wg[k, :, 1]
        out[tok] = a[tok, k] * ((g / (1 + np.exp(-g))) * u) @ wd[k]
    return out


def _moe_out(o: Any) -> np.ndarray:
    o = np.asarray(o[0] if isinstance(o, (tuple, list)) else o).astype(np.float64)
    return (o.sum(1) if o.ndim == 3 else o)[:-1]  # shard partials summed; padding row dropped


def _post_scale(make: Any) -> Any:
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        args, _ = make(rng, r)
        return args, {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


def _hybrid(make: Any) -> Any:
    """The hybrid kernel's inputs: conditions [N+1] (1: a block with tokens, last 0) first."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        args, _ = make(rng, r)
        pos, t = args[5].reshape(-1, args[4]), args[0].shape[0] - 1
        cond = np.concatenate([(pos != t).any(1), [False]]).astype(np.int32)
        return (cond,) + args, {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


def _moe_cte(make: Any) -> Any:
    """moe_cte's order (token_position_to_id, block_to_expert, block_size, spec): shard_on_block."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation, MoECTESpec
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        (x, aff, wg, wd, block, pos, b2e), _ = make(rng, r)
        return (x, aff, wg, wd, pos, b2e, block, MoECTESpec(implementation=MoECTEImplementation.shard_on_block)), \
            {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


LIB_CASES += [
    _lib("core/moe/moe_cte/moe_cte.py", "moe_cte", _moe_cte(_moe_inputs(128)),
         lambda a, kw, r, al: ref_moe(a[0], a[1], a[2], a[3], a[6], a[4], a[5]), lnc=2, rtol=2e-2, atol=1e-2,
         post=_moe_out),
    _lib("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_baseline_shard_intermediate_hybrid",
         _hybrid(_moe_inputs(256)), lambda a, kw, r, al: ref_moe(*a[1:]), lnc=2, rtol=2e-2, atol=1e-2,
         post=_moe_out),
    _lib("core/moe/moe_cte/bwmm_shard_on_block.py", "bwmm_shard_on_block", _moe_inputs(128),
         lambda a, kw, r, al: ref_moe(*a), lnc=2, rtol=2e-2, atol=1e-2, post=_moe_out),
    _lib("experimental/moe/forward/bwmm_shard_on_H.py", "blockwise_mm_baseline_shard_hidden", _moe_inputs(128),
         lambda a, kw, r, al: ref_moe(*a), lnc=2, rtol=2e-2, atol=1e-2, post=_moe_out),
    _lib("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_baseline_shard_intermediate",
         _post_scale(_moe_inputs(256)), lambda a, kw, r, al: ref_moe(*a), lnc=2, rtol=2e-2, atol=1e-2,
         post=_moe_out),
]

def _dropping_inputs(rng: np.random.Generator, r: int, t: int = 2176, h: int = 512, e: int = 2, i: int = 256,
                     block: int = 1024) -> tuple[tuple, dict]:
    """The dropping layer's layout: block k holds expert k's tokens (up to ``block``; the rest are
    dropped), padding token id T."""
    from nkilib.core.utils.common_types import ExpertAffinityScaleMode
    (x, aff, wg, wd, _, _, _), _ = _moe_inputs(block)(rng, r, t, h, e, i)
    a = aff.astype(np.float32).reshape(t + 1, e)
    pos = np.full((e, block), t, np.int32)
    for k in range(e):
        toks = np.flatnonzero(a[:t, k])[:block]
        pos[k, :toks.size] = toks
    return (x, aff, wg, wd, block, pos.reshape(-1), np.arange(e, dtype=np.int32).reshape(-1, 1)), \
        {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}


def ref_moe_dropping(x, aff, wg, wd, block, pos, b2e):
    """ref_moe for the tokens that got a slot in their expert's block; dropped tokens give zero."""
    out = ref_moe(x, aff, wg, wd, block, pos, b2e)
    kept = np.zeros(out.shape[0], bool)
    kept[pos[pos < out.shape[0]]] = True
    return np.where(kept[:, None], out, 0.0)


LIB_CASES.append(_lib("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_shard_intermediate_dropping",
                      _dropping_inputs, lambda a, kw, r, al: ref_moe_dropping(*a), lnc=2, rtol=2e-2, atol=1e-2,
                      post=_moe_out))

def _rmsnorm_quant_inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
    from nkilib.core.rmsnorm.rmsnorm_quant import RmsNormQuantKernelArgs
    hidden = (rng.standard_normal((2, 96, 512)) * rng.uniform(0.1, 4, (2, 96, 1))).astype(BF16)
    gamma = rng.uniform(0.5, 1.5, (1, 512)).astype(BF16)
    return (hidden, gamma, RmsNormQuantKernelArgs()), {}


def ref_rmsnorm_quant(hidden, gamma, eps=1e-6, fp8_max=240.0):
    """y = x / sqrt(mean(x^2) + eps) * gamma per row; the row's dequantization scale is
    max|y| / fp8_max (at least 1e-6), the FP8 data y / scale."""
    x = hidden.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma.astype(np.float64).reshape(-1)
    scale = np.maximum(np.abs(y).max(-1, keepdims=True) / fp8_max, 1e-6)
    return y, scale


def _rmsnorm_quant_out(o: Any) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's [B, S, H+4] FP8 rows: H data values, then the FP32 scale in 4 bytes."""
    o = np.asarray(o)
    h = o.shape[-1] - 4
    scale = np.ascontiguousarray(o[..., h:]).view(np.uint8).view(np.float32).astype(np.float64)
    return o[..., :h].astype(np.float64) * scale, scale


# FP8 E4M3 keeps 3 mantissa bits: a value is within 1/16 of itself after rounding
LIB_CASES.append(_lib("core/rmsnorm/rmsnorm_quant.py", "rmsnorm_quant_kernel", _rmsnorm_quant_inputs,
                      lambda a, kw, r, al: ref_rmsnorm_quant(a[0], a[1]), rtol=1 / 32, atol=1e-6,
                      post=_rmsnorm_quant_out))

def _attn_fwd(q, k, v, causal, scale):
    """Forward attention in the kernel's [d, seq] layout: P [b, h, sq, sk], O [b, h, d, sq], lse [b, h, sq]."""
    hq, hk = q.shape[1], k.shape[1]
    k, v = np.repeat(k, hq // hk, axis=1), np.repeat(v, hq // hk, axis=1)  # GQA: each KV head serves hq/hk heads
    s_ = scale * np.einsum("bhdi,bhdj->bhij", q, k)
    if causal:
        s_ = np.where(np.tril(np.ones(s_.shape[-2:], bool)), s_, -np.inf)
    m = s_.max(-1, keepdims=True)
    lse = np.log(np.exp(s_ - m).sum(-1, keepdims=True)) + m
    p_ = np.exp(s_ - lse)
    return p_, np.einsum("bhij,bhdj->bhdi", p_, v), lse[..., 0], k, v


def _attn_bwd_inputs(rng: np.random.Generator, r: int, b: int = 1, hq: int = 2, hk: int = 1, d: int = 64,
                     n: int = 256) -> tuple[tuple, dict]:
    q, k, v, dy = (rng.standard_normal(sh).astype(BF16) for sh in ((b, hq, d, n), (b, hk, d, n), (b, hk, d, n),
                                                                    (b, hq, d, n)))
    f = [a.astype(np.float64) for a in (q, k, v)]
    _, o, lse, _, _ = _attn_fwd(*f, True, 1 / np.sqrt(d))
    # lse[b, h, p, t] belongs to query t * 128 + p (the kernel's tile layout, per its docstring)
    lse_t = lse.reshape(b, hq, n // 128, 128).transpose(0, 1, 3, 2).astype(np.float32)
    return (q, k, v, o.astype(BF16), dy, lse_t), {"use_causal_mask": True}


def ref_attention_bwd(q, k, v, o, dy, lse, **kw):
    """Gradients of O = softmax(scale q^T k, causal) v^T: dV = P^T dY, dS = P (dP - rowsum(dY o)),
    dQ = scale dS K, dK = scale dS^T Q; a KV head's gradient sums over the query heads it serves."""
    q, k, v, dy = (a.astype(np.float64) for a in (q, k, v, dy))
    scale = 1 / np.sqrt(q.shape[2])
    p_, o64, _, ke, ve = _attn_fwd(q, k, v, True, scale)
    dv = np.einsum("bhij,bhdi->bhdj", p_, dy)
    dp = np.einsum("bhdi,bhdj->bhij", dy, ve)
    ds = p_ * (dp - (dy * o64).sum(2)[..., None])
    dq = scale * np.einsum("bhij,bhdj->bhdi", ds, ke)
    dk = scale * np.einsum("bhij,bhdi->bhdj", ds, q)
    g = q.shape[1] // k.shape[1]
    fold = lambda x: x.reshape(x.shape[0], k.shape[1], g, *x.shape[2:]).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


LIB_CASES.append(_lib("core/attention/attention_bwd.py", "attention_bwd", _attn_bwd_inputs,
                      lambda a, kw, r, al: ref_attention_bwd(*a), rtol=3e-2, atol=3e-2,
                      post=lambda o: tuple(o[:3])))

def ref_mx_swizzled_quantize(t):
    """The MX quantization of a BF16 [128, K] tensor as the mxfp load documents it: per 512-column
    block b, partition c and x4 element i hold t[i, 512 b + 4 c + j] (j = 0..3); one scale per 8
    partitions x one x4 element, 2 ** (floor(log2 amax) - 8 + 1) (twice the OCP sample scale, E4M3FN
    emax 8, per "nki.isa.quantize_mx"); the data t / scale in FP8 E4M3FN."""
    m, k = t.shape
    x = t.astype(np.float32).reshape(m, k // 512, 128, 4).transpose(2, 1, 0, 3)  # [c, b, i, j]
    amax = np.abs(x.reshape(16, 8, k // 512, m, 4)).max(axis=(1, 4))  # [c // 8, b, i]
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 7, -127)
    q = (x / np.exp2(e).repeat(8, axis=0)[..., None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale_rows = (e + 127).astype(np.int64).reshape(16, -1)
    return q.reshape(128, -1), scale_rows


def _mx_data_scales(o: Any) -> tuple[np.ndarray, np.ndarray]:
    """(FP8 values [128, 4F] of the x4 data, the scale rows at partitions 32 q + g, g < 4)."""
    data, scale = o
    vals = np.ascontiguousarray(np.asarray(data)).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    rows = [32 * q + g for q in range(4) for g in range(4)]
    return vals.reshape(128, -1), np.asarray(scale)[rows].astype(np.int64)


LIB_CASES.append(_lib("experimental/mxfp_subkernels/mxfp_load_utils.py", "mxfp_load_performance_wrapper",
                      lambda rng, r: ((rng.standard_normal((128, 1024)).astype(BF16)
                                       * np.exp2(rng.integers(-8, 8, (128, 1))).astype(BF16),), {}),
                      lambda a, kw, r, al: ref_mx_swizzled_quantize(a[0]), rtol=0, atol=0, post=_mx_data_scales))


def _silu(z: np.ndarray) -> np.ndarray:
    return z / (1 + np.exp(-z))


def _moe_bwd_inputs(rng: np.random.Generator, r: int, t: int = 512, h: int = 256, i: int = 256, e: int = 2,
                    block: int = 256) -> tuple[tuple, dict]:
    """Top-1 routing, every block full (the dropless layout without skipped tokens); the
    checkpoints are the forward pass's gate/up projections (transposed, [N, 2, I, B]) and
    down projection (before the affinity, [N, B, H]), computed here in float64."""
    x = (rng.standard_normal((t, h)) * 0.5).astype(BF16)
    wg = (rng.standard_normal((e, h, 2, i)) * 0.05).astype(BF16)
    wd = (rng.standard_normal((e, i, h)) * 0.05).astype(BF16)
    n = t // block
    # the kernel zeroes the affinity gradient [T * E] in halves (program p the p-th half, with
    # no barrier before the first block) and program p handles the p-th 128-row tile of each
    # block: tile p of every block takes tokens of the p-th half, so each program writes only
    # gradients it zeroed itself (any token order within a block is a valid routing)
    half, tile = t // 2, 128
    lo, hi = rng.permutation(half), half + rng.permutation(half)
    pos = np.concatenate([np.concatenate([lo[b * tile:(b + 1) * tile], hi[b * tile:(b + 1) * tile]])
                          for b in range(t // block)]).astype(np.int32)
    b2e = rng.integers(0, e, n).astype(np.int32)
    aff = np.zeros((t, e), np.float32)
    for b in range(n):
        aff[pos[b * block:(b + 1) * block], b2e[b]] = rng.uniform(0.5, 1, block)
    gu_t = np.zeros((n, 2, i, block))
    down = np.zeros((n, block, h))
    for b in range(n):
        xb = x[pos[b * block:(b + 1) * block]].astype(np.float64)
        gu = np.einsum("bh,hki->bki", xb, wg[b2e[b]].astype(np.float64))
        gu_t[b] = gu.transpose(1, 2, 0)
        down[b] = (_silu(gu[:, 0]) * gu[:, 1]) @ wd[b2e[b]].astype(np.float64)
    dy = rng.standard_normal((t, h)).astype(BF16)
    return (x, aff.reshape(-1, 1).astype(BF16), wg, wd, gu_t.astype(BF16), down.astype(BF16), pos,
            b2e.reshape(-1, 1), dy, block), {}


def ref_moe_bwd(x, aff, wg, wd, gu_t, down, pos, b2e, dy, block):
    """Gradients of y[t] = a[t, e] * z, z = (silu(g) * u) Wd[e], g, u = x Wg[e], x Wu[e] (the
    affinity on the H side): dz = a dy; da = sum_h dy z; dWd = act^T dz with act = silu(g) u;
    d_act = dz Wd^T; dg = d_act u silu'(g), du = d_act silu(g); dWg, dWu = x^T dg, x^T du;
    dx = dg Wg^T + du Wu^T. The gate/up values are the checkpoint's (as the kernel reads them)."""
    x, wg, wd, dy = (a.astype(np.float64) for a in (x, wg, wd, dy))
    e = wg.shape[0]
    a = aff.astype(np.float64).reshape(-1, e)
    dx, da, dwg, dwd = np.zeros_like(x), np.zeros_like(a), np.zeros_like(wg), np.zeros_like(wd)
    for b in range(len(b2e)):
        k, toks = int(b2e[b, 0]), pos[b * block:(b + 1) * block]
        g, u = (gu_t[b, j].astype(np.float64).T for j in (0, 1))
        dz = a[toks, k:k + 1] * dy[toks]
        da[toks, k] += (dy[toks] * down[b].astype(np.float64)).sum(1)
        sg = 1 / (1 + np.exp(-g))
        act = g * sg * u
        dwd[k] += act.T @ dz
        d_act = dz @ wd[k].T
        dg = d_act * u * sg * (1 + g * (1 - sg))
        du = d_act * g * sg
        dwg[k, :, 0] += x[toks].T @ dg
        dwg[k, :, 1] += x[toks].T @ du
        dx[toks] += dg @ wg[k, :, 0].T + du @ wg[k, :, 1].T
    return dx, da.reshape(-1, 1), dwg, dwd


# BF16 operands, the kernel's intermediate gradients stored in BF16 (8 significant bits)
# between the stages: 2% of the tensor's scale
LIB_CASES.append(_lib("experimental/moe/bwd/blockwise_mm_backward.py", "blockwise_mm_bwd", _moe_bwd_inputs,
                      lambda a, kw, r, al: ref_moe_bwd(*a), lnc=2, rtol=2e-2, atol=1e-3,
                      post=lambda o: tuple(o[:4])))

# --- MX (microscaling) operands, from the NKI reference pages "nki.isa.nc_matmul_mx" and
# "nki.isa.quantize_mx": an x4 element packs 4 values (FP8: byte j of a little-endian 32-bit
# container; FP4 E2M1: nibble j of 16 bits); a scale (uint8, 2 ** (byte - 127)) serves 8
# partitions x the 4 values of one x4 element and sits on partition 32 q + g of the scale
# tile for data partitions 32 q + 8 g .. + 8 (the leading 4 partitions of each quadrant);
# HBM keeps the 16 scale rows compactly (row 4 q + g).
_E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])  # OCP MX E2M1


def _x4(kind: str) -> np.dtype:
    import nki.language as nl  # the simulator's, after install()
    return {"fp8": nl.float8_e4m3fn_x4, "fp4": nl.float4_e2m1fn_x4}[kind]


def _mx_random(rng: np.random.Generator, shape: tuple, kind: str = "fp8") -> tuple[np.ndarray, np.ndarray]:
    """Random x4 data of ``shape`` and its float64 values, ``shape + (4,)``."""
    if kind == "fp4":
        nib = rng.integers(0, 16, shape + (4,)).astype(np.uint16)
        raw = (nib << (4 * np.arange(4, dtype=np.uint16))).sum(-1).astype(np.uint16)
        return raw.view(_x4(kind)), _E2M1_VALUES[nib]
    v = rng.standard_normal(shape + (4,)).astype(ml_dtypes.float8_e4m3fn)
    raw = np.ascontiguousarray(v).view(np.uint8).view("<u4").reshape(shape)
    return raw.view(_x4(kind)), v.astype(np.float64)


def _scale_of_partition(scale_rows: np.ndarray) -> np.ndarray:
    """[16, ...] compact scale bytes -> [128, ...] the factor of each data partition."""
    p = np.arange(128)
    return np.exp2(scale_rows.astype(np.float64) - 127)[4 * (p // 32) + (p % 32) // 8]


def _scale_tile(rows: np.ndarray) -> np.ndarray:
    """[16, ...] compact scale rows -> the [128, ...] SBUF tile (rows 32 q + g, others 0)."""
    tile = np.zeros((128,) + rows.shape[1:], np.uint8)
    for q in range(4):
        tile[32 * q:32 * q + 4] = rows[4 * q:4 * q + 4]
    return tile


def _rows16(tile: Any) -> np.ndarray:
    tile = np.asarray(tile)
    return np.concatenate([tile[32 * q:32 * q + 4] for q in range(4)])


def _x4_values(data: np.ndarray) -> np.ndarray:
    """float64 values [..., 4] of x4 data (FP8 E4M3FN bytes or FP4 E2M1 nibbles)."""
    if data.dtype.names[0].startswith("float4"):
        bits = np.ascontiguousarray(data).view(np.uint16)
        return _E2M1_VALUES[(bits[..., None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF]
    bits = np.ascontiguousarray(data).view("<u4")
    return bits[..., None].view(np.uint8).reshape(bits.shape + (4,)).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _mx_deq(data: Any, scale16: Any) -> np.ndarray:
    """float64 values [128, ..., 4] of a kernel's x4 tile with its 16 compact scale rows."""
    return _x4_values(np.asarray(data)) * _scale_of_partition(np.asarray(scale16))[..., None]


def _raw(a: Any) -> np.ndarray:
    """The bits of an array (x4 containers as unsigned integers), for exact comparisons."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(a.dtype[0]) if a.dtype.names else a


def _to_hbm(t: Any) -> Any:
    import nki.isa as nisa
    import nki.language as nl
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _to_sbuf(t: Any) -> Any:
    import nki.isa as nisa
    import nki.language as nl
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=t)
    return out


def _scale_to_hbm(t: Any) -> Any:
    """A [128, ...] SBUF scale tile's 16 used rows (32 q + g, g < 4) to HBM [16, ...]."""
    import nki.isa as nisa
    import nki.language as nl
    out = nl.ndarray((16,) + tuple(t.shape[1:]), dtype=t.dtype, buffer=nl.shared_hbm)
    for q in range(4):
        nisa.dma_copy(dst=out[4 * q:4 * q + 4], src=t[32 * q:32 * q + 4])
    return out


def _wrap_load_gate_up(kernel: Any) -> Any:
    """HBM weight / scale / bias in, the SBUF weight, scale (used rows) and bias out; the
    weight goes in as an nkilib TensorView, as the MoE TKG layer passes it."""
    import nki
    from nkilib.core.utils.tensor_view import TensorView

    @nki.jit
    def load_gate_up_wrapper(weight, scale, bias, expert_idx, gate_or_up_idx, H, n_tiles, I_local, I_offset):
        w, sc, b = kernel(TensorView(weight), scale, bias, expert_idx=expert_idx, gate_or_up_idx=gate_or_up_idx,
                          H=H, n_I512_tiles_local=n_tiles, I_local=I_local, I_offset=I_offset)
        return _to_hbm(w), _scale_to_hbm(sc), _to_hbm(b)
    return load_gate_up_wrapper


def _load_gate_up_inputs(rng: np.random.Generator, r: int, e: int = 2, h: int = 1024, i: int = 1024):
    w, _ = _mx_random(rng, (e, 128, 2, h // 512, i), "fp4")
    scale = rng.integers(120, 135, (e, 16, 2, h // 512, i)).astype(np.uint8)
    bias = rng.standard_normal((e, 128, 2, i // 512, 4)).astype(BF16)
    # the second of two I-shards: tiles [1, 2) of I / 512
    return (w, scale, bias), {"expert_idx": 1, "gate_or_up_idx": 1, "H": h, "n_tiles": 1, "I_local": 512,
                              "I_offset": 512}


def ref_load_gate_up(w, scale, bias, expert_idx, gate_or_up_idx, H, n_tiles, I_local, I_offset):
    """The docstring's slices: weight[e, :, g, :, I_offset:+I_local] ([128_H, H/512, I_local]),
    its 16 scale rows likewise, bias[e, :, g, I_offset/512 :+n_tiles, :]."""
    sl = slice(I_offset, I_offset + I_local)
    t0 = I_offset // 512
    return (_raw(w[expert_idx, :, gate_or_up_idx, :, sl]), scale[expert_idx, :, gate_or_up_idx, :, sl],
            bias[expert_idx, :, gate_or_up_idx, t0:t0 + n_tiles, :])


def _wrap_load_down(kernel: Any) -> Any:
    import nki
    from nkilib.core.utils.tensor_view import TensorView

    @nki.jit
    def load_down_wrapper(weight, scale, bias, expert_idx, H, n_tiles, tile_offset, tile_T, use_pe):
        w, sc, b = kernel(TensorView(weight), scale, bias, expert_idx=expert_idx, H=H, tile_I=128,
                          n_I512_tiles=n_tiles, tile_offset=tile_offset, tile_T=tile_T, use_PE_bias_broadcast=use_pe)
        return _to_hbm(w), _scale_to_hbm(sc), _to_hbm(b)
    return load_down_wrapper


def _load_down_inputs(use_pe: bool) -> Callable[[np.random.Generator, int], tuple[tuple, dict]]:
    def make(rng: np.random.Generator, r: int, e: int = 2, i: int = 1024, h: int = 1024):
        w, _ = _mx_random(rng, (e, 128, i // 512, h), "fp8")
        scale = rng.integers(120, 135, (e, 16, i // 512, h)).astype(np.uint8)
        bias = rng.standard_normal((e, h)).astype(BF16)
        return (w, scale, bias), {"expert_idx": 1, "H": h, "n_tiles": 1, "tile_offset": 1, "tile_T": 8,
                                  "use_pe": use_pe}
    return make


def ref_load_down(w, scale, bias, expert_idx, H, n_tiles, tile_offset, tile_T, use_pe):
    """weight[e, :, tile_offset:+n_tiles, :], its 16 scale rows, the expert's bias row
    broadcast to tile_T partitions (LNC 1: the whole H)."""
    sl = slice(tile_offset, tile_offset + n_tiles)
    return (_raw(w[expert_idx, :, sl]), scale[expert_idx, :, sl],
            np.broadcast_to(bias[expert_idx], (tile_T, H)))


def _raw_outputs(o: Any) -> tuple:
    return tuple(_raw(x) for x in o)


# data movement only: bit-exact (the PE broadcast multiplies BF16 bias values by 1.0 in FP32)
LIB_CASES += [
    _lib("core/moe/moe_tkg/gate_up_projection_mx.py", "load_gate_up_weight_scale_bias", _load_gate_up_inputs,
         lambda a, kw, r, al: ref_load_gate_up(*a, **kw), rtol=0, atol=0, wrap=_wrap_load_gate_up,
         post=_raw_outputs),
    _lib("core/moe/moe_tkg/down_projection_mx.py", "load_broadcast_down_weight_scale_bias", _load_down_inputs(True),
         lambda a, kw, r, al: ref_load_down(*a, **kw), rtol=0, atol=0, wrap=_wrap_load_down,
         post=_raw_outputs),
]

def _mx_operand(rng: np.random.Generator, shape: tuple, kind: str,
                exp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x4 data [128, ...], its [128, ...] SBUF scale tile, float64 values [128, ..., 4]):
    scale exponents exp - 1 .. exp + 1."""
    data, vals = _mx_random(rng, shape, kind)
    rows = rng.integers(127 + exp - 1, 127 + exp + 2, (16,) + shape[1:]).astype(np.uint8)
    return data, _scale_tile(rows), vals * _scale_of_partition(rows)[..., None]


def _wrap_gate_up_mx(kernel: Any) -> Any:
    import nki
    from nkilib.core.utils.common_types import ActFnType

    @nki.jit
    def gate_up_mx_wrapper(xq, xs, wg, wu, wgs, wus, bg, bu):
        q, sc = kernel(*(_to_sbuf(t) for t in (xq, xs, wg, wu, wgs, wus, bg, bu)), hidden_act_fn=ActFnType.SiLU)
        return _to_hbm(q), _scale_to_hbm(sc)
    return gate_up_mx_wrapper


def _gate_up_mx_inputs(rng: np.random.Generator, r: int, h: int = 1024, i: int = 1024, t: int = 8):
    xq, xs, _ = _mx_operand(rng, (128, h // 512, t), "fp8", 0)
    wg, wgs, _ = _mx_operand(rng, (128, h // 512, i), "fp4", -6)
    wu, wus, _ = _mx_operand(rng, (128, h // 512, i), "fp4", -6)
    bg, bu = (rng.standard_normal((128, i // 512, 4)).astype(BF16) for _ in range(2))
    return (xq, xs, wg, wu, wgs, wus, bg, bu), {}


def ref_gate_up_mx(xq, xs, wg, wu, wgs, wus, bg, bu):
    """silu(W_g^T x + b_g) * (W_u^T x + b_u) with the MX operands dequantized: the contraction
    runs over H = (partition, H/512 tile, x4 value); weight column c of I/512 tile k is
    I index 512 k + c, output partition c % 128, x4 value c // 128 (the "[16_I * 8_I, I/512,
    T], 4_I packed" layout of the docstring; the bias likewise). Output [128, I/512, T, 4]."""
    x = _mx_deq(xq, _rows16(xs))  # [128, H/512, T, 4]
    out = []
    for w, ws, b in ((wg, wgs, bg), (wu, wus, bu)):
        wv = _mx_deq(w, _rows16(ws))  # [128, H/512, I, 4]
        y = np.einsum("phcj,phtj->ct", wv, x)  # [I, T]
        k = y.shape[0] // 512
        y = y.reshape(k, 4, 128, -1).transpose(2, 0, 3, 1)  # [128, I/512, T, 4]
        out.append(y + b.astype(np.float64)[:, :, None, :])
    g, u = out
    return g / (1 + np.exp(-g)) * u


def _gate_up_mx_out(o: Any) -> np.ndarray:
    return _mx_deq(o[0], o[1])


# the output is MXFP8 E4M3 (3 mantissa bits: rounding within 1/16 of a value; values far
# below their group's largest lose more, bounded by the 1/16 of the tensor's scale the
# comparison adds); BF16 PSUM and activation add ~1/256
LIB_CASES.append(_lib("core/moe/moe_tkg/gate_up_projection_mx.py", "gate_up_projection_mx_shard_I",
                      _gate_up_mx_inputs, lambda a, kw, r, al: ref_gate_up_mx(*a), rtol=1 / 16, atol=0,
                      wrap=_wrap_gate_up_mx, post=_gate_up_mx_out))

def _wrap_down_mx(kernel: Any) -> Any:
    """The SBUF operands in, out_sb allocated here, the result through the kernel's HBM spill
    (out_hbm); one expert, first and last."""
    import nki
    import nki.language as nl

    @nki.jit
    def down_mx_wrapper(act, act_scale, w, w_scale, bias, aff, expert_idx):
        t, h = act.shape[2], w.shape[2]
        out_sb = nl.ndarray((t, 1, h), dtype=nl.bfloat16, buffer=nl.sbuf)
        out_hbm = nl.ndarray((t, h), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        kernel(*(_to_sbuf(x) for x in (act, act_scale, w, w_scale, bias, aff)), expert_idx=expert_idx, out_sb=out_sb,
               out_hbm=out_hbm, is_first_expert=True, is_last_expert=True)
        return out_hbm
    return down_mx_wrapper


def _down_mx_inputs(rng: np.random.Generator, r: int, i: int = 1024, h: int = 1024, t: int = 8, e: int = 2):
    act, act_s, _ = _mx_operand(rng, (128, i // 512, t), "fp8", 0)
    w, ws, _ = _mx_operand(rng, (128, i // 512, h), "fp4", -6)
    # the bias as load_broadcast_down_weight_scale_bias leaves it: one row on each of T partitions
    bias = np.broadcast_to(rng.standard_normal((1, h)), (t, h)).astype(BF16)
    aff = rng.uniform(0, 1, (t, e)).astype(BF16)
    return (act, act_s, w, ws, bias, aff), {"expert_idx": 1}


def ref_down_mx(act, act_s, w, ws, bias, aff, expert_idx):
    """out[t, h] = affinity[t, e] * (sum over I of act[i, t] W[i, h] + bias[h]), I = (partition,
    I/512 tile, x4 value) of both MX operands."""
    a = _mx_deq(act, _rows16(act_s))  # [128, I/512, T, 4]
    wv = _mx_deq(w, _rows16(ws))  # [128, I/512, H, 4]
    y = np.einsum("pktj,pkhj->th", a, wv) + bias.astype(np.float64)
    return aff.astype(np.float64)[:, expert_idx:expert_idx + 1] * y


# BF16 PSUM accumulating the I tiles, BF16 bias add, affinity scaling and output (8
# significant bits, a few roundings): 2% of the tensor's scale
LIB_CASES.append(_lib("core/moe/moe_tkg/down_projection_mx.py", "down_projection_mx", _down_mx_inputs,
                      lambda a, kw, r, al: ref_down_mx(*a, **kw), rtol=2e-2, atol=0, wrap=_wrap_down_mx))

def _mx_weights_dense(gw, gs, dw, ds_):
    """The dense float64 weights of the CTE MX layouts: gate/up [E, 128, 2, H/512, I] x4
    (4_H packed: partition p, H/512 tile k, x4 value j hold H index j * H/4 + 128 k + p, H
    folded 4x as the kernels' docstrings describe) with scales [E, 16, 2, H/512, I]; down
    [E, 128, I/512, H] x4 (4_I packed: I index 512 k + 128 j + p) with scales
    [E, 16, I/512, H]; scale row 4 (p // 32) + (p % 32) // 8 serves data partition p.
    Returns wg [E, H, 2, I], wd [E, I, H]."""
    p_ = np.arange(128)
    row = 4 * (p_ // 32) + (p_ % 32) // 8
    g64 = _x4_values(gw) * np.exp2(gs[:, row].astype(np.float64) - 127)[..., None]  # [E, 128, 2, K, I, 4]
    e, _, _, k, i, _ = g64.shape
    wg = g64.transpose(0, 5, 3, 1, 2, 4).reshape(e, 512 * k, 2, i)
    d64 = _x4_values(dw) * np.exp2(ds_[:, row].astype(np.float64) - 127)[..., None]  # [E, 128, I/512, H, 4]
    wd = d64.transpose(0, 2, 4, 1, 3).reshape(e, i, d64.shape[3])
    return wg, wd


def _moe_mx_inputs(block: int = 256, h: int = 512, i: int = 1024, e: int = 4, kind: str = "fp4") -> Any:
    """_moe_inputs' routing and hidden states with random MX weights (scales 2 ** -8 .. 2 ** -6)."""
    def make(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        (x, aff, _, _, _, pos, b2e), _ = _moe_inputs(block)(rng, r, h=h, e=e, i=i)
        gw, _ = _mx_random(rng, (e, 128, 2, h // 512, i), kind)
        gs = rng.integers(127 - 8, 127 - 5, (e, 16, 2, h // 512, i)).astype(np.uint8)
        dw, _ = _mx_random(rng, (e, 128, i // 512, h), kind)
        ds_ = rng.integers(127 - 8, 127 - 5, (e, 16, i // 512, h)).astype(np.uint8)
        bgu = (rng.standard_normal((e, 128, 2, i // 512, 4)) * 0.1).astype(BF16)
        # a zero down-projection bias: the shard-on-I kernels add it on both I-shards before
        # summing their partial products (so a nonzero bias counts twice), although
        # down_projection_mx_shard_I's docstring says program 0 alone adds it
        bd = np.zeros((e, h), BF16)
        return (x, aff, gw, dw, pos, b2e), {
            "gate_and_up_proj_bias": bgu, "down_proj_bias": bd,
            "gate_up_proj_scale": gs, "down_proj_scale": ds_, "block_size": block,
            "expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return make


def ref_moe_mx(x, aff, gw, dw, pos, b2e, gate_up_proj_scale, down_proj_scale, block_size, gate_and_up_proj_bias,
               down_proj_bias, **kw):
    """out[t] = a[t, e] * ((silu(g) * u) Wd + bd), g = x Wg + bg and u = x Wu + bu (each clamped
    to its limits when given) of the token's expert, with
    the dequantized MX weights; the gate/up bias [E, 128, 2, I/512, 4] is 4_I packed like the
    down weight's rows (I index 512 k + 128 j + p). The kernel quantizes the hidden states and
    the intermediate to MXFP8 itself; the reference keeps them exact."""
    wg, wd = _mx_weights_dense(gw, gate_up_proj_scale, dw, down_proj_scale)
    e, i = wg.shape[0], wg.shape[-1]
    bgu = gate_and_up_proj_bias.astype(np.float64).transpose(0, 2, 3, 4, 1).reshape(e, 2, i)
    x = x.astype(np.float64)
    a = aff.astype(np.float64).reshape(-1, e)
    t = x.shape[0] - 1
    out = np.zeros((t, x.shape[1]))
    for tok in range(t):
        k = int(np.argmax(a[tok]))
        g, u = x[tok] @ wg[k, :, 0] + bgu[k, 0], x[tok] @ wg[k, :, 1] + bgu[k, 1]
        g = np.clip(g, kw.get("gate_clamp_lower_limit") or -np.inf, kw.get("gate_clamp_upper_limit") or np.inf)
        u = np.clip(u, kw.get("up_clamp_lower_limit") or -np.inf, kw.get("up_clamp_upper_limit") or np.inf)
        out[tok] = a[tok, k] * (((g / (1 + np.exp(-g))) * u) @ wd[k] + down_proj_bias[k].astype(np.float64))
    return out


def _hybrid_mx(make: Any) -> Any:
    """The hybrid kernel's inputs: conditions [N+1] (1: a block with tokens, last 0) first."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        args, kw = make(rng, r)
        x, pos, block = args[0], args[4], kw["block_size"]
        blocks = pos.reshape(-1, block)
        cond = np.concatenate([(blocks != x.shape[0] - 1).any(1), [False]]).astype(np.int32)
        return (cond,) + args, kw
    return inputs


# the kernel quantizes the hidden states and the intermediate to MXFP8 E4M3 (3 mantissa bits:
# each operand within 1/16 of itself, its group's small values coarser); the reference keeps
# them exact: 1/16 of the value plus 1/16 of the tensor's scale
LIB_CASES.append(_lib("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx",
                      _moe_mx_inputs(), lambda a, kw, r, al: ref_moe_mx(*a, **kw), lnc=2, rtol=1 / 16, atol=0,
                      post=_moe_out))
def _with_clamps(make: Any, limit: float = 8.0) -> Any:
    """Gate and up clamp limits +-limit: bwmm_shard_on_block_mx issues its clamp
    tensor_scalar with op0=None when no limit is given, which "nki.isa.tensor_scalar" does not
    define (op0 is required there)."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        args, kw = make(rng, r)
        return args, {**kw, "gate_clamp_upper_limit": limit, "gate_clamp_lower_limit": -limit,
                      "up_clamp_upper_limit": limit, "up_clamp_lower_limit": -limit}
    return inputs


LIB_CASES.append(_lib("core/moe/moe_cte/bwmm_shard_on_block_mx.py", "bwmm_shard_on_block_mx",
                      _with_clamps(_moe_mx_inputs(128)),
                      lambda a, kw, r, al: (ref_moe_mx(*a, **kw), np.zeros(a[0].shape)), lnc=2, rtol=1 / 16, atol=0,
                      # [2, T+1, H]: the programs' partial outputs, reduced into [0] with [1] zeroed
                      # (reduce_outputs' docstring); the padding row dropped
                      post=lambda o: (np.asarray(o)[0, :-1].astype(np.float64), np.asarray(o)[1])))
LIB_CASES.append(_lib("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx_hybrid",
                      _hybrid_mx(_moe_mx_inputs()), lambda a, kw, r, al: ref_moe_mx(*a[1:], **kw), lnc=2,
                      rtol=1 / 16, atol=0, post=_moe_out))

def _rg(n: int) -> Any:
    import nki.collectives as ncc  # the simulator's, after install()
    return ncc.ReplicaGroup([list(range(n))])


# --- running ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    status: str  # "match", "mismatch", "error", "no case", "hardware only", "not a kernel"
    detail: str = ""
    seconds: float = 0.0


def _import(folder: Path, case: Case) -> Any:
    path = folder / case.file
    if case.module:
        root = str(folder / LIB)
        if root not in sys.path:
            sys.path.insert(0, root)
        return importlib.import_module(case.module)
    spec = importlib.util.spec_from_file_location(f"aws_{path.stem.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compare(got: Any, want: Any, case: Case) -> str:
    if isinstance(want, tuple):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"expected {len(want)} outputs, got {type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            msg = _compare(g, w, case)
            if msg:
                return f"output {i}: {msg}"
        return ""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    # tolerance against the tensor's scale (as tests/kernels/conftest.py): sums of many
    # rounded products are judged by their magnitude, not element by element
    scale = float(np.nanmax(np.abs(w64))) if w64.size else 0.0
    err = np.abs(g64 - w64)
    if np.isnan(g64).any() or np.any(err > case.atol + case.rtol * (np.abs(w64) + scale)):
        return f"max |err| {np.nanmax(err):.3g} (rtol {case.rtol}, atol {case.atol}, scale {scale:.3g}); " \
               f"{int(np.isnan(g64).sum())} NaN"
    return ""


def run_case(folder: Path, case: Case) -> Outcome:
    """Run one case; environment variables a kernel file sets at import are undone after it."""
    import os

    saved = dict(os.environ)
    try:
        return _run_case(folder, case)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_case(folder: Path, case: Case) -> Outcome:
    from trnopt.kernels.sim import run_ranks

    if case.hardware_only:
        return Outcome(case, "hardware only", case.hardware_only)
    t0 = time.perf_counter()
    try:
        mod = _import(folder, case)
        kernel = getattr(mod, case.kernel)
        if case.wrap:
            kernel = case.wrap(kernel)
        per_rank = [case.inputs(np.random.default_rng(1000 + r), r) for r in range(case.ranks)]
        kwargs = per_rank[0][1]
        res = run_ranks(kernel, [a for a, _ in per_rank], lnc=case.lnc, kwargs=kwargs, timeout_s=120)
    except Exception as exc:  # noqa: BLE001 - reported per kernel
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if case.expect_error and re.search(case.expect_error, str(exc)):
            return Outcome(case, "match", f"raises as expected: {msg[:90]}", time.perf_counter() - t0)
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                      if "trnopt" not in f.filename and "benchmarks" not in f.filename), "")
        return Outcome(case, "error", f"{msg[:160]} [{where}]", time.perf_counter() - t0)
    if case.expect_error:
        return Outcome(case, "mismatch", f"expected an error matching {case.expect_error!r}", time.perf_counter() - t0)
    for r in range(case.ranks):
        want = case.reference(per_rank[r][0], kwargs, r, [a for a, _ in per_rank])
        got = case.post(res.outputs[r]) if case.post else res.outputs[r]
        msg = _compare(got, want, case)
        if msg:
            return Outcome(case, "mismatch", f"rank {r}: {msg}", time.perf_counter() - t0)
    return Outcome(case, "match", "", time.perf_counter() - t0)


def public_kernels(folder: Path) -> list[tuple[str, str]]:
    """(file, kernel) of every public @nki.jit function of the 0.6+ files in the folder."""
    found = []
    files = sorted((folder / "sdk").glob("*.py")) + sorted((folder / LIB).rglob("*.py"))
    for path in files:
        text = path.read_text(errors="replace")
        if "neuronxcc" in text and "import nki" not in text:
            continue  # pre-0.6 API
        for m in re.finditer(r"^@nki\.jit[^\n]*\n(?:@[^\n]*\n)*def ([A-Za-z_]\w*)", text, re.M):
            if not m.group(1).startswith("_"):
                found.append((str(path.relative_to(folder)), m.group(1)))
    return found


def main(argv: list[str]) -> int:
    only = ""
    if len(argv) == 3 and argv[1] == "-k":
        argv, only = argv[:1], argv[2]
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1])
        return 2
    folder = Path(argv[0])
    if not folder.is_dir():
        print(f"not run: kernel folder {folder} not found (copy aws-neuron-sdk nki/examples and "
              f"aws-neuron/nki-library there, see the module docstring)")
        return 0
    from trnopt.kernels.sim import install
    install()
    cases = {(c.file, c.kernel): c for c in SDK_CASES + LIB_CASES}
    outcomes: list[Outcome] = []
    for file, kernel in public_kernels(folder):
        case = cases.pop((file, kernel), None)
        if only not in f"{file}::{kernel}":
            continue
        if Path(file).name in SDK_NOT_KERNELS:
            outcomes.append(Outcome(Case(file, kernel, None, None), "not a kernel", SDK_NOT_KERNELS[Path(file).name]))
        elif case is None:
            outcomes.append(Outcome(Case(file, kernel, None, None), "no case", "no inputs / reference written"))
        else:
            outcomes.append(run_case(folder, case))
    for case in cases.values():
        if only not in f"{case.file}::{case.kernel}":
            continue
        outcomes.append(Outcome(case, "error", "kernel not found in the folder"))
    width = max(len(f"{o.case.file}::{o.case.kernel}") for o in outcomes)
    print(f"{'kernel':<{width}}  {'result':<13} {'s':>6}  detail")
    for o in outcomes:
        print(f"{o.case.file + '::' + o.case.kernel:<{width}}  {o.status:<13} {o.seconds:6.2f}  {o.detail}")
    counted = [o for o in outcomes if o.status not in ("hardware only", "not a kernel")]
    ok = sum(o.status == "match" for o in counted)
    excluded = len(outcomes) - len(counted)
    print(f"\n{ok} of {len(counted)} kernels run unmodified and match NumPy "
          f"({excluded} excluded: hardware-only features or not kernels; "
          f"{sum(o.status == 'no case' for o in counted)} without a case here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
