# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Value grids of the block-scaled formats: E2M1 elements, E4M3 and UE8M0 scales, nibble packing.

=============  ==============================================================  ==========
type           values                                                          used by
=============  ==============================================================  ==========
E2M1 (4 bit)   codes 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign           NVFP4, MXFP4
E4M3 (8 bit)   ``torch.float8_e4m3fn``: max 448, subnormal quantum 2^-9         FP8, MXFP8,
                                                                               NVFP4 scales
UE8M0 (8 bit)  byte b -> 2^(b - 127), b in [0, 254]; 255 is NaN; no zero        MX scales
=============  ==============================================================  ==========

E2M1 rounding is to nearest, ties to the even code, saturating at ±6 (:func:`e2m1_codes_reference`). The fast path
:func:`e2m1_encode_` is bit-equal by construction: every threshold is an fp32 whose low 20 bits are zero, so the signed
code of ``y`` depends only on its class ``idx = (b >> 20) + ((b + 0xFFFFF) >> 20) + 4096`` (``b``: the int32 bits of
``y``), and a table of the 8191 classes (checked when built) gives it with integer passes and one gather. Two codes
share a byte, the even element in the LOW nibble (ModelOpt, FlashInfer, vLLM's ``break_fp4_bytes``).
"""

from __future__ import annotations

import functools
import math
import sys

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
FP32_MAX = float(torch.finfo(torch.float32).max)  # every format computes in float32
E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7
E8M0_BIAS = 127
E8M0_NAN = 255
# Thresholds between neighbouring codes: (threshold, a tie goes up: the upper code is even).
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                    (3.5, True), (5.0, False))  # fmt: skip
_BAND_ELEMS = 1 << 18  # fp32 elements of a quantizer's per-band working copy (1 MiB: L2)
#  On a GPU the banded loop is launch-bound: up to 2^26 elements are one band (1 MiB bands were 25-76x slower on an
#  H200, docs/benchmarks.md "quant_cuda"); the cap bounds the temporaries next to a colocated vLLM during a refit.
_BAND_ELEMS_GPU = 1 << 26
# E2M1 class index (module doc): idx = (b >> 20) + ((b + 0xFFFFF) >> 20) + 4096 in [0, 8190]
_CLASS_SHIFT = 20
_CLASS_LOW = (1 << _CLASS_SHIFT) - 1
_CLASS_OFFSET = 4096
_N_CLASSES = 8191
_E2M1_SIGNED = torch.tensor([*E2M1_GRID, *(-v for v in E2M1_GRID)], dtype=torch.float32)


def e2m1_codes_reference(a: torch.Tensor, *, ties_toward_zero: bool = False) -> torch.Tensor:
    """Reference E2M1 magnitude codes (uint8 0..7, 7 above 6) of ``a >= 0``; ``ties_toward_zero``: no tie goes up."""
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for threshold, tie_up in _E2M1_THRESHOLDS:
        up = tie_up and not ties_toward_zero
        code += (a >= threshold) if up else (a > threshold)
    return code


class Scratch:
    """Reusable buffers of a banded quantizer: ``get(name, shape, dtype)`` grows on demand."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A ``shape`` view of buffer ``name`` (contents undefined)."""
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)


def _class_members() -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest fp32 of each of the 8191 classes (module doc), by class index."""
    j = torch.arange(_N_CLASSES, dtype=torch.int64) - _CLASS_OFFSET
    f = torch.div(j, 2, rounding_mode="floor")  # floor(b / 2^20)
    odd = j - 2 * f  # 1: the bit patterns strictly inside (f, f + 1) * 2^20
    base = f * (1 << _CLASS_SHIFT)
    first, last = base + odd, base + odd * _CLASS_LOW
    return first.to(torch.int32).view(torch.float32), last.to(torch.int32).view(torch.float32)


@functools.cache
def _e2m1_tables(ties_toward_zero: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 signed code, fp32 signed value) of every class on ``device`` (-0.0 gets code 8)."""
    first, last = _class_members()

    def signed_codes(v: torch.Tensor) -> torch.Tensor:
        mag = e2m1_codes_reference(v.abs(), ties_toward_zero=ties_toward_zero)
        return mag | (torch.signbit(v).to(torch.uint8) << 3)

    codes = signed_codes(first)
    if not torch.equal(codes, signed_codes(last)):
        raise AssertionError("E2M1 class table: a class spans a rounding threshold")
    values = _E2M1_SIGNED.index_select(0, codes.to(torch.int32))
    return codes.to(device), values.to(device)


def e2m1_class_index_(y: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """Class index (module doc) of contiguous fp32 ``y``, in place: int32 in [0, 8190]."""
    b = y.view(torch.int32)
    torch.bitwise_right_shift(b, _CLASS_SHIFT, out=tmp)  # floor(b / 2^20)
    b.add_(_CLASS_LOW).bitwise_right_shift_(_CLASS_SHIFT)  # ceil(b / 2^20)
    return b.add_(tmp).add_(_CLASS_OFFSET)


def e2m1_encode_(
    y: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor, *, ties_toward_zero: bool = False
) -> torch.Tensor:
    """Signed E2M1 codes (uint8, sign bit 8) of contiguous fp32 ``y`` into ``out`` (consumes ``y``).

    ``tmp``: int32 of ``y``'s shape; ``ties_toward_zero``: ModelOpt's MXFP4 ``cast_fp4``.
    """
    codes, _ = _e2m1_tables(ties_toward_zero, y.device)
    idx = e2m1_class_index_(y, tmp)
    return torch.index_select(codes, 0, idx.view(-1), out=out.view(-1)).view(out.shape)


def e2m1_pack_(y: torch.Tensor, out: torch.Tensor, scratch: Scratch, *, ties_toward_zero: bool = False) -> torch.Tensor:
    """:func:`e2m1_encode_` of fp32 ``y [R, K]`` packed two a byte into ``out [R, K/2]``."""
    h, k = y.shape
    codes = scratch.get("codes", (h, k), torch.uint8)
    tmp = scratch.get("tmp", (h, k), torch.int32)
    e2m1_encode_(y, codes, tmp, ties_toward_zero=ties_toward_zero)
    return pack_code_pairs(codes, out, scratch.get("pairs", (h, k // 2), torch.int16))


def e2m1_signed_values_(y: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """fp32 signed E2M1 values of contiguous fp32 ``y`` into ``tmp`` (as :func:`e2m1_encode_`)."""
    _, values = _e2m1_tables(False, y.device)
    idx = e2m1_class_index_(y, tmp.view(torch.int32))
    return torch.index_select(values, 0, idx.view(-1), out=tmp.view(-1)).view(tmp.shape)


def e2m1_codes(a: torch.Tensor, *, ties_toward_zero: bool = False) -> torch.Tensor:
    """uint8 magnitude codes of fp32 ``a >= 0`` (fast path; ``a`` is not modified)."""
    y = a.to(torch.float32).contiguous().clone().add_(0.0)  # -0.0 -> +0.0: code 0, not 8
    out = torch.empty(y.shape, dtype=torch.uint8, device=y.device)
    tmp = torch.empty(y.shape, dtype=torch.int32, device=y.device)
    return e2m1_encode_(y, out, tmp, ties_toward_zero=ties_toward_zero).bitwise_and_(7)


def pack_code_pairs(codes: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes ``[..., K]`` into ``out [..., K/2]`` via int16 pairs (= pack_nibbles)."""
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is
        return out.copy_(pack_nibbles(codes))
    pairs = codes.view(torch.int16)
    torch.bitwise_right_shift(pairs, 4, out=tmp).bitwise_or_(pairs)
    return out.copy_(tmp)


def band_elems(device: torch.device, cpu_elems: int | None = None) -> int:
    """fp32 elements of a band on ``device``: ``cpu_elems`` (cache-sized) on CPU, 2^26 on a GPU."""
    if device.type != "cpu":
        return _BAND_ELEMS_GPU
    return _BAND_ELEMS if cpu_elems is None else cpu_elems


def row_bands(rows: int, k: int, multiple: int = 1, *, device: torch.device | None = None) -> list[tuple[int, int]]:
    """``[(r0, r1), ...]`` covering ``rows`` rows of length ``k`` in bands of ``multiple`` rows."""
    elems = _BAND_ELEMS if device is None else band_elems(device)
    height = max(multiple, elems // max(k, 1) // multiple * multiple)
    return [(r0, min(r0 + height, rows)) for r0 in range(0, rows, height)]


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of signed E2M1 codes (uint8 0..15; code 8 is -0.0)."""
    table = _E2M1_SIGNED.to(codes.device)
    return table.index_select(0, codes.reshape(-1).to(torch.int32)).view(codes.shape)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (K even) -> bytes ``[..., K/2]``, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(data: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: bytes ``[..., K/2]`` -> codes ``[..., K]``."""
    pairs = torch.stack((data & 0xF, data >> 4), dim=-1)
    return pairs.view(*data.shape[:-1], 2 * data.shape[-1])


def e8m0_ceil_exponent(ratio: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(ratio))`` for fp32 ``ratio > 0`` exactly via ``frexp`` (int32; 0 gives 0)."""
    mant, expo = torch.frexp(ratio)
    return expo - (mant == 0.5).to(expo.dtype)


def e8m0_block_exponent(block_amax: torch.Tensor, element_max: float) -> torch.Tensor:
    """MX scale exponent ``ceil(log2(amax_b / element_max))`` per block, int32 in [-127, 127].

    NVIDIA's rule (FlashInfer, TE, ModelOpt), not OCP's: nothing saturates; all-zero: -127. Exact, from amax's
    bits: amax = 2^q (1 + m / 2^23) and element_max = 2^p c give q - p + [1 + m / 2^23 > c] (the fp32 quotient
    rounds onto 2^-127 just above it). A subnormal amax is below 2^-127 once divided: -127.
    """
    mant, p = math.frexp(element_max)  # element_max = (2 mant) 2^(p - 1)
    c_bits = round((2 * mant - 1) * 2**23)
    b = block_amax.to(torch.float32).view(torch.int32)
    field = b >> 23
    expo = field - (E8M0_BIAS + p - 1) + ((b & 0x7FFFFF) > c_bits).to(torch.int32)
    expo = torch.where(field > 0, expo, torch.full_like(expo, -E8M0_BIAS))
    return expo.clamp_(-E8M0_BIAS, E8M0_BIAS)


def pow2(expo: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^expo`` of int32 ``expo``, exactly (2^-127 is an fp32 subnormal)."""
    return torch.ldexp(torch.ones(expo.shape, dtype=torch.float32, device=expo.device), expo)


def e8m0_values(scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^(b - 127)`` of UE8M0 bytes ``b`` in [0, 254], exactly."""
    return pow2(scale.to(torch.int32) - E8M0_BIAS)
