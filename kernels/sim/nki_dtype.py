"""``nki.dtype``: the NKI data types ("Supported Data Types", NKI 0.7), the same objects as
the dtypes of ``nki.language`` (NumPy / ml_dtypes dtypes; tfloat32 is simulated as float32;
the x4 packed types are 32-bit containers)."""

from __future__ import annotations

from .language import (bfloat16, bool_, float4_e2m1fn_x4, float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4,  # noqa: F401
                       float8_e5m2, float8_e5m2_x4, float8_e8m0fnu, float16, float32, int8, int16, int32,
                       tfloat32, uint8, uint16, uint32)
