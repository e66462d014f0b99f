# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What MXFP8 and MXFP4 share (OCP MX: blocks of 32 along the last dim, UE8M0 scales): banded path and scale check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nemo_ais.formats.checks import check_finite
from nemo_ais.formats.grids import E8M0_BIAS, E8M0_NAN, Scratch, e8m0_block_exponent, pow2, row_bands
from nemo_ais.rules.format_geometry import MX_BLOCK


def mx_bands(
    x: torch.Tensor,
    x2: torch.Tensor,
    name: str,
    element_max: float,
    out: torch.Tensor,
    encode: Callable[[torch.Tensor, torch.Tensor, Scratch], Any],
    *,
    plus_zero: bool = False,
) -> torch.Tensor:
    """The banded PyTorch path of an MX format: the scale bytes of ``x2 = x [R, K]``.

    Per band of rows, ``y = x * 2^-E`` in one fp32 scratch copy, whose codes ``encode(y, out[band], scratch)`` writes;
    ``plus_zero``: ``x + 0.0`` (-0.0 -> +0.0). ValueError (naming ``name``) on non-finite input.
    """
    rows, k = x2.shape
    scale = torch.empty(rows, k // MX_BLOCK, dtype=torch.uint8, device=x.device)
    finite = torch.ones((), dtype=torch.bool, device=x.device)
    scratch = Scratch(x.device)
    with torch.no_grad():
        for r0, r1 in [] if x.numel() == 0 else row_bands(rows, k, device=x.device):
            y = scratch.get("x", (r1 - r0, k), torch.float32)
            if plus_zero:
                torch.add(x2[r0:r1], 0.0, out=y)
            else:
                y.copy_(x2[r0:r1])
            blocks = y.view(r1 - r0, k // MX_BLOCK, MX_BLOCK)
            block_amax = torch.maximum(blocks.amax(-1), blocks.amin(-1).neg_())
            finite &= torch.isfinite(block_amax).all()
            expo = e8m0_block_exponent(block_amax, element_max)
            blocks.mul_(pow2(-expo).unsqueeze(-1))  # exact but for subnormal results
            encode(y, out[r0:r1], scratch)
            scale[r0:r1] = (expo + E8M0_BIAS).to(torch.uint8)
    if not bool(finite):
        check_finite(x, name, action="refusing to quantize NaN/Inf")
    return scale


def check_mx_scale(data: torch.Tensor, scale: torch.Tensor, block_k: int, name: str) -> None:
    """``scale`` is uint8 ``[..., K/32]`` for ``data [..., block_k * n]``, with no NaN byte 255."""
    k = data.shape[-1] * block_k if data.dim() else 0
    expected = (*data.shape[:-1], k // MX_BLOCK)
    if scale.dtype != torch.uint8 or tuple(scale.shape) != expected or k % MX_BLOCK:
        raise ValueError(
            f"{name}: got scale {list(scale.shape)} {scale.dtype} for data {list(data.shape)} "
            f"{data.dtype}, expected uint8 {list(expected)} (one UE8M0 byte per 32 elements)"
        )
    if bool((scale == E8M0_NAN).any()):
        first = tuple(int(i) for i in (scale == E8M0_NAN).nonzero()[0])
        raise ValueError(f"{name}: scale byte 255 (UE8M0 NaN) at index {first}, expected bytes in [0, 254]")
