"""Cases of benchmarks/aws_kernels.py: nki-library's top-k and its fused token-generation blocks
(MoE block, attention block)."""

from __future__ import annotations

import numpy as np

from aws_case import BF16, Case, lib_case

BLOCK_CASES: list[Case] = []


def _topk_inputs(rng: np.random.Generator, r: int, b: int = 2, s: int = 64, v: int = 4096,
                 k: int = 64) -> tuple[tuple, dict]:
    """rotational_topk's inputs as its docstring and nki-library's topk test build them: [BxS, V]
    FP32 normal values in HBM and the config of ``create_topk_config`` (B, S, V, k, sorted, 2
    programs) -> ``create_rotational_topk_config`` -> ``prepare_rotational_constants``."""
    import atexit

    from nkilib.core.topk.rotational_topk import (cleanup_rotational_constants, create_rotational_topk_config,
                                                  create_topk_config, prepare_rotational_constants)
    atexit.register(cleanup_rotational_constants)  # the constants' temporary files
    inp = rng.standard_normal((b * s, v)).astype(np.float32)
    topk = create_topk_config(inp_shape=(b, s, v), inp_dtype=np.float32, k=k, sorted=True, num_programs=2)
    return (inp, prepare_rotational_constants(create_rotational_topk_config(inp.shape, topk))), {}


def ref_topk(inp, config):
    """The k largest values of each row, largest first, and their column indices (distinct
    random values: no ties)."""
    idx = np.argsort(-inp, axis=-1, kind="stable")[:, :config.orig_k]
    return np.take_along_axis(inp, idx, -1), idx


BLOCK_CASES.append(lib_case("core/topk/rotational_topk.py", "rotational_topk", _topk_inputs,
                          lambda a, kw, r, al: ref_topk(*a), lnc=2,
                          post=lambda o: tuple(np.asarray(x).reshape(-1, np.asarray(x).shape[-1]) for x in o)))


def _moe_block_inputs(rng: np.random.Generator, r: int, t: int = 4, h: int = 512, e: int = 8, i: int = 256,
                      top_k: int = 2) -> tuple[tuple, dict]:
    """moe_block_tkg's inputs as its docstring gives them, selective-expert mode (T <= 128, H a
    multiple of 256): inp [B, S, H], gamma [1, H], router weights [H, E], fused gate/up weights
    [E, H, 2, I], down weights [E, I, H], BF16; sigmoid router before top-k, affinities applied
    after the expert MLP (POST_SCALE)."""
    from nkilib.core.utils.common_types import ExpertAffinityScaleMode
    x = rng.standard_normal((1, t, h)).astype(BF16)
    gamma = rng.uniform(0.5, 1.5, (1, h)).astype(BF16)
    wr = (rng.standard_normal((h, e)) * 0.1).astype(BF16)
    wg = (rng.standard_normal((e, h, 2, i)) * 0.05).astype(BF16)
    wd = (rng.standard_normal((e, i, h)) * 0.05).astype(BF16)
    return (x, gamma, wr, wg, wd), {"top_k": top_k,
                                    "expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}


def ref_moe_block(x, gamma, wr, wg, wd, top_k, eps=1e-6, **kw):
    """out[t] = sum over the token's top-k experts e of sigmoid(l[t, e]) (silu(n Wg[e]) * (n Wu[e])) Wd[e],
    n = rmsnorm(x) * gamma, l = n Wr (the router logits, the second output)."""
    x = x.astype(np.float64).reshape(-1, x.shape[-1])
    n = x / np.sqrt((x * x).mean(1, keepdims=True) + eps) * gamma.astype(np.float64)
    logits = n @ wr.astype(np.float64)
    aff = 1 / (1 + np.exp(-logits))
    out = np.zeros_like(x)
    for t_ in range(x.shape[0]):
        for k in np.argsort(-aff[t_])[:top_k]:
            g, u = n[t_] @ wg[k, :, 0].astype(np.float64), n[t_] @ wg[k, :, 1].astype(np.float64)
            out[t_] += aff[t_, k] * ((g / (1 + np.exp(-g)) * u) @ wd[k].astype(np.float64))
    return out, logits


# the kernel stops before any output at nki.isa.local_gather (moe_tkg_utils), which the
# simulator does not implement: this reference has not yet been compared with a run
BLOCK_CASES.append(lib_case("core/moe_block/moe_block_tkg.py", "moe_block_tkg", _moe_block_inputs,
                          lambda a, kw, r, al: ref_moe_block(*a, **kw), lnc=2, legacy_api=True,
                          post=lambda o: (np.asarray(o[0]).astype(np.float64), np.asarray(o[1]).astype(np.float64)),
                          eps_dtype=(BF16, BF16)))


def _attn_block_inputs(rng: np.random.Generator, r: int, h: int = 256, d: int = 64, qh: int = 2,
                       s_ctx: int = 128) -> tuple[tuple, dict]:
    """attention_block_tkg's inputs as its docstring gives them, its plainest configuration: one
    batch, one new token, QKV projection, attention over a flat KV cache of S_ctx positions
    (all attended: an all-ones mask), no norms, RoPE, cache update or output projection."""
    from nkilib.core.utils.common_types import QuantizationType
    x = rng.standard_normal((1, 1, h)).astype(BF16)
    w_qkv = (rng.standard_normal((h, d * (qh + 2))) / np.sqrt(h)).astype(BF16)
    k_cache, v_cache = (rng.standard_normal((1, s_ctx, d)).astype(BF16) for _ in range(2))
    mask = np.ones((s_ctx, 1, qh, 1), np.uint8)
    none = QuantizationType.NONE
    args = (x, None, False, None, None,  # X, X_hidden_dim_actual, rmsnorm_X_{enabled, eps, gamma}
            w_qkv, None, none, None, None,  # W_qkv, bias_qkv, quantization_type_qkv and its two scales
            False, 0.0, None, None,  # rmsnorm_QK_pre_rope_{enabled, eps, W_Q, W_K}
            None, None, False,  # cos, sin, rope_contiguous_layout
            False, 0.0, None, None,  # rmsnorm_QK_post_rope_{enabled, eps, W_Q, W_K}
            False, None,  # K_cache_transposed, active_blocks_table
            k_cache, v_cache, mask, None,  # K_cache, V_cache, attention_mask, sink
            False, None,  # update_cache, kv_cache_update_idx
            None, None, none, None, None, False,  # W_out, bias_out, quantization_type_out, its scales, transposed_out
            False)  # out_in_sb
    return args, {}


def ref_attention_block(x, w_qkv, k_cache, v_cache, qh):
    """out[h] = softmax(q_h . K / sqrt(d)) V with q, k, v = x W_qkv split into qh + 2 heads of d;
    the new token's k and v take the cache's last position (attention_tkg overwrites the last
    s_active positions of the prior with the active ones). Returns (out [1, qh, d, 1], k [d, 1, 1],
    v [1, 1, 1, d])."""
    d = k_cache.shape[-1]
    qkv = x.astype(np.float64).reshape(1, -1) @ w_qkv.astype(np.float64)
    q, k, v = qkv[0, :qh * d].reshape(qh, d), qkv[0, qh * d:(qh + 1) * d], qkv[0, (qh + 1) * d:]
    kc, vc = k_cache[0].astype(np.float64), v_cache[0].astype(np.float64)
    kc[-1], vc[-1] = k, v
    s_ = q @ kc.T / np.sqrt(d)
    p_ = np.exp(s_ - s_.max(1, keepdims=True))
    p_ /= p_.sum(1, keepdims=True)
    return (p_ @ vc).reshape(1, qh, d, 1), k.reshape(d, 1, 1), v.reshape(1, 1, 1, d)


BLOCK_CASES.append(lib_case("experimental/transformer/attention_block_tkg.py", "attention_block_tkg",
                            _attn_block_inputs,
                          lambda a, kw, r, al: ref_attention_block(a[0], a[5], a[23], a[24], a[25].shape[2]),
                          post=lambda o: tuple(np.asarray(x).astype(np.float64) for x in o),
                          eps_dtype=(BF16, BF16, BF16)))
