"""Cases of benchmarks/aws_kernels.py: nki-library's kernels on MX (microscaling) operands."""

from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from aws_case import BF16, Case, lib_case
from aws_cases_moe import moe_inputs, moe_out


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
# below their group's largest lose more); BF16 PSUM and activation add ~1/256. An FP8 output
# cannot show a 1% error per element: the check stays "loose" until the reference quantizes as
# the kernel does
MX_CASES.append(lib_case("core/moe/moe_tkg/gate_up_projection_mx.py", "gate_up_projection_mx_shard_I",
                      _gate_up_mx_inputs, lambda a, kw, r, al: ref_gate_up_mx(*a),
                      wrap=_wrap_gate_up_mx, post=_gate_up_mx_out, eps_dtype=ml_dtypes.float8_e4m3fn))

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
# significant bits, a few roundings): beyond the default check, no wider tolerance claimed
MX_CASES.append(lib_case("core/moe/moe_tkg/down_projection_mx.py", "down_projection_mx", _down_mx_inputs,
                      lambda a, kw, r, al: ref_down_mx(*a, **kw), wrap=_wrap_down_mx))

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
    """moe_inputs' routing and hidden states with random MX weights (scales 2 ** -8 .. 2 ** -6)."""
    def make(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        (x, aff, _, _, _, pos, b2e), _ = moe_inputs(block)(rng, r, h=h, e=e, i=i)
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
# them exact, so outputs differ by up to 1/16 of their operands, which the per-element check
# refuses until the reference quantizes as the kernel does
MX_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx",
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


MX_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_block_mx.py", "bwmm_shard_on_block_mx",
                      _with_clamps(_moe_mx_inputs(128)),
                      lambda a, kw, r, al: (ref_moe_mx(*a, **kw), np.zeros(a[0].shape)), lnc=2,
                      # [2, T+1, H]: the programs' partial outputs, reduced into [0] with [1] zeroed
                      # (reduce_outputs' docstring); the padding row dropped
                      post=lambda o: (np.asarray(o)[0, :-1].astype(np.float64), np.asarray(o)[1]),
                      eps_dtype=(BF16, None)))
MX_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_I_mx.py", "blockwise_mm_shard_intermediate_mx_hybrid",
                      _hybrid_mx(_moe_mx_inputs()), lambda a, kw, r, al: ref_moe_mx(*a[1:], **kw), lnc=2, post=moe_out,
                      eps_dtype=BF16))
