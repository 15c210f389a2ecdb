"""Cases of benchmarks/aws_kernels.py: nki-library's kernels on MX (microscaling) operands."""

from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from aws_case import BF16, Case, bf16, lib_case
from aws_cases_moe import silu_f32


MX_CASES: list[Case] = []


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


MX_CASES.append(lib_case("experimental/mxfp_subkernels/mxfp_load_utils.py", "mxfp_load_performance_wrapper",
                      lambda rng, r: ((rng.standard_normal((128, 1024)).astype(BF16)
                                       * np.exp2(rng.integers(-8, 8, (128, 1))).astype(BF16),), {}),
                      lambda a, kw, r, al: ref_mx_swizzled_quantize(a[0]), post=_mx_data_scales))


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


def mx_random(rng: np.random.Generator, shape: tuple, kind: str = "fp8") -> tuple[np.ndarray, np.ndarray]:
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


def x4_values(data: np.ndarray) -> np.ndarray:
    """float64 values [..., 4] of x4 data (FP8 E4M3FN bytes or FP4 E2M1 nibbles)."""
    if data.dtype.names[0].startswith("float4"):
        bits = np.ascontiguousarray(data).view(np.uint16)
        return _E2M1_VALUES[(bits[..., None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF]
    bits = np.ascontiguousarray(data).view("<u4")
    return bits[..., None].view(np.uint8).reshape(bits.shape + (4,)).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _mx_deq(data: Any, scale16: Any) -> np.ndarray:
    """float64 values [128, ..., 4] of a kernel's x4 tile with its 16 compact scale rows."""
    return x4_values(np.asarray(data)) * _scale_of_partition(np.asarray(scale16))[..., None]


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
    w, _ = mx_random(rng, (e, 128, 2, h // 512, i), "fp4")
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
        w, _ = mx_random(rng, (e, 128, i // 512, h), "fp8")
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
MX_CASES += [
    lib_case("core/moe/moe_tkg/gate_up_projection_mx.py", "load_gate_up_weight_scale_bias", _load_gate_up_inputs,
         lambda a, kw, r, al: ref_load_gate_up(*a, **kw), wrap=_wrap_load_gate_up,
         post=_raw_outputs),
    lib_case("core/moe/moe_tkg/down_projection_mx.py", "load_broadcast_down_weight_scale_bias", _load_down_inputs(True),
         lambda a, kw, r, al: ref_load_down(*a, **kw), wrap=_wrap_load_down,
         post=_raw_outputs),
]

def _mx_operand(rng: np.random.Generator, shape: tuple, kind: str,
                exp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x4 data [128, ...], its [128, ...] SBUF scale tile, float64 values [128, ..., 4]):
    scale exponents exp - 1 .. exp + 1."""
    data, vals = mx_random(rng, shape, kind)
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


# MX element formats: (ml_dtypes type, emax_elem = exponent of the largest normal), OCP
# Microscaling Formats (MX) Specification v1.0, sec. 5.3 (FP8 E4M3: emax 8) and 5.3.3 (FP4 E2M1: emax 2)
MX_ELEMENTS = {"fp8": (ml_dtypes.float8_e4m3fn, 8), "fp4": (ml_dtypes.float4_e2m1fn, 2)}


def mx_quantize(v: np.ndarray, kind: str = "fp8", nki_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MX quantization of blocks of 32 values (the last axis of ``v``, 32 long): (the values the
    block's elements then stand for, scale * element, float64 [..., 32]; the E8M0 scale bytes [...]).

    OCP MX v1.0 sec. 6.3 (conversion from a float vector): shared_exp = floor(log2(max |v_i|)) -
    emax_elem, X = 2 ** shared_exp (E8M0, bias 127, clamped to its range), P_i = v_i / X cast to
    the element format, round to nearest even, clamped to its largest normal. ``nki_scale``: NKI's
    ``nki.isa.quantize_mx`` uses "a block scale that is two times larger, reserving additional range
    for rounding the largest values in each group without saturation" (its reference page), so
    shared_exp is one higher. A block of zeros gets the smallest scale (2 ** -127)."""
    elem, emax = MX_ELEMENTS[kind]
    amax = np.abs(v).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax + int(nki_scale), -127)
    e = np.clip(e, -127, 127)
    fmax = float(ml_dtypes.finfo(elem).max)
    q = np.clip(v / np.exp2(e)[..., None], -fmax, fmax).astype(np.float32).astype(elem).astype(np.float64)
    return q * np.exp2(e)[..., None], (e + 127).astype(np.uint8)


def psum_mx(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum over the H/512 tiles k of w[:, k].T x[:, k] (MX values [128, K, M, 4] and [128, K, N, 4])
    as ``nc_matmul_mx`` adds them into a BF16 PSUM tile: each tile's product over (partition,
    x4 value) in FP32, the running sum rounded to BF16 ("nki.isa.nc_matmul_mx": dst float32 or
    bfloat16 in PSUM)."""
    acc = np.zeros((w.shape[2], x.shape[2]))
    for k in range(w.shape[1]):
        a = np.ascontiguousarray(w[:, k], np.float32)
        part = np.einsum("pmj,pnj->mn", a, np.ascontiguousarray(x[:, k], np.float32), dtype=np.float32)
        acc = bf16(acc + part.astype(np.float64))
    return acc


def ref_gate_up_mx(xq, xs, wg, wu, wgs, wus, bg, bu):
    """silu(W_g^T x + b_g) * (W_u^T x + b_u) with the MX operands dequantized, rounded and
    quantized where gate_up_projection_mx_shard_I does: the contraction runs over H = (partition,
    H/512 tile, x4 value) into a BF16 PSUM tile per 128 I (``psum_mx``); weight column c of I/512
    tile k is I index 512 k + c, output partition c % 128, x4 value c // 128 (the "[16_I * 8_I,
    I/512, T], 4_I packed" layout of the docstring; the bias likewise); the bias adds on the
    PSUM eviction into BF16 (``out_sb``, ``intermediate_tile_sb``), silu and the gate x up product
    are BF16, and ``quantize_mx`` turns the product into MXFP8 E4M3, one scale per 8 partitions
    x the 4 values of a token's x4 element. Output: the values the quantized result stands
    for, [128, I/512, T, 4]."""
    x = _mx_deq(xq, _rows16(xs))  # [128, H/512, T, 4]
    out = []
    for w, ws, b in ((wg, wgs, bg), (wu, wus, bu)):
        wv = _mx_deq(w, _rows16(ws))  # [128, H/512, I, 4]
        y = np.concatenate([psum_mx(wv[:, :, c0:c0 + 128], x) for c0 in range(0, wv.shape[2], 128)])  # [I, T]
        k = y.shape[0] // 512
        y = y.reshape(k, 4, 128, -1).transpose(2, 0, 3, 1)  # [128, I/512, T, 4]
        out.append(bf16(y + b.astype(np.float64)[:, :, None, :]))
    g, u = out
    prod = bf16(silu_f32(g) * u)  # [128, I/512, T, 4]
    blocks = prod.reshape(16, 8, *prod.shape[1:]).transpose(0, 2, 3, 1, 4)  # [16, I/512, T, 8, 4]
    vals, _ = mx_quantize(blocks.reshape(*blocks.shape[:3], 32))
    return vals.reshape(blocks.shape).transpose(0, 3, 1, 2, 4).reshape(prod.shape)


def _gate_up_mx_out(o: Any) -> np.ndarray:
    return _mx_deq(o[0], o[1])


# the reference quantizes the BF16 product as the kernel does, so both stand for the same
# MXFP8 values; they are judged at the eps of the BF16 values the kernel quantizes (an FP8
# output's own eps, 1/8, could not refuse a 1% error)
MX_CASES.append(lib_case("core/moe/moe_tkg/gate_up_projection_mx.py", "gate_up_projection_mx_shard_I",
                      _gate_up_mx_inputs, lambda a, kw, r, al: ref_gate_up_mx(*a),
                      wrap=_wrap_gate_up_mx, post=_gate_up_mx_out, eps_dtype=BF16))

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
    I/512 tile, x4 value) of both MX operands, rounded where down_projection_mx rounds: each
    I/512 tile's ``nc_matmul_mx`` product (FP32, the 512 products of one PE pass) adds into a
    BF16 PSUM tile (``out_psum``, dtype bfloat16: "use 2 * fmax with bf16 PSUM"); the bias adds
    on the PSUM eviction into the BF16 ``expert_out_tile_sb``; the FP32 affinity multiplies it
    into the BF16 ``out_sb``."""
    a = _mx_deq(act, _rows16(act_s)).astype(np.float32)  # [128, I/512, T, 4], exact in FP32
    wv = _mx_deq(w, _rows16(ws)).astype(np.float32)  # [128, I/512, H, 4]
    psum = np.zeros((a.shape[2], wv.shape[2]))
    for k in range(a.shape[1]):
        part = np.einsum("pmj,pnj->mn", a[:, k], wv[:, k], dtype=np.float32).astype(np.float64)
        psum = bf16(psum + part)
    y = bf16(psum + bias.astype(np.float64))
    return bf16(aff.astype(np.float32).astype(np.float64)[:, expert_idx:expert_idx + 1] * y)


MX_CASES.append(lib_case("core/moe/moe_tkg/down_projection_mx.py", "down_projection_mx", _down_mx_inputs,
                      lambda a, kw, r, al: ref_down_mx(*a, **kw), wrap=_wrap_down_mx))
