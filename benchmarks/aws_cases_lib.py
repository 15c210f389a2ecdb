"""Cases of benchmarks/aws_kernels.py: nki-library's kernels other than MoE and MX (convolution,
rotary embedding, top-k, cross-entropy, attention, RMSNorm with quantization, indexing)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from aws_case import BF16, Case, bf16, f32, gathered, lib_case, psum_matmul, replica_group, sqrt_n


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


def ref_dynamic_add(a, b, tiles):
    """The first 128 x tiles rows a + b; the rest never written (NaN in the simulator), which
    the kernel's closing HBM fence (a copy of the result onto itself) moves as they are."""
    out = np.full(a.shape, np.nan)
    n = 128 * int(tiles[0, 0])
    out[:n] = a[:n].astype(np.float64) + b[:n].astype(np.float64)
    return out


def _sparse_rows(rng: np.random.Generator, v: int, n: int, density: float = 0.3) -> np.ndarray:
    return (rng.random((n, v)) < density).astype(np.float32) * rng.integers(1, 5, (n, v)).astype(np.float32)


LIB_CASES: list[Case] = [
    lib_case("core/cumsum/cumsum.py", "cumsum", lambda rng, r: ((f32(64, 1000)(rng),), {}),
         lambda a, kw, r, al: np.cumsum(a[0].astype(np.float64), axis=-1), atol_ulps=sqrt_n(1000),
         why="a running FP32 sum of 1000 terms"),
    lib_case("core/max/cascaded_max.py", "cascaded_max", lambda rng, r: ((f32(4, 1, 8192)(rng),), {}),
         lambda a, kw, r, al: (a[0].max(-1, keepdims=True), a[0].argmax(-1)[..., None])),
    lib_case("core/embeddings/rope.py", "RoPE",
         lambda rng, r: ((f32(64, 1, 2, 128)(rng), f32(32, 1, 128)(rng), f32(32, 1, 128)(rng)), {}),
         lambda a, kw, r, al: ref_rope(*a), atol_ulps=sqrt_n(2), why="x1 cos - x2 sin: two FP32 products summed"),
    lib_case("experimental/dynamic_shapes/dynamic_elementwise_add.py", "dynamic_elementwise_add",
         lambda rng, r: ((rng.standard_normal((256, 512)).astype(BF16), rng.standard_normal((256, 512)).astype(BF16),
                          np.array([[1]], np.int32)), {}),
         lambda a, kw, r, al: ref_dynamic_add(*a)),
    lib_case("experimental/conv/conv1d.py", "conv1d", lambda rng, r: ((f32(1, 64, 128)(rng), f32(3, 64, 32)(rng)), {}),
         lambda a, kw, r, al: ref_conv1d(*a), atol_ulps=sqrt_n(3 * 64),
         why="an FP32 sum of 3 taps x 64 channels of products"),
    lib_case("experimental/conv/depthwise_conv1d.py", "depthwise_conv1d_implicit_gemm",
         lambda rng, r: ((f32(1, 128, 1, 256)(rng), f32(128, 1, 1, 3)(rng)), {"feature_group_count": 128}),
         lambda a, kw, r, al: ref_depthwise(*a), atol_ulps=sqrt_n(3), why="an FP32 sum of 3 taps"),
    lib_case("experimental/benchmark/find_nonzero_indices_with_count.py", "find_nonzero_indices_with_count",
         lambda rng, r: ((_sparse_rows(rng, 512, 1),), {}), lambda a, kw, r, al: ref_nonzero_with_count(a[0])),
    lib_case("core/subkernels/find_nonzero_indices.py", "find_nonzero_indices",
         lambda rng, r: ((_sparse_rows(rng, 16, 256),), {}), lambda a, kw, r, al: ref_find_nonzero(a[0])),
    lib_case("experimental/loss/cross_entropy.py", "cross_entropy_forward",
         lambda rng, r: ((rng.standard_normal((64, 4096)).astype(np.float32), rng.integers(0, 4096, 64).astype(np.int32)),
                         {"positions_per_batch": 32, "chunk_size": 4096, "dtype": np.dtype(np.float32)}),
         lambda a, kw, r, al: ref_cross_entropy(*a), lnc=2, post=lambda o: o[0]),
    lib_case("experimental/collectives/fg_allgather.py", "fine_grained_allgather",
         lambda rng, r: ((rng.standard_normal((256, 256)).astype(BF16), 4, 1), {}),
         lambda a, kw, r, al: gathered(al), ranks=4, lnc=2, post=lambda o: o.reshape(-1, o.shape[-1])),
    lib_case("experimental/collectives/sb2sb_allgather.py", "allgather_sb2sb_tiled",
         lambda rng, r: ((rng.standard_normal((128, 128)).astype(BF16), replica_group(4), 4), {}),
         lambda a, kw, r, al: gathered(al, axis=1), ranks=4),
    lib_case("experimental/collectives/sb2sb_allgather.py", "allgather_sb2sb",
         lambda rng, r: ((rng.standard_normal((128, 128)).astype(BF16), replica_group(4), 4), {}),
         lambda a, kw, r, al: gathered(al, axis=1), ranks=4),
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
    lib_case("core/embeddings/rope_hf.py", "rope_hf",
         lambda rng, r: ((f32(1, 2, 128, 64)(rng), f32(1, 1, 128, 64)(rng), np.zeros((1, 2, 128, 64), np.float32),
                          np.zeros((1, 1, 128, 64), np.float32), f32(1, 128, 64)(rng), f32(1, 128, 64)(rng)), {}),
         lambda a, kw, r, al: ref_rope_hf(a[0], a[1], a[4], a[5]), atol_ulps=sqrt_n(2),
         why="x cos + rot(x) sin: two FP32 products summed"),
    lib_case("core/output_projection/output_projection_tkg.py", "output_projection_tkg",
         lambda rng, r: ((f32(64, 2, 2, 1)(rng), f32(128, 512)(rng)), {}),
         lambda a, kw, r, al: np.einsum("dbns,ndh->bsh", a[0].astype(np.float64),
                                        a[1].reshape(2, 64, 512).astype(np.float64)).reshape(2, 512),
         atol_ulps=sqrt_n(2 * 64), why="an FP32 sum over 2 heads x 64 head dims"),
    lib_case("core/output_projection/output_projection_cte/output_projection_cte.py", "output_projection_cte",
         lambda rng, r: ((f32(1, 2, 64, 128)(rng), f32(128, 512)(rng)), {}),
         lambda a, kw, r, al: np.einsum("bnds,ndh->bsh", a[0].astype(np.float64),
                                        a[1].reshape(2, 64, 512).astype(np.float64)),
         atol_ulps=sqrt_n(2 * 64), why="an FP32 sum over 2 heads x 64 head dims"),
    lib_case("experimental/loss/cross_entropy.py", "cross_entropy_backward", _ce_bwd_inputs,
         lambda a, kw, r, al: ref_ce_backward(a[0], a[1], 1.0 / a[0].shape[0]), lnc=2, atol_ulps=sqrt_n(4096),
         why="the softmax's FP32 sum of 4096 exponentials"),
    lib_case("experimental/collectives/topk_reduce.py", "topk_reduce", lambda rng, r: ((_topk_input(rng), 8, 2), {}),
         lambda a, kw, r, al: ref_topk_reduce(*a)),
    lib_case("experimental/collectives/fgcc.py", "allgather_compute_matmul",
         lambda rng, r: ((rng.integers(-2, 3, (128, 256)).astype(BF16), rng.integers(-2, 3, (256, 128)).astype(BF16),
                          4, 1), {}),
         lambda a, kw, r, al: gathered(al).astype(np.float64) @ a[1].astype(np.float64), ranks=4, lnc=2,
         post=lambda o: o.reshape(-1, o.shape[-1])),
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
    lib_case("core/attention/attention_cte.py", "attention_cte",
         lambda rng, r: ((rng.standard_normal((1, 256, 64)).astype(BF16), rng.standard_normal((1, 64, 256)).astype(BF16),
                          rng.standard_normal((1, 256, 64)).astype(BF16)), {"scale": 1.0}),
         lambda a, kw, r, al: ref_attention(*a)),
    # files that fail to import here: the case records the import error
    lib_case("core/mlp/mlp.py", "mlp", _no_inputs, None),
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


LIB_CASES.append(lib_case("core/subkernels/indexed_flatten.py", "indexed_flatten", _flatten_inputs,
                      lambda a, kw, r, al: ref_indexed_flatten(*a), lnc=2))


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
LIB_CASES.append(lib_case("core/rmsnorm/rmsnorm_quant.py", "rmsnorm_quant_kernel", _rmsnorm_quant_inputs,
                      lambda a, kw, r, al: ref_rmsnorm_quant(a[0], a[1]),
                      # the data judged as FP8 E4M3; the scale max|y| / 240 as BF16: the kernel normalizes
                      # in its input dtype, so the scale carries one BF16 rounding of y
                      eps_dtype=(np.dtype(ml_dtypes.float8_e4m3), BF16), atol_ulps=0.5,
                      why="atol half an ulp (less than the default): the scales of all rows are alike, so one ulp "
                          "x rms would let a 1% error pass",
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
    dQ = scale dS K, dK = scale dS^T Q; a KV head's gradient sums over the query heads it serves.
    Computed as nki-library's attention_bwd does without ``mixed_precision`` (its accumulators
    then in the BF16 input dtype): q scaled in BF16 on load (``load_q_dy``); S an FP32 PSUM sum;
    the softmax bias -lse held in BF16 (``softmax_exp_bias``); P = exp(S - lse) on the Scalar
    engine in FP32, stored in BF16 (``softmax_y``); rowsum(dY o) of BF16 products (``dy_o_mul``)
    summed in FP32 into BF16 (``dy_o_sum``); dS = (dP - rowsum) P in FP32 into BF16
    (``softmax_dx_local``); dQ = scale x the FP32 PSUM sum over the key tile, added in BF16 to
    dq_local; each query head's dV and dK PSUM sums (over the query tiles of a group) added in
    BF16 to the KV head's accumulators, head after head (``_flash_attn_bwd_core``). One key tile
    of ``psum_fmax`` (512) keys holds all of them here."""
    bsz, hq, d, n = q.shape
    hk = k.shape[1]
    scale = 1 / np.sqrt(d)
    lse_q = lse.astype(np.float64).transpose(0, 1, 3, 2).reshape(bsz, hq, n)  # query t*128 + p
    causal = np.tril(np.ones((n, n), bool))
    dq = np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for b_ in range(bsz):
        for h in range(hq):
            kh = h // (hq // hk)
            qs = bf16(q[b_, h].astype(np.float64) * scale)  # [d, n]
            kk, vv = k[b_, kh].astype(np.float64), v[b_, kh].astype(np.float64)
            dyh, oh = dy[b_, h].astype(np.float64), o[b_, h].astype(np.float64)
            s_ = psum_matmul(qs, kk).astype(np.float32)  # [q, k]
            bias = (-bf16(lse_q[b_, h])).astype(np.float32)[:, None]
            p_ = np.where(causal, bf16(np.exp(s_ + bias)), 0.0)
            dp = psum_matmul(dyh, vv).astype(np.float32)
            rowsum = bf16(bf16(dyh * oh).astype(np.float32).sum(0, dtype=np.float32).astype(np.float64))
            ds = bf16((dp - rowsum.astype(np.float32)[:, None]) * p_.astype(np.float32))
            dq[b_, h] = bf16(psum_matmul(kk.T, ds.T).astype(np.float32) * np.float32(scale))
            dv[b_, kh] = bf16(dv[b_, kh] + psum_matmul(dyh.T, p_))
            dk[b_, kh] = bf16(dk[b_, kh] + psum_matmul(qs.T, ds))
    return dq, dk, dv


LIB_CASES.append(lib_case("core/attention/attention_bwd.py", "attention_bwd", _attn_bwd_inputs,
                      lambda a, kw, r, al: ref_attention_bwd(*a),
                      post=lambda o: tuple(o[:3])))
