"""MX (microscaling) instructions of ``nki.isa``: quantize_mx and nc_matmul_mx.

Semantics from the NKI reference pages "nki.isa.quantize_mx" and "nki.isa.nc_matmul_mx"
(NKI 0.7) and the "Trainium3 Architecture Guide for NKI" (Quad-MXFP8/MXFP4 matmul, MX
quantization), which say:

- an x4 data type packs four contiguous 8-bit (float8_e4m3fn_x4, float8_e5m2_x4: 32-bit
  containers) or 4-bit (float4_e2m1fn_x4: 16 bits) values; a [P, F] x4 tile holds
  [P, 4F] values. Here value j of a container sits in its bits [8j, 8j + 8) (FP8) or
  [4j, 4j + 4) (FP4), the little-endian order of four consecutive bytes.
- a scaling group is 32 values: 8 partitions x the 4 values of one x4 element. Its scale
  (uint8 or float8_e8m0fnu, the value 2 ** (byte - 127)) sits in the quadrant of the data:
  data partition p has its scales on partition 32 * (p // 32) + (p % 32) // 8 of the scale
  tile, in the free position of its x4 element.
- quantize_mx takes the largest magnitude of each group and uses a block scale two times
  larger than the OCP sample algorithm (2 ** (floor(log2(amax)) - emax + 1), emax of the
  element type: 8 for E4M3FN, 15 for E5M2), divides the group by it and casts to FP8.
- nc_matmul_mx: ``dst[M, N] = sum over partitions p and the 4 values j of
  dequant(stationary)[p, m, j] * dequant(moving)[p, n, j]`` (the contraction is 4x the
  partition count), accumulated in PSUM like nc_matmul.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import checks, rates
from .errors import ConstraintError
from .state import BLAS_LOCK
from .tensor import MemoryRegion, NkiTensor

_FP8_X4 = {"float8_e4m3fn_x4": (np.dtype(ml_dtypes.float8_e4m3fn), 8),
           "float8_e5m2_x4": (np.dtype(ml_dtypes.float8_e5m2), 15)}
_FP4_X4 = "float4_e2m1fn_x4"
# the 16 values of an E2M1 nibble (sign, 2 exponent bits, 1 mantissa bit; OCP MX spec)
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
# "nki.isa.nc_matmul_mx", Tile size: the moving free size is bounded by the 8 PSUM banks
MOVING_FMAX_MX = {"float32": 4096, "bfloat16": 8192}
_SCALE_DTYPES = (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu))


def x4_kind(dtype: np.dtype) -> str | None:
    """The name of an x4 packed dtype, or None."""
    names = dtype.names
    if names and len(names) == 1 and (names[0] in _FP8_X4 or names[0] == _FP4_X4):
        return names[0]
    return None


def unpack_x4(raw: np.ndarray) -> np.ndarray:
    """The float32 values of an x4 array, shape ``raw.shape + (4,)``."""
    kind = x4_kind(raw.dtype)
    bits = np.ascontiguousarray(raw[kind])
    if kind == _FP4_X4:
        nib = (bits[..., None].astype(np.uint32) >> (4 * np.arange(4, dtype=np.uint32))) & 0xF
        return _E2M1[nib]
    elem = _FP8_X4[kind][0]
    return bits.astype("<u4").view(np.uint8).reshape(bits.shape + (4,)).view(elem).astype(np.float32)


def pack_fp8_x4(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Four FP8 values per element (last axis of 4) into the x4 dtype ``dtype``."""
    elem = _FP8_X4[x4_kind(dtype)][0]
    b = np.ascontiguousarray(values.astype(elem)).view(np.uint8)
    return b.reshape(values.shape).view("<u4").reshape(values.shape[:-1]).astype(np.uint32).view(dtype)


def scale_values(raw: np.ndarray) -> np.ndarray:
    """2 ** (byte - 127) for uint8 or float8_e8m0fnu scale bytes (0xFF: NaN)."""
    b = np.asarray(raw).view(np.uint8).astype(np.int32)
    out = np.ldexp(np.float32(1), b - 127).astype(np.float32)
    return np.where(b == 255, np.float32(np.nan), out)


def scale_rows(partitions: int) -> np.ndarray:
    """The scale-tile partition of each data partition (its quadrant, then its 8-group)."""
    p = np.arange(partitions)
    return 32 * (p // 32) + (p % 32) // 8


def _check_scale(scale: NkiTensor, data: NkiTensor, where: str, role: str) -> None:
    checks.in_buffer(scale, [MemoryRegion.sbuf], where, role)
    if scale.dtype not in _SCALE_DTYPES:
        raise ConstraintError(f"{where}: {role} dtype {scale.dtype.name} must be uint8 or float8_e8m0fnu")
    need = int(scale_rows(data.partitions)[-1]) + 1
    if scale.partitions < need or checks.free_size(scale) != checks.free_size(data):
        raise ConstraintError(f"{where}: {role} {scale.shape} for data {data.shape}: needs at least {need} "
                              f"partitions (one per 8 data partitions, in the data's quadrant) and "
                              f"{checks.free_size(data)} free elements")


def _scale_row_views(scale: NkiTensor, partitions: int) -> list[tuple[NkiTensor, np.ndarray]]:
    """Per quadrant: the view of its used scale partitions and the data partitions they serve."""
    out = []
    for q0 in range(0, partitions, 32):
        groups = (min(partitions, q0 + 32) - q0 + 7) // 8
        out.append((scale[q0:q0 + groups], np.arange(groups)))
    return out


def _dequant(ctx, data: NkiTensor, scale: NkiTensor, op: str, name, role: str) -> np.ndarray:
    """[P, F, 4] float32 values of an MX tile times their group scales."""
    p = data.partitions
    vals = unpack_x4(np.asarray(ctx.read(data, op, name, role)).reshape(p, -1))
    rows = []
    for view, _ in _scale_row_views(scale, p):
        rows.append(scale_values(ctx.read(view, op, name, role + " scale")).reshape(view.partitions, -1))
    per_group = np.concatenate(rows, axis=0)  # quadrant-major: group g of quadrant q at row 4q + g
    q = np.arange(p)
    return vals * per_group[4 * (q // 32) + (q % 32) // 8][:, :, None]


def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize a float16/bfloat16 SBUF tile to MXFP8 data and scales on the Vector engine
    ("nki.isa.quantize_mx", NKI 0.7; NeuronCore-v4).

    src [P, F] (P a multiple of 32 up to 128, F a multiple of 4); dst [P, F // 4]
    float8_e4m3fn_x4 or float8_e5m2_x4; dst_scale uint8 / float8_e8m0fnu with one scale per
    group of 8 partitions x 4 values, in the quadrant of its partitions (see the module
    docstring). Values beyond the FP8 range after scaling saturate."""
    from .isa import _ctx, _done

    ctx = _ctx("quantize_mx")
    w = ctx.where("quantize_mx", name)
    dst, src = checks.tensor_arg(dst, w, "dst"), checks.tensor_arg(src, w, "src")
    dst_scale = checks.tensor_arg(dst_scale, w, "dst_scale")
    for role, v in (("src", src), ("dst", dst)):
        checks.in_buffer(v, [MemoryRegion.sbuf], w, role)
    kind = x4_kind(dst.dtype)
    if kind not in _FP8_X4:
        raise ConstraintError(f"{w}: dst dtype {dst.dtype} must be float8_e4m3fn_x4 or float8_e5m2_x4")
    if src.dtype not in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise ConstraintError(f"{w}: src dtype {src.dtype.name} must be float16 or bfloat16")
    p, f = src.partitions, checks.free_size(src)
    if p % 32 or p > 128 or f % 4:
        raise ConstraintError(f"{w}: src {src.shape}: partitions must be a multiple of 32 up to 128 and the "
                              f"free size a multiple of 4")
    if dst.partitions != p or checks.free_size(dst) != f // 4:
        raise ConstraintError(f"{w}: dst {dst.shape} must be [{p}, {f // 4}] for src {src.shape}")
    _check_scale(dst_scale, dst, w, "dst_scale")
    writes = [dst] + [v for v, _ in _scale_row_views(dst_scale, p)]
    if ctx.numerics:
        elem, emax = _FP8_X4[kind]
        x = np.asarray(ctx.read(src, "quantize_mx", name, "src"), np.float32).reshape(p // 8, 8, f // 4, 4)
        amax = np.abs(x).max(axis=(1, 3))  # [groups, F // 4]
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax + 1, -127)
        e = np.clip(e, -127, 127).astype(np.int32)
        q = x / np.ldexp(np.float32(1), e)[:, None, :, None]
        fmax = float(ml_dtypes.finfo(elem).max)
        q = np.clip(q, -fmax, fmax).reshape(p, f // 4, 4)
        ctx.write(dst, pack_fp8_x4(q, dst.dtype).reshape(dst.shape))
        byte = (e + 127).astype(np.uint8)  # [p // 8, F // 4]
        for i, (view, groups) in enumerate(_scale_row_views(dst_scale, p)):
            ctx.write(view, byte[4 * i + groups].view(dst_scale.dtype).reshape(view.shape))
    dur = rates.elementwise_seconds(f) / 4  # 4x Vector performance mode (Trainium3 guide)
    return _done("quantize_mx", name, ctx.issue("quantize_mx", name, "Vector", dur, [src], writes))


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """MXFP8/MXFP4 matrix multiplication with dequantization on the Tensor engine
    ("nki.isa.nc_matmul_mx", NKI 0.7; NeuronCore-v4).

    stationary [K, M] and moving [K, N] x4 tiles in SBUF (K a multiple of 32 up to 128
    partitions, 4K values of contraction; M even, at most 128; N at most 4096 for a float32
    dst, 8192 for bfloat16: the whole PSUM), their scales as quantize_mx writes them; dst [M, N]
    float32 or bfloat16 in PSUM. ``accumulate`` as nc_matmul: None adds into written PSUM
    elements (fresh ones start at zero), True adds, False overwrites. tile_position and
    tile_size (row tiling) do not change the result or the timing."""
    from .isa import _ctx, _done

    ctx = _ctx("nc_matmul_mx")
    w = ctx.where("nc_matmul_mx", name)
    dst = checks.tensor_arg(dst, w, "dst")
    stationary, moving = checks.tensor_arg(stationary, w, "stationary"), checks.tensor_arg(moving, w, "moving")
    stationary_scale = checks.tensor_arg(stationary_scale, w, "stationary_scale")
    moving_scale = checks.tensor_arg(moving_scale, w, "moving_scale")
    checks.in_buffer(stationary, [MemoryRegion.sbuf], w, "stationary")
    checks.in_buffer(moving, [MemoryRegion.sbuf], w, "moving")
    checks.in_buffer(dst, [MemoryRegion.psum], w, "dst")
    for role, v in (("stationary", stationary), ("moving", moving)):
        if x4_kind(v.dtype) is None:
            raise ConstraintError(f"{w}: {role} dtype {v.dtype} must be an x4 packed MX type")
    k, m, n = stationary.partitions, checks.free_size(stationary), checks.free_size(moving)
    checks.partition_dim(k, w, f"stationary shape {stationary.shape}")
    if moving.partitions != k:
        raise ConstraintError(f"{w}: contraction (partition) dims differ: stationary {stationary.shape} vs "
                              f"moving {moving.shape}")
    if k % 32:
        raise ConstraintError(f"{w}: contraction partitions {k} must be a multiple of 32 (at most 128)")
    if m > rates.GEMM_STATIONARY_FMAX or m % 2:
        raise ConstraintError(f"{w}: stationary free size {m} must be even and at most {rates.GEMM_STATIONARY_FMAX}")
    if dst.partitions != m or checks.free_size(dst) != n:
        raise ConstraintError(f"{w}: result shape {dst.shape} != [{m}, {n}]")
    if dst.dtype not in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
        raise ConstraintError(f"{w}: result dtype {dst.dtype.name} must be float32 or bfloat16")
    # the moving free size may span the whole PSUM (8 banks): 4096 float32 or 8192 bfloat16
    # results ("nki.isa.nc_matmul_mx", Tile size)
    n_max = MOVING_FMAX_MX[dst.dtype.name]
    if n > n_max:
        raise ConstraintError(f"{w}: moving free size {n} > {n_max} for a {dst.dtype.name} result")
    _check_scale(stationary_scale, stationary, w, "stationary_scale")
    _check_scale(moving_scale, moving, w, "moving_scale")
    reads = [stationary, moving] + [v for v, _ in _scale_row_views(stationary_scale, k)] + \
        [v for v, _ in _scale_row_views(moving_scale, k)]
    if ctx.numerics:
        a = _dequant(ctx, stationary, stationary_scale, "nc_matmul_mx", name, "stationary")
        b = _dequant(ctx, moving, moving_scale, "nc_matmul_mx", name, "moving")
        with BLAS_LOCK:
            r = np.einsum("pmj,pnj->mn", a, b, dtype=np.float32)
        if accumulate is None or accumulate:
            if accumulate:
                prev = np.asarray(ctx.read(dst, "nc_matmul_mx", name, "accumulating dst"), np.float32)
            else:
                prev = np.where(dst.written_mask(), np.asarray(dst.array(), np.float32), np.float32(0))
            r = prev.reshape(m, n) + r
        ctx.write(dst, r.reshape(dst.shape))
    if accumulate is None or accumulate:
        reads = reads + [dst]
    # 4 values per PE per cycle: the time of a BF16 matmul of the same [M, N] (Trainium3 guide)
    dur = rates.matmul_seconds(m, n, np.dtype(ml_dtypes.bfloat16))
    return _done("nc_matmul_mx", name, ctx.issue("nc_matmul_mx", name, "Tensor", dur, reads, [dst]))
