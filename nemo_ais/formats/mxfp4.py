# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""MXFP4 (a documented variant): E2M1 elements in blocks of 32, one UE8M0 scale each.

For ``x [..., K]``, ``K % 32 == 0`` (``docs/low_precision.md``):

1. Per block: ``E = ceil(log2(amax_b / 6))`` in [-127, 127]; all-zero: ``E = -127``.
2. ``code = e2m1(|x| * 2^-E)`` saturating at 6, sign bit ``x < 0``; two codes per byte.

Dequantization: ``E2M1(code) * 2^(b - 127)``. ``round_ties_toward_zero=True`` is ModelOpt's ``cast_fp4`` tie rule
(default: ties to even, as FlashInfer).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from nemo_ais.formats.base import Format
from nemo_ais.formats.checks import check_finite, check_last_dim
from nemo_ais.formats.dispatch import kernel_for, triton_quantize
from nemo_ais.formats.grids import (
    E2M1_MAX,
    E8M0_BIAS,
    e2m1_codes_reference,
    e2m1_pack_,
    e2m1_values,
    e8m0_block_exponent,
    e8m0_values,
    pack_nibbles,
    pow2,
    unpack_nibbles,
)
from nemo_ais.formats.mx import MX_BLOCK, check_mx_scale, mx_bands
from nemo_ais.rules.format_geometry import GEOMETRY

_SIGN = 0x8


@dataclass(frozen=True)
class MXFP4Tensor:
    """``data``: uint8 ``[..., K/2]``, two E2M1 codes a byte; ``scale``: UE8M0 ``[..., K/32]``."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tensor that was quantized, ``(..., K)``."""
        return (*self.data.shape[:-1], 2 * self.data.shape[-1])


def quantize_mxfp4_reference(x: torch.Tensor, *, round_ties_toward_zero: bool = False) -> MXFP4Tensor:
    """Reference of :func:`quantize_mxfp4`: steps 1-2 of the module doc, written plainly."""
    check_last_dim(x, "x", MX_BLOCK, "MXFP4")
    check_finite(x, "x", action="refusing to quantize NaN/Inf")
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    expo = e8m0_block_exponent(blocks.abs().amax(-1), E2M1_MAX)
    y = blocks * pow2(-expo).unsqueeze(-1)
    code = e2m1_codes_reference(y.abs(), ties_toward_zero=round_ties_toward_zero)
    code |= (blocks < 0).to(torch.uint8) * _SIGN
    return MXFP4Tensor(pack_nibbles(code.reshape(x.shape)), (expo + E8M0_BIAS).to(torch.uint8))


def quantize_mxfp4(x: torch.Tensor, *, round_ties_toward_zero: bool = False, name: str = "x") -> MXFP4Tensor:
    """MXFP4 quantization of ``x [..., K]`` (module doc); bit-equal to the reference.

    Raises:
        ValueError: ``K % 32 != 0``, a non-floating ``x``, or non-finite values.
    """
    check_last_dim(x, name, MX_BLOCK, "MXFP4")
    fast = triton_quantize("quantize_mxfp4_triton", x, round_ties_toward_zero=round_ties_toward_zero, name=name)
    if fast is not None:  # CUDA: one Triton launch (nemo_ais.formats.dispatch), same bits
        return fast
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(math.prod(lead), k)
    fused = _quantize_fused(x2, round_ties_toward_zero)  # CPU: same bits (NaN: raise below)
    if fused is None:
        data = torch.empty(x2.shape[0], k // 2, dtype=torch.uint8, device=x.device)
        encode = functools.partial(e2m1_pack_, ties_toward_zero=round_ties_toward_zero)
        fused = data, mx_bands(x, x2, name, E2M1_MAX, data, encode, plus_zero=True)  # -0.0 gets code 0, not 8
    return MXFP4Tensor(fused[0].view(*lead, k // 2), fused[1].view(*lead, k // MX_BLOCK))


def _quantize_fused(x2: torch.Tensor, ties_toward_zero: bool):
    """``(packed, scale)`` of ``x2 [R, K]`` by the fused CPU kernel; None if it cannot, or NaN."""
    ext = kernel_for(x2)
    if ext is None:
        return None
    packed, scale, finite = ext.quantize_mxfp4(x2, ties_toward_zero)
    return (packed, scale) if bool(finite) else None


def dequantize_mxfp4(q: MXFP4Tensor, *, name: str = "q") -> torch.Tensor:
    """``E2M1(code) * 2^(scale - 127)`` per block, fp32 (ValueError: bad tensors, byte 255)."""
    if q.data.dtype != torch.uint8 or q.data.dim() < 1:
        raise ValueError(f"{name}: got data {list(q.data.shape)} {q.data.dtype}, expected uint8 [..., K/2]")
    check_mx_scale(q.data, q.scale, 2, name)
    k = 2 * q.data.shape[-1]
    values = e2m1_values(unpack_nibbles(q.data)).view(*q.data.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    return (values * e8m0_values(q.scale).unsqueeze(-1)).view(*q.data.shape[:-1], k)


MXFP4 = Format(
    "mxfp4",
    GEOMETRY["mxfp4"].block,
    "E2M1",
    "UE8M0 power-of-two scale per 1x32 block: 2^ceil(log2(amax / 6)) in [2^-127, 2^127] (NVIDIA's rule, not OCP's floor)",
    reference=quantize_mxfp4_reference,
    quantize=quantize_mxfp4,
    dequantize=dequantize_mxfp4,
)
"""MXFP4 (documented variant: no rollout format, no refit)."""
