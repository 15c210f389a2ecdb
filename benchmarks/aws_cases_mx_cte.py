"""Cases of benchmarks/aws_kernels.py: nki-library's mixture-of-experts context-encoding kernels
on MX (microscaling) weights, which quantize their hidden states and intermediate to MXFP8."""

from __future__ import annotations

from typing import Any

import numpy as np

from aws_case import BF16, Case, bf16, lib_case
from aws_cases_moe import moe_inputs, moe_out, silu_f32
from aws_cases_mx import mx_quantize, mx_random, psum_mx, x4_values

MX_MOE_CASES: list[Case] = []


def _moe_mx_inputs(block: int = 256, h: int = 512, i: int = 1024, e: int = 4, kind: str = "fp4") -> Any:
    """moe_inputs' routing and hidden states with random MX weights (scales 2 ** -8 .. 2 ** -6)."""
    def make(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        (x, aff, _, _, _, pos, b2e), _ = moe_inputs(block)(rng, r, h=h, e=e, i=i)
        gw, _ = mx_random(rng, (e, 128, 2, h // 512, i), kind)
        gs = rng.integers(127 - 8, 127 - 5, (e, 16, 2, h // 512, i)).astype(np.uint8)
        dw, _ = mx_random(rng, (e, 128, i // 512, h), kind)
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


def _mx_blocks(v: np.ndarray) -> np.ndarray:
    """[128, K, N, 4] values (partition, tile, token, x4 value) -> the MX-quantized values,
    one block per 8 partitions x the 4 values of a token's x4 element (``quantize_mx``)."""
    _, k, n, _ = v.shape
    blocks = v.reshape(16, 8, k, n, 4).transpose(0, 2, 3, 1, 4).reshape(16, k, n, 32)
    vals, _ = mx_quantize(blocks)
    return vals.reshape(16, k, n, 8, 4).transpose(0, 3, 1, 2, 4).reshape(v.shape)


def ref_moe_mx(x, aff, gw, dw, pos, b2e, gate_up_proj_scale, down_proj_scale, block_size,
               gate_and_up_proj_bias, down_proj_bias, shards: int = 2, **kw):
    """out[t] = a[t, e] * ((silu(g) * u) Wd + bd), g = x Wg + bg and u = x Wu + bu (each clamped
    to its limits when given) of the token's expert, with the dequantized MX weights (the gate/up
    bias [E, 128, 2, I/512, 4] 4_I packed like the down weight's rows: I index 512 k + 128 j + p),
    as bwmm_shard_on_I_mx computes it (``shards`` 2), block by block: the block's BF16 hidden
    states transposed (partition p, H/512 tile k, x4 value j hold H index j H/4 + 128 k + p, the
    weights' 4_H packing) and quantized to MXFP8 (``quantize_block_hidden_state_T``); gate and up
    as ``nc_matmul_mx`` into BF16 PSUM (``psum_mx``; I index 512 k + 128 j + p) plus the BF16 bias
    (``gate_up_projection_mx_tp_shard_I``), clamped, silu and the product in BF16; the product
    quantized to MXFP8 (``_down_proj_prep_inter_and_weights``); each core's I/512 tiles (the first
    half on program 0) down-projected into BF16 PSUM, 128 tokens x 512 H per call, plus the BF16
    down bias (``down_projection_mx_shard_I``); the two partials added in BF16 after ``sendrecv`` and
    scaled by the FP32 affinity into BF16 (``accumulation_after_down_proj``). ``shards`` 1:
    bwmm_shard_on_block_mx, whose cores take whole blocks with all of I, the same steps
    (``gate_up_projection_mx_tp_shard_H``, ``down_projection_mx_shard_H``: BF16 PSUM over the
    I/512 tiles) without the exchange."""
    e, h = gw.shape[0], x.shape[1]
    p_ = np.arange(128)
    row = 4 * (p_ // 32) + (p_ % 32) // 8
    g64 = x4_values(gw) * np.exp2(gate_up_proj_scale[:, row].astype(np.float64) - 127)[..., None]  # [E,128,2,K,I,4]
    d64 = x4_values(dw) * np.exp2(down_proj_scale[:, row].astype(np.float64) - 127)[..., None]  # [E,128,I/512,H,4]
    n_i = g64.shape[4]
    bgu = gate_and_up_proj_bias.astype(np.float64).transpose(0, 2, 3, 4, 1).reshape(e, 2, n_i)  # I index 512k+128j+p
    a = aff.astype(np.float64).reshape(-1, e)
    t = x.shape[0] - 1
    out = np.zeros((t, h))
    for b, k in enumerate(np.asarray(b2e).reshape(-1)):
        toks = np.asarray(pos[b * block_size:(b + 1) * block_size])
        xb = x[toks].astype(np.float64).reshape(len(toks), 4, h // 512, 128).transpose(3, 2, 0, 1)  # [p, K, B, j]
        xq = _mx_blocks(xb)
        gu = []
        for j, (lo, hi) in enumerate((("gate_clamp_lower_limit", "gate_clamp_upper_limit"),
                                      ("up_clamp_lower_limit", "up_clamp_upper_limit"))):
            y = np.concatenate([psum_mx(g64[k, :, j, :, c0:c0 + 128], xq) for c0 in range(0, n_i, 128)])
            y = bf16(y + bgu[k, j][:, None])  # [I, B]
            gu.append(np.clip(y, kw.get(lo) or -np.inf, kw.get(hi) or np.inf))
        act = bf16(silu_f32(gu[0]) * gu[1])  # [I, B]
        actq = _mx_blocks(act.reshape(n_i // 512, 4, 128, -1).transpose(2, 0, 3, 1))  # [p, I/512, B, j]
        tiles = np.split(np.arange(n_i // 512), shards)
        parts = []
        for tl in tiles:
            part = np.zeros((len(toks), h))
            for m0 in range(0, len(toks), 128):
                for h0 in range(0, h, 512):
                    part[m0:m0 + 128, h0:h0 + 512] = psum_mx(actq[:, tl, m0:m0 + 128], d64[k][:, tl, h0:h0 + 512])
            parts.append(bf16(part + down_proj_bias[k].astype(np.float64)))
        real = toks < t
        total = bf16(sum(parts))[real]
        out[toks[real]] = bf16(a[toks[real], k].astype(np.float32).astype(np.float64)[:, None] * total)
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


# the reference quantizes the hidden states and the intermediate to MXFP8 and rounds to BF16
# where the kernel does (ref_moe_mx), so the default per-element check applies
MX_MOE_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx",
                      _moe_mx_inputs(), lambda a, kw, r, al: ref_moe_mx(*a, **kw), lnc=2,
                      post=moe_out, eps_dtype=BF16))
def _with_clamps(make: Any, limit: float = 8.0) -> Any:
    """Gate and up clamp limits +-limit: bwmm_shard_on_block_mx issues its clamp
    tensor_scalar with op0=None when no limit is given, which "nki.isa.tensor_scalar" does not
    define (op0 is required there)."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        args, kw = make(rng, r)
        return args, {**kw, "gate_clamp_upper_limit": limit, "gate_clamp_lower_limit": -limit,
                      "up_clamp_upper_limit": limit, "up_clamp_lower_limit": -limit}
    return inputs


MX_MOE_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_block_mx.py", "bwmm_shard_on_block_mx",
                      _with_clamps(_moe_mx_inputs(128)),
                      lambda a, kw, r, al: (ref_moe_mx(*a, shards=1, **kw), np.zeros(a[0].shape)), lnc=2,
                      # [2, T+1, H]: the programs' partial outputs, reduced into [0] with [1] zeroed
                      # (reduce_outputs' docstring); the padding row dropped
                      post=lambda o: (np.asarray(o)[0, :-1].astype(np.float64), np.asarray(o)[1]),
                      eps_dtype=(BF16, None)))
MX_MOE_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx_hybrid",
                      _hybrid_mx(_moe_mx_inputs()), lambda a, kw, r, al: ref_moe_mx(*a[1:], **kw), lnc=2,
                      post=moe_out, eps_dtype=BF16))
