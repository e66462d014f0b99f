# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Independent float64 oracles for blockwise FP8 E4M3 quantization (imports nothing from nemo_ais).

Every fp32 operation of the convention (docs/low_precision.md) is reproduced as one float64
operation followed by a rounding to float32. For +, -, *, / of float32 operands this is
exactly the correctly rounded float32 result: float64 carries p' = 53 >= 2p + 2 = 50
bits, so the double rounding is innocuous (Figueroa, "When is double rounding
innocuous?", 1995). The E4M3 encoder is written from the format definition (1 sign,
4 exponent bits with bias 7, 3 mantissa bits, no infinities, max 448, subnormal quantum
2^-9) and rounds to nearest, ties to even. Tiles are processed one at a time with plain
loops and are never padded, so the oracle shares no code path with the implementation.
"""

from __future__ import annotations

import math

import numpy as np

E4M3_MAX = 448.0
_MIN_NORMAL_EXP = -6  # smallest normal E4M3 is 2^-6
_MANT_BITS = 3
_BIAS = 7


def f32(v):
    """Round float64 value(s) to float32 (one correctly rounded fp32 operation)."""
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def encode_e4m3(v: np.ndarray) -> np.ndarray:
    """Bytes of E4M3 (fn) codes for values already within [-448, 448], RNE."""
    v = np.asarray(v, dtype=np.float64)
    sign = np.signbit(v).astype(np.uint8) << 7
    a = np.abs(v)
    assert np.all(a <= E4M3_MAX), "encode_e4m3 expects saturated input"
    _, e2 = np.frexp(a)  # a = f * 2^e2, f in [0.5, 1)  =>  floor(log2 a) = e2 - 1
    e = np.maximum(e2 - 1, _MIN_NORMAL_EXP)
    quantum = np.ldexp(1.0, e - _MANT_BITS)
    n = np.rint(a / quantum)  # a / quantum is exact (power-of-two quantum); rint = half-even
    r = n * quantum  # rounded magnitude (may carry into the next binade: fine below)
    _, r2 = np.frexp(r)
    normal = (r2 - 1 >= _MIN_NORMAL_EXP) & (r > 0)
    er = np.where(normal, r2 - 1, _MIN_NORMAL_EXP)
    exp_field = np.where(normal, er + _BIAS, 0)
    mant = np.where(normal, r / np.ldexp(1.0, er - _MANT_BITS) - 8, r / 2.0**-9)
    code = (exp_field.astype(np.int64) << _MANT_BITS) + mant.astype(np.int64)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """float64 values of E4M3 (fn) byte codes (0x7F / 0xFF are NaN)."""
    c = np.asarray(codes, dtype=np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp_field = (c >> _MANT_BITS) & 0xF
    mant = c & 0x7
    val = np.where(exp_field == 0, mant * 2.0**-9, (1 + mant / 8.0) * np.ldexp(1.0, exp_field - _BIAS))
    val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    return sign * val


def _pow2_ceil(v: float) -> float:
    """Smallest power of two >= v > 0, by log2 then an exact correction step."""
    p = 2.0 ** math.ceil(math.log2(v))
    while p / 2 >= v:
        p /= 2
    while p < v:
        p *= 2
    return p


def _pow2_floor(v: float) -> float:
    """Largest power of two <= v (v > 0; v = inf gives inf)."""
    if math.isinf(v):
        return v
    p = 2.0 ** math.floor(math.log2(v))
    while p > v:
        p /= 2
    while p * 2 <= v:
        p *= 2
    return p


def tile_scale(amax: float, family: str, eps: float, ue8m0: bool) -> tuple[float, float]:
    """(dequant scale s, quant multiplier m) of one tile, each an exact float32 value."""
    amax = float(f32(max(amax, float(f32(eps)))))
    if amax == 0.0:  # only with eps = 0: TE's rule, scale 1
        return 1.0, 1.0
    fmax = float(np.finfo(np.float32).max)
    if family == "multiplier":
        m = float(f32(E4M3_MAX / amax))
        if ue8m0:
            m = _pow2_floor(m)
        m = min(m, fmax)
        return float(f32(1.0 / m)), m
    s = float(f32(amax / E4M3_MAX))
    if ue8m0:
        s = _pow2_ceil(s)
    if s == 0.0:
        s = float(np.finfo(np.float32).smallest_normal)
    return s, min(float(f32(1.0 / s)), fmax)


def quantize_oracle(
    x: np.ndarray, block: tuple[int, int], family: str, eps: float, ue8m0: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Oracle of a 2-D float32 array: (uint8 E4M3 codes [N, K], float32 scales [nb, kb])."""
    x = np.asarray(x, dtype=np.float32)
    n, k = x.shape
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    scales = np.zeros((nb, kb), dtype=np.float32)
    q32 = np.zeros((n, k), dtype=np.float64)
    for i in range(nb):
        for j in range(kb):
            rows, cols = slice(i * bn, (i + 1) * bn), slice(j * bk, (j + 1) * bk)
            tile = x[rows, cols].astype(np.float64)
            amax = float(np.max(np.abs(tile))) if tile.size else 0.0
            s, m = tile_scale(amax, family, eps, ue8m0)
            scales[i, j] = s
            q = tile / s if family == "divide" else tile * m
            q32[rows, cols] = np.clip(f32(q).astype(np.float64), -E4M3_MAX, E4M3_MAX)
    return encode_e4m3(q32), scales


def dequantize_oracle(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """float32 ``q * s`` per tile from byte codes and scales (one fp32 multiply)."""
    bn, bk = block
    s_full = np.repeat(np.repeat(scales.astype(np.float64), bn, 0), bk, 1)
    s_full = s_full[: codes.shape[0], : codes.shape[1]]
    return f32(decode_e4m3(codes) * s_full)


def first_mismatch(actual: np.ndarray, expected: np.ndarray, what: str) -> str | None:
    """DeepGEMM-style report of the first differing element, or None if equal."""
    if actual.shape != expected.shape:
        return f"{what}: shape {actual.shape} != expected {expected.shape}"
    diff = np.argwhere(actual != expected)
    if diff.size == 0:
        return None
    idx = tuple(int(i) for i in diff[0])
    return f"{what}: {len(diff)} mismatch(es), first at index {idx}: got {actual[idx]!r}, expected {expected[idx]!r}"


# Transformer Engine's exact-match suite (fp8_conventions.md): the shapes every quantizer
# backend is checked on, bit for bit.
TE_SHAPES = [(128, 128), (256, 272), (303, 300), (305, 256), (2000, 2000), (2048, 2000), (2000, 1024)]
