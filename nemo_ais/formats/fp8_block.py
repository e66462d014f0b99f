# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Blockwise FP8 (E4M3) quantization in pure PyTorch, bit-exact by construction.

vLLM's W8A8 block FP8 (DeepSeek-V3 style); conventions in ``docs/low_precision.md``:

1. Tile the last two dims into ``(bn, bk)`` blocks (weights 128x128, activations 1x128), zero-padding partial tiles.
2. ``amax`` per tile in fp32, floored at ``eps`` (``eps = 0``: TE's rule, amax 0 -> scale 1).
3. Dequant scale ``s`` and code ``q`` by one of three families (:data:`FAMILY_FORMULAS`; they differ by at most one FP8
   step). ``ue8m0``: ``s = 2^ceil(log2(amax / 448))`` or, ``"multiplier"``, ``m = 2^floor(log2(448 / amax))``, taken
   exactly with ``frexp``.
4. Clamp ``q`` to ``[-448, 448]`` and cast to ``float8_e4m3fn`` (round to nearest even).

``s`` is the DEQUANT multiplier (vLLM's ``weight_scale_inv``). Non-finite input raises. On CPU one fused C++ loop, on
CUDA one Triton launch, bit-equal. Empty input is defined: empty codes and scales of ``ceil(dim / tile)`` per tiled dim.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F

from nemo_ais.formats.base import Format, RefitPairs, stack_label, weight_pairs
from nemo_ais.formats.checks import FLOAT_INPUTS, check_e4m3_codes, check_finite
from nemo_ais.formats.dispatch import kernel_for, triton_quantize
from nemo_ais.formats.grids import E4M3_MAX, FP32_MAX, band_elems, e8m0_ceil_exponent, pow2
from nemo_ais.rules.format_geometry import (
    GEOMETRY,
    RENAMED_FAMILIES as RENAMED_FAMILIES,
    Fp8Family,
    refuse_renamed_family,
)

FAMILY_FORMULAS = {
    "reciprocal": "s = amax / 448, q = x * (1 / s): multiply by the reciprocal (DeepGEMM, vLLM weights)",
    "divide": "s = amax / 448, q = x / s: divide by the scale (vLLM per-token-group activations)",
    "multiplier": "m = 448 / amax, q = x * m, s = 1 / m: the multiplier first (Transformer Engine, NeMo-RL)",
}
"""What each scale formula family does; its name says it."""
Family = Fp8Family
"""A ``family`` argument: one of :data:`FAMILY_FORMULAS` (a config field: :data:`nemo_ais.refit.config.Family`)."""

FP8_DTYPE = torch.float8_e4m3fn
_FAMILIES = tuple(FAMILY_FORMULAS)
_BAND_ELEMS = 1 << 20  # fp32 elements of the per-band working copy (4 MiB)


def check_blockwise_args(name: str, family: str, eps: float, block: tuple[int, int]) -> None:
    """Validate the scalar arguments shared by every entry point."""
    refuse_renamed_family(family)
    if family not in _FAMILIES:
        raise ValueError(f"{name}: family={family!r} is invalid: expected one of {_FAMILIES}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name}: eps={eps!r} is invalid: expected a finite float >= 0")
    if len(block) != 2 or any(not isinstance(b, int) or b <= 0 for b in block):
        raise ValueError(f"{name}: block={block!r} is invalid: expected two positive ints")


def check_weight_args(x: torch.Tensor, name: str, family: str, eps: float, block: tuple[int, int]) -> None:
    """:func:`check_blockwise_args`, and ``x`` a floating ``[N, K]`` or ``[E, N, K]``."""
    check_blockwise_args(name, family, eps, block)
    if x.dim() not in (2, 3) or x.dtype not in FLOAT_INPUTS:
        raise ValueError(
            f"{name}: got {list(x.shape)} {x.dtype}, expected a 2-D [N, K] or 3-D [E, N, K] "
            f"floating tensor ({', '.join(str(d) for d in FLOAT_INPUTS)})"
        )


def _saturate_(q: torch.Tensor) -> torch.Tensor:
    """Clamp fp32 ``q`` to [-448, 448] in place: PyTorch's E4M3 cast need not saturate."""
    return q.clamp_(-E4M3_MAX, E4M3_MAX)


_SMALLEST_NORMAL = torch.finfo(torch.float32).smallest_normal


def _scales(amax: torch.Tensor, family: str, eps: float, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tile (dequant scale s, multiplier m) in fp32; a floored amax of 0 gets s = m = 1."""
    amax = amax.clamp_min(eps) if eps > 0 else amax
    zero = amax == 0
    one = torch.ones_like(amax)
    if family == "multiplier":
        # one fp32 division, not `E4M3_MAX / amax` (two roundings); inf (amax < 448 / FLT_MAX) -> FLT_MAX, as TE: 2^127
        m = torch.full_like(amax, E4M3_MAX).div_(amax).clamp_max_(FP32_MAX)
        m = pow2(torch.frexp(m)[1] - 1) if ue8m0 else m  # largest power of two <= m
        m = torch.where(zero, one, m)  # <= FLT_MAX: clamped above, and a power of two <= m
        return torch.reciprocal(m), m
    # Tensor / tensor: CUDA divides by a Python scalar as a multiply by its reciprocal, which moved 376 of 2M codes by
    # one FP8 step on an H100 (tests/gpu/test_te_backend.py).
    s = amax / torch.full_like(amax, E4M3_MAX)
    s = pow2(e8m0_ceil_exponent(s)) if ue8m0 else s
    s = torch.where(zero, one, s)
    # A tiny amax (eps = 0) gives a subnormal or zero s, whose reciprocal overflows the FLT_MAX clamp (codes 256x too
    # small at amax 5e-39); the smallest normal 2^-126 has the exact reciprocal 2^126 and holds every code.
    s = torch.where(s < _SMALLEST_NORMAL, torch.full_like(s, _SMALLEST_NORMAL), s)
    return s, torch.reciprocal(s).clamp_max(FP32_MAX)


def _quantize_tiles(
    x: torch.Tensor, x3: torch.Tensor, block: tuple[int, int], family: str, eps: float, ue8m0: bool, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [E, N, K], s [E, nb, kb])`` of ``x3``, band by band in one zero-padded fp32 scratch."""
    e, n, k = x3.shape
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    dev = x3.device
    q8 = torch.empty(e, n, k, dtype=FP8_DTYPE, device=dev)
    s = torch.empty(e, nb, kb, dtype=torch.float32, device=dev)
    if x3.numel() == 0:  # no tile: empty codes, one (absent) scale per tile
        return q8, s
    # whole tile rows, ~_BAND_ELEMS fp32 elements on CPU, all on a GPU
    rows_per_band = bn * max(1, band_elems(dev, _BAND_ELEMS) // (bn * kb * bk))
    scratch = torch.zeros(min(rows_per_band, nb * bn), kb * bk, dtype=torch.float32, device=dev)
    amax = torch.empty(e, nb, kb, dtype=torch.float32, device=dev)
    for ei in range(e):
        for r0 in range(0, n, rows_per_band):
            r1 = min(r0 + rows_per_band, n)
            rows_pad = -(-(r1 - r0) // bn) * bn
            buf = scratch[:rows_pad]
            buf[: r1 - r0, :k].copy_(x3[ei, r0:r1])  # fp32 conversion happens here
            if rows_pad > r1 - r0:
                buf[r1 - r0 :].zero_()  # zero padding of the last tile row
            t = buf.view(rows_pad // bn, bn, kb, bk)
            # step 2: amax as max(max x, -min x), tile dim first (~25% faster)
            a = torch.maximum(t.amax(dim=3).amax(dim=1), t.amin(dim=3).amin(dim=1).neg())
            # step 3: scales and q = x * m (or x / s) in place
            sb, mb = _scales(a, family, eps, ue8m0)
            if family == "divide":
                t.div_(sb[:, None, :, None])
            else:
                t.mul_(mb[:, None, :, None])
            # step 4: saturate and cast (round-to-nearest-even) into the output
            tiles = slice(r0 // bn, r0 // bn + rows_pad // bn)
            amax[ei, tiles], s[ei, tiles] = a, sb
            q8[ei, r0:r1].copy_(_saturate_(buf)[: r1 - r0, :k])
    check_finite(x, name, amax=amax)
    return q8, s


_FAMILY_INDEX = {"reciprocal": 0, "divide": 1, "multiplier": 2}  # the kernels' argument


def _quantize_fused(
    x3: torch.Tensor, block: tuple[int, int], family: str, eps: float, ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(q, s)`` of ``x3 [E, N, K]`` by the fused CPU kernel; None if it cannot, or on NaN."""
    ext = kernel_for(x3)
    if ext is None:
        return None
    q, s, finite = ext.quantize_blockwise(x3, block[0], block[1], _FAMILY_INDEX[family], float(eps), bool(ue8m0))
    return (q.view(torch.float8_e4m3fn), s) if bool(finite) else None


def quantize_blockwise(
    x: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    family: Family = "reciprocal",
    eps: float = 1e-4,
    ue8m0: bool = False,
    *,
    name: str = "x",
    backend: Literal["torch", "te", "auto"] = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise FP8 E4M3 quantization of a weight, ``x ~= q * s`` per ``block`` tile.

    Args:
        x: ``[N, K]`` or ``[E, N, K]`` (MoE experts); any float dtype (computed in fp32).
        block: tile ``(bn, bk)``; 128x128 is vLLM's block FP8.
        family: the scale formula, ``"reciprocal"`` (canonical), ``"divide"`` or ``"multiplier"`` (module doc).
        eps: floor of the per-tile amax; 0 selects TE's rule.
        ue8m0: power-of-two scales.
        name: tensor name used in error messages.
        backend: ``"torch"``, ``"te"`` (:mod:`nemo_ais.formats.te_backend`, CUDA) or ``"auto"``.

    Returns:
        ``(q, s)``: float8_e4m3fn codes of ``x``'s shape and fp32 scales ``[ceil(N/bn), ceil(K/bk)]`` (``[E, ...]``
        for 3-D); empty in, empty out.

    Raises:
        ValueError: non-finite values (count and first index), a bad shape, dtype, family, eps or block.
    """
    check_weight_args(x, name, family, eps, block)
    if backend != "torch":
        from nemo_ais.formats import te_backend

        use_te = te_backend.use_te(x, backend, name=name, family=family, block=block)
        if use_te and x.numel() > 0:  # empty: no kernel to run, the reference result
            return te_backend.quantize_blockwise_te(x, block, family, eps, ue8m0, name=name)
    fast = triton_quantize("quantize_blockwise_triton", x, block, family, eps, ue8m0, name=name)
    if fast is not None:  # CUDA: one Triton launch (nemo_ais.formats.dispatch), same bits
        return fast
    with torch.no_grad():
        x3 = x if x.dim() == 3 else x.unsqueeze(0)
        fused = _quantize_fused(x3, tuple(block), family, eps, ue8m0)  # CPU: same bits; NaN / inf raises below
        q, s = fused if fused is not None else _quantize_tiles(x, x3, tuple(block), family, eps, ue8m0, name)
    return (q, s) if x.dim() == 3 else (q[0], s[0])


def _dequantize_tiles(q3: torch.Tensor, s3: torch.Tensor, block: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """``q3 [E, N, K] * s3 [E, nb, kb]`` broadcast per tile, computed in fp32."""
    (e, n, k), (bn, bk) = q3.shape, block
    x = q3.to(torch.float32)
    if n % bn or k % bk:  # zero-pad to whole tiles (F.pad copies even when it adds nothing)
        x = F.pad(x, (0, -k % bk, 0, -n % bn))
    x.view(e, x.shape[1] // bn, bn, x.shape[2] // bk, bk).mul_(s3[:, :, None, :, None])
    return x[:, :n, :k].to(dtype)


def _check_dequant(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], lead: int, name: str, values: bool
) -> None:
    """``q`` is E4M3 and ``scale`` fp32 with one entry per tile; with ``values`` no NaN code or scale (ValueError)."""
    if q.dtype != FP8_DTYPE:
        raise ValueError(f"{name}: got q of dtype {q.dtype}, expected {FP8_DTYPE}")
    expected = (*q.shape[:lead], *(-(-q.shape[lead + i] // block[i]) for i in range(q.dim() - lead)))
    if tuple(scale.shape) != expected or scale.dtype != torch.float32:
        raise ValueError(
            f"{name}: got scale {list(scale.shape)} {scale.dtype}, expected "
            f"{list(expected)} torch.float32 for q {list(q.shape)} and block {tuple(block)}"
        )
    if values:
        check_e4m3_codes(q, name, "q")
        check_finite(scale, f"{name} scale", what="scales", action="")


def dequantize_blockwise(
    q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    dtype: torch.dtype = torch.float32,
    *,
    name: str = "q",
    check: bool = True,
) -> torch.Tensor:
    """Inverse of :func:`quantize_blockwise`: ``x = q * s`` per ``block`` tile, in ``dtype``.

    ``check=False`` skips the value checks (E4M3 NaN codes, non-finite scales: a host read) for codes a quantizer has
    just written; shapes and dtypes are always checked.
    """
    check_blockwise_args(name, "reciprocal", 0.0, block)
    if q.dim() not in (2, 3):
        raise ValueError(f"{name}: got {list(q.shape)}, expected [N, K] or [E, N, K]")
    _check_dequant(q, scale, block, q.dim() - 2, name, check)
    with torch.no_grad():
        if q.dim() == 3:
            return _dequantize_tiles(q, scale, tuple(block), dtype)
        return _dequantize_tiles(q[None], scale[None], tuple(block), dtype)[0]


def quantize_activations(
    x: torch.Tensor,
    group: int = 128,
    family: Family = "divide",
    eps: float = 1e-10,
    ue8m0: bool = False,
    *,
    name: str = "x",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group FP8 quantization of activations ``x [..., K]`` (1 x ``group`` tiles).

    As :func:`quantize_blockwise` with defaults of vLLM's per-token-group quant (family ``"divide"``, eps 1e-10).
    Returns ``(q, s)`` with ``s`` fp32 ``[..., ceil(K/group)]``.

    Raises:
        ValueError: non-finite input (count and first index), bad dtype or arguments.
    """
    check_blockwise_args(name, family, eps, (1, group))
    if x.dim() < 1 or x.dtype not in FLOAT_INPUTS:
        raise ValueError(f"{name}: got {list(x.shape)} {x.dtype}, expected a [..., K] floating tensor")
    with torch.no_grad():
        # rows spelled out: reshape(1, -1, 0) is ambiguous for empty x
        x3 = x.reshape(1, math.prod(x.shape[:-1]), x.shape[-1])
        q, s = _quantize_tiles(x, x3, (1, group), family, eps, ue8m0, name)
    return q.view(x.shape), s.view(*x.shape[:-1], s.shape[-1])


def dequantize_activations(
    q: torch.Tensor,
    scale: torch.Tensor,
    group: int = 128,
    dtype: torch.dtype = torch.float32,
    *,
    name: str = "q",
    check: bool = True,
) -> torch.Tensor:
    """Inverse of :func:`quantize_activations`: ``x = q * s`` per 1 x ``group``, in ``dtype``.

    ``check``: as :func:`dequantize_blockwise`.
    """
    check_blockwise_args(name, "reciprocal", 0.0, (1, group))
    if q.dim() < 1:
        raise ValueError(f"{name}: got a 0-dim tensor, expected [..., K]")
    _check_dequant(q, scale, (group,), q.dim() - 1, name, check)
    with torch.no_grad():
        q3 = q.reshape(1, math.prod(q.shape[:-1]), q.shape[-1])
        s3 = scale.reshape(1, math.prod(scale.shape[:-1]), scale.shape[-1])
        return _dequantize_tiles(q3, s3, (1, group), dtype).view(q.shape)


def quantize_blockwise_reference(
    x: torch.Tensor, block: tuple[int, int] = (128, 128), eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's ``per_block_cast_to_fp8`` of ``x [N, K]``: the "reciprocal" fast path's reference."""
    (n, k), (bn, bk) = x.shape, block
    xp = F.pad(x.to(torch.float32), (0, -k % bk, 0, -n % bn))
    tiles = xp.view(xp.shape[0] // bn, bn, xp.shape[1] // bk, bk)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True).clamp_min(eps)
    s = amax / torch.full_like(amax, E4M3_MAX)
    q = (tiles * torch.reciprocal(s)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return q.view_as(xp)[:n, :k].contiguous(), s.view(tiles.shape[0], tiles.shape[2])


def _fake_quant_groups_divide(x: torch.Tensor, group: int, eps: float, name: str) -> torch.Tensor:
    """``dequantize_activations(*quantize_activations(x, group, "divide", eps))`` fused, same bits (C++ where built).

    Needs ``K % group == 0`` and ``eps > 0``.
    """
    ext = kernel_for(x)
    if ext is not None:
        y, finite = ext.fake_quant_groups_divide(x.reshape(-1, x.shape[-1]), group, eps)
        if bool(finite):
            return y.view(x.shape)
    xg = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // group, group)
    amax = xg.abs().amax(dim=-1, keepdim=True)
    check_finite(x, name, amax=amax, what="activations", action="")
    s = amax.clamp_min(eps)
    s = s / torch.full_like(s, E4M3_MAX)  # tensor / tensor: one rounding on CUDA too
    q = (xg / s).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * s).reshape(x.shape)


def quantize_weight(w: torch.Tensor, knobs: Any, *, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_blockwise` of ``w`` with a weight-format config's knobs (the twin's)."""
    return quantize_blockwise(w.detach(), knobs.weight_block, knobs.family, knobs.eps, knobs.ue8m0, name=name)


def _fake_weight(w: torch.Tensor, *, amax: Any = None, name: str, knobs: Any) -> torch.Tensor:
    """``dequantize_blockwise(*quantize_weight(W))`` in fp32: what the twin multiplies by."""
    return dequantize_blockwise(*quantize_weight(w, knobs, name=name), knobs.weight_block, check=False)


def _fake_activation(x: torch.Tensor, *, amax: Any = None, name: str, knobs: Any) -> torch.Tensor:
    """Per-token 1x``group`` FP8 fake-quant ``dequant(quant(x))`` in fp32 (fused by default)."""
    group, family, eps = knobs.activation_group, knobs.activation_family, knobs.activation_eps
    if family == "divide" and not knobs.ue8m0 and eps > 0 and x.shape[-1] % group == 0:
        return _fake_quant_groups_divide(x, group, eps, name)
    x_q, s_x = quantize_activations(x, group, family, eps, knobs.ue8m0, name=name)
    return dequantize_activations(x_q, s_x, group, torch.float32, check=False)


def _refit_pairs(
    name: str, w: torch.Tensor, config: Any, *, weight_amax: Any = None, input_scale: Any = None
) -> RefitPairs:
    """The pairs of vLLM block FP8: ``(<m>.weight, codes)``, ``(<m>.weight_scale_inv, s)``."""
    args = (config.block, config.family, config.eps, config.ue8m0)
    q, s = quantize_blockwise(w, *args, name=stack_label(name), backend=config.backend)
    return weight_pairs(name, [("weight", q), ("weight_scale_inv", s)])


def _refit_bytes(numel: int, shape: tuple[int, ...], config: Any) -> int:
    n_scales = -(-shape[0] // config.block[0]) * -(-shape[1] // config.block[1])
    return numel + n_scales * 4


FP8_BLOCK = Format(
    "fp8",
    GEOMETRY["fp8"].block,
    "E4M3",
    "fp32 dequant scale per 128x128 weight tile and 1x128 input group (FAMILY_FORMULAS)",
    reference=quantize_blockwise_reference,
    quantize=quantize_blockwise,
    dequantize=dequantize_blockwise,
    fake_weight=_fake_weight,
    fake_activation=_fake_activation,
    refit_pairs=_refit_pairs,
    refit_bytes=_refit_bytes,
    pads=True,
    keeps_codes=True,
)
"""Blockwise FP8 (W8A8, DeepSeek-V3 / vLLM block FP8)."""
