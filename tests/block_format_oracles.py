# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Independent float64 oracles for NVFP4, MXFP8 and MXFP4 (imports nothing from nemo_ais).

Written from the format definitions (docs/low_precision.md and the shared conventions
note), one block at a time with plain loops, never padded or banded:

* E2M1: the eight grid values 0, 0.5, 1, 1.5, 2, 3, 4, 6; a magnitude rounds to the
  nearest grid value by comparing its distance to each of them in float64; a tie goes to
  the even code (or toward zero, for the MXFP4 variant); above 6 it saturates.
* E4M3 encoding and decoding come from ``fp8_oracles`` (itself checked against every E4M3
  code and every rounding midpoint).
* Every fp32 operation of a convention is one float64 operation followed by a rounding to
  float32, exact for +, -, *, / of float32 operands (``fp8_oracles`` module doc).
* UE8M0 exponents: the smallest integer E with ``amax <= element_max * 2^E``, found by
  counting up in exact float64 arithmetic (no log2).
"""

from __future__ import annotations

import numpy as np
from fp8_oracles import decode_e4m3, encode_e4m3, f32

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0
E2M1_MAX = 6.0


def e2m1_code(a: float, ties_toward_zero: bool = False) -> int:
    """Magnitude code 0..7 of ``a >= 0``: the nearest grid value; a tie to the even code.

    Above 6 the value saturates to 6 (code 7); distances are not compared there (for huge
    ``a`` they are equal in float64).
    """
    if a >= E2M1_MAX:
        return 7
    best, best_dist = 0, float("inf")
    for code, value in enumerate(E2M1_GRID):
        dist = abs(a - value)
        tie = dist == best_dist
        if dist < best_dist or (tie and not ties_toward_zero and code % 2 == 0):
            best, best_dist = code, dist
    return best


def e2m1_signed_value(code: int) -> float:
    """float64 value of a signed E2M1 code (bit 3 = sign; code 8 is -0.0)."""
    magnitude = E2M1_GRID[code & 7]
    return -magnitude if code & 8 else magnitude


def _pack(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [rows, K] -> bytes [rows, K/2]: element 2j in the low nibble, 2j+1 high."""
    rows, k = codes.shape
    out = np.zeros((rows, k // 2), dtype=np.uint8)
    for i in range(rows):
        for j in range(k // 2):
            out[i, j] = int(codes[i, 2 * j]) | (int(codes[i, 2 * j + 1]) << 4)
    return out


def _e4m3_round(v: float) -> float:
    """RNE of an in-range value onto E4M3 (its float64 value)."""
    return float(decode_e4m3(encode_e4m3(np.array([v])))[0])


def nvfp4_oracle(x: np.ndarray, amax: float | None = None, rows_per_block: int = 1):
    """ModelOpt export rule for a 2-D float32 array ``x [N, K]``.

    Returns ``(data uint8 [N, K/2], block_scale bytes uint8 [N, K/16], global_scale float32,
    dequantized float32 [N, K])``.
    """
    x = np.asarray(x, dtype=np.float32)
    n, k = x.shape
    amax = float(np.max(np.abs(x))) if amax is None and x.size else float(amax or 0.0)
    s_g = float(f32(float(f32(amax)) / (E2M1_MAX * E4M3_MAX)))
    if s_g == 0.0:
        s_g = 1.0
    six_sg = float(f32(E2M1_MAX * s_g))
    codes = np.zeros((n, k), dtype=np.uint8)
    scale_bytes = np.zeros((n, k // 16), dtype=np.uint8)
    deq = np.zeros((n, k), dtype=np.float32)
    for i in range(n):
        tile_rows = range(i - i % rows_per_block, min(i - i % rows_per_block + rows_per_block, n))
        for b in range(k // 16):
            block = x[i, 16 * b : 16 * b + 16].astype(np.float64)
            amax_b = max(abs(float(x[t, 16 * b + j])) for t in tile_rows for j in range(16))
            r = float(f32(amax_b / six_sg))
            r = 1.0 if r == 0.0 else min(max(r, 2.0**-9), E4M3_MAX)
            s_b = _e4m3_round(r)
            scale_bytes[i, b] = encode_e4m3(np.array([s_b]))[0]
            d = float(f32(s_b * s_g))
            for j in range(16):
                y = float(f32(block[j] / d)) if d != 0.0 else 0.0
                code = e2m1_code(abs(y)) | (8 if block[j] < 0 else 0)
                codes[i, 16 * b + j] = code
                deq[i, 16 * b + j] = f32(e2m1_signed_value(code) * d)
    return _pack(codes), scale_bytes, np.float32(s_g), deq


def mx_exponent(amax: float, element_max: float) -> int:
    """Smallest E in [-127, 127] with ``amax <= element_max * 2^E`` (all-zero block: -127)."""
    if amax == 0.0:
        return -127
    e = -127
    while e < 127 and amax > element_max * 2.0**e:
        e += 1
    return e


def mxfp8_oracle(x: np.ndarray):
    """MXFP8 (NVIDIA ceil rule) of a 2-D float32 array: ``(data bytes [N, K], scale [N, K/32], deq)``."""
    x = np.asarray(x, dtype=np.float32)
    n, k = x.shape
    data = np.zeros((n, k), dtype=np.uint8)
    scale = np.zeros((n, k // 32), dtype=np.uint8)
    deq = np.zeros((n, k), dtype=np.float32)
    for i in range(n):
        for b in range(k // 32):
            block = x[i, 32 * b : 32 * b + 32].astype(np.float64)
            e = mx_exponent(float(np.max(np.abs(block))), E4M3_MAX)
            scale[i, b] = e + 127
            q = np.clip(f32(block * 2.0**-e).astype(np.float64), -E4M3_MAX, E4M3_MAX)
            data[i, 32 * b : 32 * b + 32] = encode_e4m3(q)
            deq[i, 32 * b : 32 * b + 32] = f32(decode_e4m3(encode_e4m3(q)) * 2.0**e)
    return data, scale, deq


def mxfp4_oracle(x: np.ndarray, ties_toward_zero: bool = False):
    """MXFP4 of a 2-D float32 array: ``(data uint8 [N, K/2], scale [N, K/32], deq)``."""
    x = np.asarray(x, dtype=np.float32)
    n, k = x.shape
    codes = np.zeros((n, k), dtype=np.uint8)
    scale = np.zeros((n, k // 32), dtype=np.uint8)
    deq = np.zeros((n, k), dtype=np.float32)
    for i in range(n):
        for b in range(k // 32):
            block = x[i, 32 * b : 32 * b + 32].astype(np.float64)
            e = mx_exponent(float(np.max(np.abs(block))), E2M1_MAX)
            scale[i, b] = e + 127
            for j in range(32):
                y = float(f32(block[j] * 2.0**-e))
                code = e2m1_code(abs(y), ties_toward_zero) | (8 if block[j] < 0 else 0)
                codes[i, 32 * b + j] = code
                deq[i, 32 * b + j] = f32(e2m1_signed_value(code) * 2.0**e)
    return _pack(codes), scale, deq
