# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""MXFP8: E4M3 elements in blocks of 32 along the last dim, one UE8M0 (power-of-two) scale each.

What vLLM's ModelOpt MXFP8 loader takes and NeMo-RL main streams (``is_mx``), for ``x [..., K]``, ``K % 32 == 0``:

1. Per block, ``E = ceil(log2(amax_b / 448))`` exactly, in [-127, 127]; all-zero: ``E = -127`` (NVIDIA's rule, not
   OCP's ``floor(log2 amax_b) - 8``: :func:`~nemo_ais.formats.grids.e8m0_block_exponent`).
2. Scale byte ``E + 127``; codes ``e4m3(clamp(x * 2^-E, ±448))`` (exact product).

Dequantization: ``fp32(q) * 2^(b - 127)``. NeMo-RL main rewrites byte 0 to 1 for its TRT-LLM kernel (same values).
:func:`quantize_mxfp8` is bit-equal to :func:`quantize_mxfp8_reference` (C++ on CPU, Triton on CUDA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from nemo_ais.formats.base import Format, RefitPairs, stack_label, weight_pairs
from nemo_ais.formats.checks import check_e4m3_codes, check_finite, check_last_dim
from nemo_ais.formats.dispatch import kernel_for, triton_quantize
from nemo_ais.formats.grids import E4M3_MAX, E8M0_BIAS, Scratch, e8m0_block_exponent, e8m0_values, pow2
from nemo_ais.formats.mx import MX_BLOCK, check_mx_scale, mx_bands
from nemo_ais.rules.format_geometry import GEOMETRY


@dataclass(frozen=True)
class MXFP8Tensor:
    """``data``: E4M3 ``[..., K]`` (vLLM ``weight``); ``scale``: UE8M0 ``[..., K/32]``."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tensor that was quantized."""
        return tuple(self.data.shape)


def quantize_mxfp8_reference(x: torch.Tensor) -> MXFP8Tensor:
    """Reference of :func:`quantize_mxfp8`: steps 1-2 of the module doc, written plainly."""
    check_last_dim(x, "x", MX_BLOCK, "MXFP8")
    check_finite(x, "x", action="refusing to quantize NaN/Inf")
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    expo = e8m0_block_exponent(blocks.abs().amax(-1), E4M3_MAX)
    scaled = blocks * pow2(-expo).unsqueeze(-1)
    data = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(x.shape)
    return MXFP8Tensor(data, (expo + E8M0_BIAS).to(torch.uint8))


def _quantize_fused(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(codes, scale bytes)`` of ``x2 [R, K]`` by the fused CPU kernel; None where it cannot."""
    ext = kernel_for(x2)
    if ext is None:
        return None
    q, scale, finite = ext.quantize_mxfp8(x2)
    return (q.view(torch.float8_e4m3fn), scale) if bool(finite) else None


def _saturate_into(y: torch.Tensor, out: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """:func:`mx_bands`'s ``encode`` for MXFP8 (``scratch`` unused): saturate, cast to E4M3."""
    return out.copy_(y.clamp_(-E4M3_MAX, E4M3_MAX))  # E4M3 codes, round to nearest even


def quantize_mxfp8(x: torch.Tensor, *, name: str = "x") -> MXFP8Tensor:
    """MXFP8 quantization of ``x [..., K]`` (module doc); empty in, empty out.

    Raises:
        ValueError: ``K % 32 != 0``, a non-floating ``x``, or non-finite values.
    """
    check_last_dim(x, name, MX_BLOCK, "MXFP8")
    fast = triton_quantize("quantize_mxfp8_triton", x, name=name)
    if fast is not None:  # CUDA: one Triton launch (nemo_ais.formats.dispatch), same bits
        return fast
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(math.prod(lead), k)
    fused = _quantize_fused(x2)  # CPU: the fused kernel, same bits (NaN: raise below)
    if fused is None:
        data = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x.device)
        fused = data, mx_bands(x, x2, name, E4M3_MAX, data, _saturate_into)
    return MXFP8Tensor(fused[0].view(*lead, k), fused[1].view(*lead, k // MX_BLOCK))


def dequantize_mxfp8(q: MXFP8Tensor, *, name: str = "q", check: bool = True) -> torch.Tensor:
    """``fp32(data) * 2^(scale - 127)`` per block, fp32 (ValueError: bad tensors, byte 255, E4M3 NaN codes).

    ``check=False`` skips the NaN-code check (a host read) for codes a quantizer has just written.
    """
    if q.data.dtype != torch.float8_e4m3fn or q.data.dim() < 1:
        raise ValueError(f"{name}: got data {list(q.data.shape)} {q.data.dtype}, expected float8_e4m3fn [..., K]")
    check_mx_scale(q.data, q.scale, 1, name)
    if check:
        check_e4m3_codes(q.data, name, "data")
    k = q.data.shape[-1]
    blocks = q.data.to(torch.float32).view(*q.data.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    return (blocks * e8m0_values(q.scale).unsqueeze(-1)).view(q.data.shape)


def fake_quantize_mxfp8(x: torch.Tensor, *, name: str = "x") -> torch.Tensor:
    """``dequantize_mxfp8(quantize_mxfp8(x))``: fp32 ``[..., K]``."""
    return dequantize_mxfp8(quantize_mxfp8(x, name=name), name=name, check=False)


def _fake(t: torch.Tensor, *, amax: Any = None, name: str = "x", knobs: Any = None) -> torch.Tensor:
    return fake_quantize_mxfp8(t, name=name)


def _refit_pairs(
    name: str, w: torch.Tensor, config: Any, *, weight_amax: Any = None, input_scale: Any = None
) -> RefitPairs:
    """ModelOpt MXFP8 pairs; scale byte 0 becomes ``config.mxfp8_zero_scale_byte``."""
    q = quantize_mxfp8(w, name=stack_label(name))
    if config.mxfp8_zero_scale_byte:
        q.scale.masked_fill_(q.scale == 0, config.mxfp8_zero_scale_byte)
    scale_name = config.mxfp8_scale_name or "weight_scale"
    return weight_pairs(name, [("weight", q.data), (scale_name, q.scale)])


def _refit_bytes(numel: int, shape: tuple[int, ...], config: Any) -> int:
    return numel + numel // MX_BLOCK


MXFP8 = Format(
    "mxfp8",
    GEOMETRY["mxfp8"].block,
    "E4M3",
    "UE8M0 power-of-two scale per 1x32 block: 2^ceil(log2(amax / 448)) in [2^-127, 2^127] (NVIDIA's rule, not OCP's floor)",
    reference=quantize_mxfp8_reference,
    quantize=quantize_mxfp8,
    dequantize=dequantize_mxfp8,
    fake_weight=_fake,
    fake_activation=_fake,
    refit_pairs=_refit_pairs,
    refit_bytes=_refit_bytes,
)
"""MXFP8 (W8A8, vLLM ``is_mx``): weights and inputs in 1x32 E8M0-scaled blocks."""
