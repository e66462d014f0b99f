# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Input checks shared by every quantizer, the refit stream and the twin (no format math here)."""

from __future__ import annotations

import math
import numbers

import torch

from nemo_ais.formats.grids import FP32_MAX

# Input dtypes every quantizer accepts; all of them are computed in fp32.
FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_finite(
    x: torch.Tensor,
    name: str,
    *,
    amax: torch.Tensor | None = None,
    what: str = "values",
    action: str = "refusing to quantize NaN/Inf into the FP8 engine",
) -> None:
    """Raise ``ValueError`` naming ``name``, the count and the first index of NaN/Inf in ``x``.

    ``amax``: an |x| reduction already computed (the finite case then checks it alone); ``what`` / ``action``: wording.
    """
    if not x.is_floating_point():
        return
    if x.dtype == torch.float64:  # computed in fp32: |x| > FLT_MAX would become inf there
        bad = ~(x.abs() <= FP32_MAX)
        if not bool(bad.any()):
            return
        kind, expected = "non-finite or beyond float32", f"{what} with |x| <= {FP32_MAX:.4g}"
    else:
        probe = x if amax is None else amax
        if bool(torch.isfinite(probe).all()):
            return
        bad = ~torch.isfinite(x)
        kind, expected = "non-finite", f"finite {what}"
    first = tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"{name}: got {int(bad.sum())} {kind} value(s) in {list(x.shape)} {x.dtype} "
        f"(first at index {first}: {x[first].item()}), expected {expected}" + (f"; {action}" if action else "")
    )


def check_e4m3_codes(codes: torch.Tensor, name: str, field: str) -> None:
    """Raise ``ValueError`` naming ``name``'s ``field``, the count and the first index of E4M3 NaN codes.

    E4M3 (``float8_e4m3fn``) has no infinity and one NaN pattern, S.1111.111 (0x7F / 0xFF); a quantizer never writes it
    (it saturates at 448), so a code tensor holding it is corrupt and would dequantize to NaN.
    """
    bad = (codes.view(torch.uint8) & 0x7F) == 0x7F
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name}: got {int(bad.sum())} E4M3 NaN code(s) (0x7F / 0xFF) in {field} {list(codes.shape)} (first at "
            f"index {first}), expected finite E4M3 codes; a quantizer never writes NaN: the tensor is corrupt"
        )


def check_last_dim(x: torch.Tensor, name: str, block: int, fmt: str) -> None:
    """``x`` is a floating ``[..., K]`` tensor with ``K % block == 0``, else ``ValueError``."""
    if x.dim() < 1 or x.dtype not in FLOAT_INPUTS:
        raise ValueError(
            f"{name}: got {list(x.shape)} {x.dtype}, expected a [..., K] floating tensor "
            f"({', '.join(str(d) for d in FLOAT_INPUTS)}) for {fmt}"
        )
    if x.shape[-1] % block:
        raise ValueError(
            f"{name}: got last dim K={x.shape[-1]} in {list(x.shape)}, expected K % {block} == 0 ({fmt} scales blocks "
            f"of {block} consecutive elements along the last dim; pad the tensor or keep it in high precision)"
        )


def check_amax(amax: float | torch.Tensor | None, name: str) -> torch.Tensor | None:
    """A given amax as 0-dim fp32 (None passes); ValueError unless one finite value >= 0."""
    if amax is None:
        return None
    if isinstance(amax, bool) or not isinstance(amax, numbers.Real | torch.Tensor):
        raise ValueError(f"{name}: got {amax!r}, expected one finite value >= 0 (the tensor's calibrated max |x|)")
    value = torch.as_tensor(amax, dtype=torch.float32)
    if value.numel() != 1 or not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(
            f"{name}: got {amax!r}, expected one finite value >= 0 (the tensor's calibrated "
            "max |x|; None computes max |x| of the tensor itself)"
        )
    return value.reshape(())
