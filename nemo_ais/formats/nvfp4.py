# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NVFP4: E2M1 elements in blocks of 16 along the last dim, E4M3 block scales, one fp32 global scale.

ModelOpt's export rule (vLLM's ``weight`` / ``weight_scale`` / ``weight_scale_2``; ``input_scale`` for activations), for
``x [..., K]``, ``K % 16 == 0``:

1. ``s_g = amax / (6 * 448)`` (amax = max |x| or a calibrated value); 0 becomes 1 (TE).
2. Per block: ``r = amax_b / (6 * s_g)`` (one product, one division, fp32).
3. ``r = 0`` becomes 1; clamp ``r`` to ``[2^-9, 448]``; ``s_b = e4m3(r)``.
4. ``d = fp32(s_b) * s_g``, ``y = x / d`` (``d`` underflowing to 0 gives codes 0).
5. ``code = rne_e2m1(|y|)`` saturating at 6, sign bit ``x < 0``; two codes per byte.

Dequantization: ``E2M1(code) * d``. ``rows_per_block=16``: TE's 16x16 weight tiles (one amax per tile, stored on each
of its rows: still valid 1x16 NVFP4). :func:`quantize_nvfp4` and :func:`fake_quantize_nvfp4` are bit-equal to
:func:`quantize_nvfp4_reference` (two C++ passes on CPU, Triton on CUDA).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from nemo_ais.formats.base import Format, RefitPairs, stack_label, unchanged, weight_pairs
from nemo_ais.formats.checks import check_amax, check_e4m3_codes, check_finite, check_last_dim
from nemo_ais.formats.dispatch import kernel_for, triton_quantize
from nemo_ais.formats.grids import (
    E2M1_MAX,
    E4M3_MAX,
    Scratch,
    e2m1_codes_reference,
    e2m1_pack_,
    e2m1_signed_values_,
    e2m1_values,
    pack_nibbles,
    row_bands,
    unpack_nibbles,
)
from nemo_ais.rules.format_geometry import GEOMETRY, NVFP4_BLOCK

TILE_ROWS = (1, 16)  # rows_per_block: 1 = 1x16 (ModelOpt, vLLM), 16 = TE 2-D 16x16 tiles
_SCALE_MIN = 2.0**-9  # smallest positive E4M3 value (subnormal)
_SIGN = 0x8


@dataclass(frozen=True)
class NVFP4Tensor:
    """A quantized ``[..., K]`` tensor (vLLM's names in brackets).

    Attributes:
        data: uint8 ``[..., K/2]``, two E2M1 codes a byte, even element low (``weight``).
        block_scale: float8_e4m3fn ``[..., K/16]`` (``weight_scale``).
        global_scale: fp32 0-dim ``amax / (6 * 448)`` (``weight_scale_2`` / ``input_scale``).
    """

    data: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tensor that was quantized, ``(..., K)``."""
        return (*self.data.shape[:-1], 2 * self.data.shape[-1])


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """Step 1: ``s_g = amax / (6 * 448)`` in fp32, 1 where that is 0 (module doc)."""
    amax = amax.to(torch.float32)
    s_g = amax / torch.full_like(amax, E2M1_MAX * E4M3_MAX)  # tensor / tensor: one rounding
    return torch.where(s_g == 0, torch.ones_like(s_g), s_g)


def _check_args(x: torch.Tensor, rows_per_block: int, name: str) -> None:
    check_last_dim(x, name, NVFP4_BLOCK, "NVFP4")
    if rows_per_block not in TILE_ROWS:
        raise ValueError(
            f"rows_per_block={rows_per_block!r} is invalid: expected 1 (1x16 blocks, "
            "ModelOpt/vLLM) or 16 (Transformer Engine's 16x16 weight tiles)"
        )
    if rows_per_block > 1 and x.dim() < 2:
        raise ValueError(
            f"{name}: got {list(x.shape)}, expected at least 2 dims [..., N, K] for "
            f"rows_per_block={rows_per_block} (16x16 tiles over the last two dims)"
        )


def _tensor_amax(x: torch.Tensor, amax: float | torch.Tensor | None) -> torch.Tensor:
    """The given amax (checked) or ``max |x|`` in fp32 (0 for an empty ``x``)."""
    given = check_amax(amax, "amax")
    if given is not None:
        return given.to(x.device)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    lo, hi = torch.aminmax(x)
    return torch.maximum(hi, lo.neg()).to(torch.float32)


def _tile_max(block_amax: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """``[..., N, K/16]`` block amax -> the max of each ``rows_per_block`` rows, repeated on them."""
    if rows_per_block == 1:
        return block_amax
    *lead, n, kb = block_amax.shape
    pad = -n % rows_per_block
    padded = F.pad(block_amax, (0, 0, 0, pad))  # amax >= 0: 0 is neutral
    tiles = padded.view(*lead, (n + pad) // rows_per_block, rows_per_block, kb).amax(-2)
    return tiles.repeat_interleave(rows_per_block, dim=-2)[..., :n, :]


def _block_scale(block_amax: torch.Tensor, s_g: torch.Tensor) -> torch.Tensor:
    """Steps 2-3: E4M3 block scales from fp32 block amax and the global scale."""
    r = block_amax / (s_g * (E2M1_MAX))
    r = torch.where(r == 0, torch.ones_like(r), r).clamp_(_SCALE_MIN, E4M3_MAX)
    return r.to(torch.float8_e4m3fn)


def _divisor(block_scale: torch.Tensor, s_g: torch.Tensor) -> torch.Tensor:
    """Step 4: ``d = fp32(s_b) * s_g``, one rounding."""
    return block_scale.to(torch.float32) * s_g


def quantize_nvfp4_reference(
    x: torch.Tensor, amax: float | torch.Tensor | None = None, *, rows_per_block: int = 1
) -> NVFP4Tensor:
    """Reference of :func:`quantize_nvfp4`: steps 1-5 of the module doc, written plainly."""
    _check_args(x, rows_per_block, "x")
    check_finite(x, "x", action="refusing to quantize NaN/Inf")
    xf = x.to(torch.float32)
    s_g = nvfp4_global_scale(_tensor_amax(x, amax))
    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = _tile_max(blocks.abs().amax(-1), rows_per_block)
    block_scale = _block_scale(block_amax, s_g)
    d = _divisor(block_scale, s_g).unsqueeze(-1)
    y = blocks / torch.where(d == 0, torch.full_like(d, math.inf), d)
    code = e2m1_codes_reference(y.abs()) | ((blocks < 0).to(torch.uint8) * _SIGN)
    return NVFP4Tensor(pack_nibbles(code.reshape(x.shape)), block_scale, s_g)


def _block_amax_(x2: torch.Tensor, r0: int, r1: int, s: torch.Tensor) -> torch.Tensor:
    """fp32 max |x| per block of 16 of rows ``r0:r1`` of ``x2``, using scratch ``s`` (clobbered)."""
    band = x2[r0:r1]
    if band.dtype == torch.float32:
        torch.abs(band, out=s)
    else:
        s.copy_(band).abs_()
    # max_pool1d over the rows as channels: one pass (a reduction over a dim of 16 is slower)
    return F.max_pool1d(s, NVFP4_BLOCK)


def _quantize_bands(x, amax, rows_per_block, name, *, fake: bool):
    """The fast path: per band of rows, in-place passes over one cache-sized fp32 copy.

    ``amax=None`` adds a first pass for the block amaxes; ``fake``: fp32 values ``E2M1(code) * d``, not packed codes.
    """
    _check_args(x, rows_per_block, name)
    k = x.shape[-1]
    kb = k // NVFP4_BLOCK
    rows = math.prod(x.shape[:-1])
    x2 = x.reshape(rows, k)
    dev = x.device
    given = check_amax(amax, "amax")
    out_shape, out_dtype = ((rows, k), torch.float32) if fake else ((rows, k // 2), torch.uint8)
    out = torch.empty(out_shape, dtype=out_dtype, device=dev)
    scales = torch.empty(rows, kb, dtype=torch.float8_e4m3fn, device=dev)
    tile = rows_per_block
    n = x.shape[-2] if tile > 1 else rows  # a 16x16 tile never straddles two matrices
    bands = [
        (m0 + b0, m0 + b1)
        for m0 in (range(0, rows, n) if x.numel() else ())
        for b0, b1 in row_bands(n, k, tile, device=dev)
    ]
    scratch = Scratch(dev)
    block_amax = None
    if given is None:  # pass 1: block amax of the whole tensor, its max the tensor amax
        block_amax = torch.empty(rows, kb, dtype=torch.float32, device=dev)
        for r0, r1 in bands:
            s = scratch.get("x", (r1 - r0, k), torch.float32)
            block_amax[r0:r1] = _block_amax_(x2, r0, r1, s)
        tensor_amax = block_amax.amax() if rows * kb else torch.zeros((), dtype=torch.float32, device=dev)
    else:
        tensor_amax = given.to(dev)
    finite = torch.ones((), dtype=torch.bool, device=dev)
    s_g = nvfp4_global_scale(tensor_amax)
    for r0, r1 in bands:
        h = r1 - r0
        y = scratch.get("x", (h, k), torch.float32)
        ba = _block_amax_(x2, r0, r1, y) if block_amax is None else block_amax[r0:r1]
        finite &= torch.isfinite(ba).all()
        block_scale = _block_scale(_tile_max(ba, tile), s_g)
        scales[r0:r1] = block_scale
        d = _divisor(block_scale, s_g)
        torch.add(x2[r0:r1], 0.0, out=y)  # fp32, and -0.0 -> +0.0 (code 0, not 8)
        y.view(h, kb, NVFP4_BLOCK).div_(torch.where(d == 0, torch.full_like(d, math.inf), d).unsqueeze(-1))
        if fake:
            v = e2m1_signed_values_(y, out[r0:r1])
            v.view(h, kb, NVFP4_BLOCK).mul_(d.unsqueeze(-1))
        else:
            e2m1_pack_(y, out[r0:r1], scratch)
    if not bool(finite):
        check_finite(x, name, action="refusing to quantize NaN/Inf")
    lead = x.shape[:-1]
    return out.view(*lead, out.shape[-1]), scales.view(*lead, kb), s_g


def quantize_nvfp4(
    x: torch.Tensor, amax: float | torch.Tensor | None = None, *, rows_per_block: int = 1, name: str = "x"
) -> NVFP4Tensor:
    """NVFP4 quantization of ``x [..., K]`` (ModelOpt export rule, module doc).

    Args:
        x: any float dtype (computed in fp32), ``K % 16 == 0``.
        amax: None = ``max |x|`` (a weight), or a calibrated static value (activations).
        rows_per_block: 1 (1x16 blocks) or 16 (TE's 16x16 weight tiles).
        name: tensor name used in error messages.

    Returns:
        :class:`NVFP4Tensor`; empty in, empty out (``global_scale`` 1 unless ``amax``).

    Raises:
        ValueError: ``K % 16 != 0``, a non-floating ``x``, non-finite values, a bad ``amax`` or ``rows_per_block``.
    """
    fast = triton_quantize("quantize_nvfp4_triton", x, amax, rows_per_block=rows_per_block, name=name)
    if fast is not None:  # CUDA: Triton (nemo_ais.formats.dispatch), same bits
        return fast
    return _quantize_eager(x, amax, rows_per_block, name)


def _quantize_eager(x, amax, rows_per_block: int, name: str) -> NVFP4Tensor:
    """:func:`quantize_nvfp4` without Triton: the C++ kernel, else (or on NaN) the banded path."""
    with torch.no_grad():
        fused = _quantize_fused(x, amax, rows_per_block, name)
        return fused if fused is not None else NVFP4Tensor(*_quantize_bands(x, amax, rows_per_block, name, fake=False))


def check_experts_args(x: torch.Tensor, amax: torch.Tensor | None, rows_per_block: int, name: str) -> None:
    """The arguments of :func:`quantize_nvfp4_experts` (ValueError)."""
    check_last_dim(x, name, NVFP4_BLOCK, "NVFP4")
    if x.dim() != 3 or rows_per_block not in TILE_ROWS:
        raise ValueError(
            f"{name}: got {list(x.shape)} with rows_per_block={rows_per_block}, expected "
            "[E, N, K] and rows_per_block 1 or 16"
        )
    e = x.shape[0]
    if amax is not None and (tuple(amax.shape) != (e,) or not amax.is_floating_point()):
        raise ValueError(f"amax: got {list(amax.shape)} {amax.dtype}, expected floating [{e}]")


def quantize_nvfp4_experts(
    x: torch.Tensor, amax: torch.Tensor | None = None, *, rows_per_block: int = 1, name: str = "x"
) -> NVFP4Tensor:
    """NVFP4 of an expert stack ``x [E, N, K]``, one global scale per expert (vLLM's ModelOpt MoE).

    Expert ``e`` is ``quantize_nvfp4(x[e], amax[e], rows_per_block=...)`` bit for bit; ``amax``: floating ``[E]``, or
    None for ``max |x[e]|`` each. One Triton launch on CUDA, one quantizer call per expert elsewhere.

    Returns:
        :class:`NVFP4Tensor` with ``data [E, N, K/2]``, ``block_scale [E, N, K/16]`` and ``global_scale`` fp32 ``[E]``.

    Raises:
        ValueError: as :func:`quantize_nvfp4` (naming ``name[e]``), not 3-D, a bad ``amax``.
    """
    fast = triton_quantize("quantize_nvfp4_experts_triton", x, amax, rows_per_block=rows_per_block, name=name)
    if fast is not None:
        return fast
    check_experts_args(x, amax, rows_per_block, name)
    e, n, k = x.shape
    data = torch.empty(e, n, k // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(e, n, k // NVFP4_BLOCK, dtype=torch.float8_e4m3fn, device=x.device)
    s_g = torch.empty(e, dtype=torch.float32, device=x.device)
    for i in range(e):
        q = _quantize_eager(x[i], None if amax is None else amax[i], rows_per_block, f"{name}[{i}]")
        data[i], scales[i], s_g[i] = q.data, q.block_scale, q.global_scale
    return NVFP4Tensor(data, scales, s_g)


def _quantize_fused(x, amax, rows_per_block: int, name: str) -> NVFP4Tensor | None:
    """:func:`quantize_nvfp4` by the fused CPU kernel; None where it cannot, or on NaN / inf."""
    ext = kernel_for(x)
    if ext is None:
        return None
    _check_args(x, rows_per_block, name)
    given = check_amax(amax, "amax")
    k = x.shape[-1]
    kb, lead = k // NVFP4_BLOCK, x.shape[:-1]
    x2 = x.view(-1, k)
    block_amax = ext.nvfp4_block_amax(x2)
    if not bool(torch.isfinite(block_amax).all()):
        return None
    s_g = nvfp4_global_scale(block_amax.amax() if given is None else given.to(x.device))
    tiles = _tile_max(block_amax.view(*lead, kb), rows_per_block).reshape(-1, kb)
    data, scales = ext.nvfp4_encode(x2, tiles.contiguous(), float(s_g))
    return NVFP4Tensor(data.view(*lead, k // 2), scales.view(torch.float8_e4m3fn).view(*lead, kb), s_g)


def fake_quantize_nvfp4(
    x: torch.Tensor, amax: float | torch.Tensor | None = None, *, rows_per_block: int = 1, name: str = "x"
) -> torch.Tensor:
    """``dequantize_nvfp4(quantize_nvfp4(x, amax))`` without packing: fp32, bit-equal (tested)."""
    with torch.no_grad():
        return _quantize_bands(x, amax, rows_per_block, name, fake=True)[0]


def dequantize_nvfp4(q: NVFP4Tensor, *, name: str = "q") -> torch.Tensor:
    """``E2M1(code) * (fp32(block_scale) * global_scale)`` per block, fp32 (ValueError)."""
    data, block_scale, s_g = q.data, q.block_scale, q.global_scale
    k = 2 * data.shape[-1] if data.dim() else 0
    expected = (*data.shape[:-1], k // NVFP4_BLOCK)
    if (
        data.dtype != torch.uint8
        or data.dim() < 1
        or block_scale.dtype != torch.float8_e4m3fn
        or tuple(block_scale.shape) != expected
        or k % NVFP4_BLOCK
    ):
        raise ValueError(
            f"{name}: got data {list(data.shape)} {data.dtype}, block_scale "
            f"{list(block_scale.shape)} {block_scale.dtype}; expected data uint8 [..., K/2] "
            f"with K % 16 == 0 and block_scale torch.float8_e4m3fn {list(expected)}"
        )
    experts = data.dim() == 3 and tuple(s_g.shape) == data.shape[:1]  # quantize_nvfp4_experts: one per expert
    if not (s_g.numel() == 1 or experts) or s_g.dtype != torch.float32 or not torch.isfinite(s_g).all():
        raise ValueError(
            f"{name}: got global_scale {list(s_g.shape)} {s_g.dtype} = {s_g.flatten()[:1]}, "
            "expected a finite fp32 scalar (or [E], one per expert, for data [E, N, K/2])"
        )
    check_e4m3_codes(block_scale, name, "block_scale")
    with torch.no_grad():
        values = e2m1_values(unpack_nibbles(data))
        blocks = values.view(*data.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
        d = _divisor(block_scale, s_g.reshape(-1, 1, 1) if experts else s_g.reshape(()))
        return (blocks * d.unsqueeze(-1)).view(*data.shape[:-1], k)


def _fake_weight(w: torch.Tensor, *, amax: Any = None, name: str, knobs: Any) -> torch.Tensor:
    return fake_quantize_nvfp4(w, amax, rows_per_block=knobs.nvfp4_rows_per_block, name=name)


def _fake_activation(x: torch.Tensor, *, amax: Any = None, name: str = "input", knobs: Any = None) -> torch.Tensor:
    if amax is None:
        raise ValueError(f"{name}: NVFP4 W4A4 activations need the calibrated static input amax")
    return fake_quantize_nvfp4(x, amax, name=name)


def _refit_pairs(
    name: str, w: torch.Tensor, config: Any, *, weight_amax: Any = None, input_scale: Any = None
) -> RefitPairs:
    """ModelOpt NVFP4 pairs (+ W4A4 ``input_scale``); ``weight_amax``: the fused group's amax (a stack's: ``[E]``)."""
    quantize = quantize_nvfp4 if isinstance(name, str) else quantize_nvfp4_experts
    q = quantize(w, weight_amax, rows_per_block=config.nvfp4_rows_per_block, name=stack_label(name))
    tensors = [("weight", q.data), ("weight_scale", q.block_scale), ("weight_scale_2", q.global_scale)]
    if input_scale is not None:
        tensors.append(("input_scale", input_scale.clone()))
    return weight_pairs(name, tensors)


def _refit_bytes(numel: int, shape: tuple[int, ...], config: Any, n_scalars: int = 1) -> int:
    return numel // 2 + numel // NVFP4_BLOCK + n_scalars * 4


_NVFP4_SCALES = "E4M3 scale per 1x16 block (ModelOpt rule) times one fp32 global amax / (6 * 448)"
NVFP4_W4A16 = Format(
    "nvfp4_w4a16",
    GEOMETRY["nvfp4_w4a16"].block,
    "E2M1",
    _NVFP4_SCALES,
    reference=quantize_nvfp4_reference,
    quantize=quantize_nvfp4,
    dequantize=dequantize_nvfp4,
    fake_weight=_fake_weight,
    fake_activation=unchanged,
    refit_pairs=_refit_pairs,
    refit_bytes=_refit_bytes,
    shared_global_scale=True,
)
"""NVFP4 weights, BF16 activations (ModelOpt W4A16)."""

NVFP4_W4A4 = dataclasses.replace(
    NVFP4_W4A16,
    name="nvfp4_w4a4",
    scale_rule=_NVFP4_SCALES + "; inputs with a static calibrated amax",
    fake_activation=_fake_activation,
    refit_bytes=lambda numel, shape, config: _refit_bytes(numel, shape, config, n_scalars=2),
    static_input_amax=GEOMETRY["nvfp4_w4a4"].static_input_amax,
)
"""NVFP4 weights and activations (ModelOpt NVFP4, + ``input_scale``)."""
