# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Value grids of the block-scaled formats: E2M1 elements, E4M3 and UE8M0 scales, nibble packing.

=============  ==============================================================  ==========
type           values                                                          used by
=============  ==============================================================  ==========
E2M1 (4 bit)   codes 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign           NVFP4, MXFP4
E4M3 (8 bit)   ``torch.float8_e4m3fn``: max 448, subnormal quantum 2^-9         FP8, MXFP8
               elements; NVFP4 block scales (unsigned use)
UE8M0 (8 bit)  byte b -> 2^(b - 127), b in [0, 254]; 255 is NaN; no zero        MX scales
=============  ==============================================================  ==========

Rounding onto E2M1 is round-to-nearest, ties to the even code (0.25 -> 0, 0.75 -> 1,
1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at ±6 (``_cast_fp4`` in
ModelOpt, ``cvt.rn.satfinite.e2m1x2`` in the kernels). :func:`e2m1_codes_reference` states
the rule as seven thresholds; :func:`e2m1_codes` is the fast path, bit-equal to it (tested):
with ``a = min(|y|, 6)`` the code is ``min(rne(2a), rne(a) + 2, rne(a / 2) + 4)``, one
exactly rounded piece per binade of the grid (spacing 0.5 below 2, 1 below 4, 2 above),
each ``rne`` a ``torch.round`` (half to even) of an exactly scaled value.

Two codes share a byte, the even element in the LOW nibble: ``byte = c[2j] | c[2j+1] << 4``
(ModelOpt, FlashInfer, vLLM's ``break_fp4_bytes``).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "E2M1_GRID",
    "E2M1_MAX",
    "E4M3_MAX",
    "E8M0_BIAS",
    "E8M0_NAN",
    "Scratch",
    "e2m1_code_magnitudes_",
    "e2m1_codes",
    "e2m1_codes_reference",
    "e2m1_round_",
    "e2m1_values",
    "e8m0_block_exponent",
    "e8m0_ceil_exponent",
    "e8m0_values",
    "pack_nibbles",
    "pack_signed_codes",
    "row_bands",
    "to_uint8",
    "unpack_nibbles",
]

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7
E8M0_BIAS = 127
E8M0_NAN = 255
_SIGN_BIT = 8
# Rounding thresholds between neighbouring codes: (threshold, a tie goes up). A tie goes to
# the even code: up when the upper neighbour's code is even.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                    (3.5, True), (5.0, False))  # fmt: skip
_FOUR = torch.tensor(4.0)
_BAND_ELEMS = 1 << 20  # fp32 elements of a quantizer's per-band working copy (4 MiB)
_E2M1_SIGNED = torch.tensor([*E2M1_GRID, *(-v for v in E2M1_GRID)], dtype=torch.float32)


def e2m1_codes_reference(a: torch.Tensor, *, ties_toward_zero: bool = False) -> torch.Tensor:
    """Reference: E2M1 magnitude codes (uint8 0..7) of ``a >= 0`` by counting thresholds.

    ``code = #{t : a > t} + #{t tie-up : a == t}`` over the seven midpoints of the grid;
    values above 6 get code 7 (saturation). With ``ties_toward_zero`` no tie goes up.
    Plain and slow: the definition of the rule.
    """
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for threshold, tie_up in _E2M1_THRESHOLDS:
        up = tie_up and not ties_toward_zero
        code += (a >= threshold) if up else (a > threshold)
    return code


def _round_half_down_(t: torch.Tensor) -> torch.Tensor:
    """``ceil(t - 1/2)`` in place: nearest integer, ties toward zero, for ``t >= 0`` (exact)."""
    return t.sub_(0.5).ceil_()


class Scratch:
    """Reusable working buffers of a banded quantizer, allocated once per call.

    A fresh multi-MiB temporary per band costs page faults on every allocation (glibc
    returns large blocks to the OS); the fast paths take their temporaries from here.
    ``get(name, shape, dtype)`` returns a view of the buffer ``name``, grown on demand.
    """

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


def _work(
    scratch: Scratch | None,
    name: str,
    like: torch.Tensor,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A working buffer shaped like ``like`` (or ``shape`` / ``dtype``), from ``scratch`` if given."""
    shape = tuple(like.shape) if shape is None else shape
    dtype = like.dtype if dtype is None else dtype
    if scratch is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    return scratch.get(name, shape, dtype)


def e2m1_round_(
    a: torch.Tensor, *, ties_toward_zero: bool = False, scratch: Scratch | None = None
) -> torch.Tensor:
    """E2M1 magnitude codes of fp32 ``a >= 0`` as fp32 values 0..7; ``a`` is consumed.

    ``a`` is clamped to 6 in place (saturation), then
    ``code = min(rne(2a), rne(a) + 2, rne(a / 2) + 4)`` (module doc): the fast path of
    :func:`e2m1_codes_reference`, bit-equal to it (tested on every tie and grid point).
    ``ties_toward_zero``: a tie rounds to the smaller magnitude instead (ModelOpt's MXFP4
    ``cast_fp4``); every piece then rounds with ``ceil(t - 1/2)``, exact for ``t >= 0``.
    The result lives in ``scratch`` buffer ``"k"`` when ``scratch`` is given.
    """
    rnd = _round_half_down_ if ties_toward_zero else torch.Tensor.round_
    a.clamp_(max=E2M1_MAX)
    k_fine = rnd(torch.mul(a, 2.0, out=_work(scratch, "k", a)))  # spacing 0.5: codes 0..4
    k_mid = rnd(_work(scratch, "k_mid", a).copy_(a)).add_(2.0)  # spacing 1: codes 4..6
    k_top = rnd(a.mul_(0.5)).add_(4.0)  # spacing 2: codes 6..7 for a in [4, 6]
    return torch.minimum(torch.minimum(k_fine, k_mid, out=k_fine), k_top, out=k_fine)


def e2m1_codes(a: torch.Tensor, *, ties_toward_zero: bool = False) -> torch.Tensor:
    """uint8 magnitude codes of fp32 ``a >= 0`` (fast path; ``a`` is not modified)."""
    return to_uint8(e2m1_round_(a.clone(), ties_toward_zero=ties_toward_zero))


def e2m1_code_magnitudes_(k: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """Grid values of fp32 magnitude codes ``k`` in 0..7, in place: ``max(k/2, k - 2, 2k - 8)``."""
    half = torch.mul(k, 0.5, out=_work(scratch, "half", k))
    twice = torch.mul(k, 2.0, out=_work(scratch, "k_mid", k)).sub_(8.0)
    return torch.maximum(torch.maximum(k.sub_(2.0), half, out=k), twice, out=k)


def pack_signed_codes(
    k: torch.Tensor, y: torch.Tensor, out: torch.Tensor, scratch: Scratch | None = None
) -> torch.Tensor:
    """Pack fp32 magnitude codes ``k [..., K]`` with the signs of ``y`` into ``out`` uint8 ``[..., K/2]``.

    ``code = k + 8 * signbit(y)`` (the callers have turned -0.0 inputs into +0.0, so the
    sign bit is ``x < 0``), then ``byte = code[2j] + 16 * code[2j + 1]``, formed in fp32
    (exact integers) and converted once (through int32: several times faster on CPU).
    """
    sign4 = torch.copysign(_FOUR.to(y.device), y, out=_work(scratch, "k_mid", y))
    code = k.add_(4.0).sub_(sign4)
    half_shape = tuple(out.shape)
    pair = torch.add(
        code[..., 0::2], code[..., 1::2], alpha=16, out=_work(scratch, "half", k, half_shape)
    )
    return out.copy_(_work(scratch, "pair_int", k, half_shape, torch.int32).copy_(pair))


def to_uint8(v: torch.Tensor) -> torch.Tensor:
    """fp32 holding integers in [0, 255] -> uint8 (through int32: several times faster on CPU)."""
    return v.to(torch.int32).to(torch.uint8)


def row_bands(rows: int, k: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``[(r0, r1), ...]`` covering ``rows`` rows of length ``k`` in bands of ~4 MiB of fp32.

    Band heights are multiples of ``multiple`` (whole 2-D scale tiles), so a band's working
    copy stays in cache while a quantizer makes its passes over it.
    """
    height = max(multiple, _BAND_ELEMS // max(k, 1) // multiple * multiple)
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
    """``ceil(log2(ratio))`` for fp32 ``ratio > 0``, exactly (``frexp``, never a rounded log2).

    ``ratio = m * 2^e`` with ``m`` in [0.5, 1): ``log2(ratio)`` lies in [e - 1, e), so the
    ceiling is ``e`` unless ``m == 0.5`` (a power of two, ``e - 1``). int32; ``ratio == 0``
    gives ``e = 0`` (callers handle all-zero blocks first).
    """
    mant, expo = torch.frexp(ratio)
    return expo - (mant == 0.5).to(expo.dtype)


def e8m0_block_exponent(block_amax: torch.Tensor, element_max: float) -> torch.Tensor:
    """MX scale exponent ``E = ceil(log2(amax_b / element_max))`` per block, int32 in [-127, 127].

    NVIDIA's rule (FlashInfer, Transformer Engine, ModelOpt), not OCP's ``floor(log2 amax)``
    minus the element's max exponent: the block max then lands in (max/2, max] and nothing
    saturates. An all-zero block gets -127 (scale byte 0), as do blocks below 2^-127.
    """
    ratio = block_amax / torch.full_like(block_amax, element_max)  # tensor / tensor: one rounding
    expo = e8m0_ceil_exponent(ratio)
    expo = torch.where(block_amax == 0, torch.full_like(expo, -E8M0_BIAS), expo)
    return expo.clamp_(-E8M0_BIAS, E8M0_BIAS)


def e8m0_values(scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^(b - 127)`` of UE8M0 bytes ``b`` in [0, 254] (exact; 2^-127 is an fp32 subnormal)."""
    expo = scale.to(torch.int32) - E8M0_BIAS
    return torch.ldexp(torch.ones(scale.shape, dtype=torch.float32, device=scale.device), expo)
