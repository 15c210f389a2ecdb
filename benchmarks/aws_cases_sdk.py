"""Cases of benchmarks/aws_kernels.py: the kernels of aws-neuron-sdk's nki/examples (FOLDER/sdk)."""

from __future__ import annotations

import numpy as np

from aws_case import BF16, Case, f32, sqrt_n


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
    return x.astype(np.float64).reshape(c, h // pool, pool, w // pool, pool).mean(axis=(2, 4))


def ref_maxpool(x, pool):
    c, h, w = x.shape
    return x.reshape(c, h // pool, pool, w // pool, pool).max(axis=(2, 4))


def _matmul_case(kernel: str, k: int, m: int, n: int, **kw) -> Case:
    def inputs(rng, rank):
        return (rng.standard_normal((k, m)).astype(BF16), rng.standard_normal((k, n)).astype(BF16)), {}
    return Case("sdk/matrix_multiplication_nki_kernels.py", kernel, inputs,
                lambda a, kw, r, al: a[0].astype(np.float64).T @ a[1].astype(np.float64), **kw)


def _mamba_case(kernel: str) -> Case:
    def inputs(rng, rank):
        b, ch, L, n = 1, 256, 512, 16
        return (rng.uniform(0.1, 1, (b, ch, L)).astype(np.float32), rng.standard_normal((b, ch, L)).astype(np.float32),
                -rng.uniform(0.5, 1, (ch, n)).astype(np.float32), rng.standard_normal((b, n, L)).astype(np.float32),
                rng.standard_normal((b, n, L)).astype(np.float32)), {}
    return Case("sdk/mamba_nki_kernels.py", kernel, inputs, lambda a, kw, r, al: ref_mamba(*a), atol_ulps=sqrt_n(512),
                why="the FP32 scan state carries the rounding of all 512 steps")


SDK_CASES = [
    Case("sdk/nki_simulate_example.py", "add_kernel",
         lambda rng, r: ((f32(128, 512)(rng), f32(128, 512)(rng)), {}), lambda a, kw, r, al: a[0] + a[1]),
    Case("sdk/getting_started_baremetal.py", "nki_tensor_add_kernel",
         lambda rng, r: ((rng.standard_normal((4, 3)).astype(np.float16),
                           rng.standard_normal((4, 3)).astype(np.float16)), {}),
         lambda a, kw, r, al: a[0] + a[1]),
    *(Case(f"sdk/getting_started_{fw}.py", "nki_tensor_add_kernel",  # the framework is imported only in main
           lambda rng, r: ((f32(128, 512)(rng), f32(128, 512)(rng)), {}), lambda a, kw, r, al: a[0] + a[1])
      for fw in ("jax", "torch")),
    Case("sdk/tensor_addition_nki_kernels.py", "nki_tensor_add",
         lambda rng, r: ((f32(256, 1024)(rng), f32(256, 1024)(rng)), {}), lambda a, kw, r, al: a[0] + a[1]),
    Case("sdk/average_pool2d_nki_kernels.py", "tensor_avgpool_kernel",
         lambda rng, r: ((np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6), 2), {}),
         lambda a, kw, r, al: ref_avgpool(*a)),
    Case("sdk/index-case-1.py", "tensor_split_kernel_",
         lambda rng, r: ((np.arange(4 * 5).reshape(4, 5).astype(BF16),), {}),
         lambda a, kw, r, al: (a[0][:, 0::2], a[0][:, 1::2])),
    Case("sdk/index-case-3.py", "tensor_maxpool_kernel_",
         lambda rng, r: ((np.arange(2 * 6 * 6).reshape(2, 6, 6).astype(BF16), 2), {}),
         lambda a, kw, r, al: ref_maxpool(*a)),
    Case("sdk/layout-pass.py", "tensor_exp_kernel_",
         lambda rng, r: ((rng.standard_normal((128, 512)).astype(BF16),), {}),
         lambda a, kw, r, al: np.exp(a[0].astype(np.float64))),
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
    _matmul_case("nki_matmul_fully_optimized_", 4096, 2048, 2048, atol_ulps=2,
                 why="K = 4096 in 4 blocks of 1024 whose results are added in the BF16 result tile: 4 roundings "
                     "of half a BF16 ulp of a partial sum"),
    _mamba_case("mamba_v1"),
    _mamba_case("mamba_v2"),
    _mamba_case("mamba_v3"),
]

# Files that are documentation fragments, not runnable kernels (the SDK shows them as
# snippets): a syntax error on purpose, or a torch_neuronx import.
SDK_NOT_KERNELS = {"layout-dynamic-loop.py": "documentation fragment (does not parse)",
                   "layout-loop.py": "imports torch_neuronx (PyTorch integration, not a kernel file)"}
