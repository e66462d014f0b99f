# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""KV-cache formats: one record each, read by the twin's quantized cache.

vLLM writes K (after RoPE) and V into its cache; attention reads them dequantized. Per layer ``l``, with the calibrated
dequant scale ``s_l`` (:mod:`nemo_ais.refit.kv_scales`):

* ``fp8``:   ``e4m3(clamp(x / s_l, ±448)) * s_l`` (vLLM's per-tensor FP8 KV cache).
* ``nvfp4``: ``fake_quantize_nvfp4(x, amax_l)``, static ``amax_l = s_l * 448``, 1x16 blocks along the head dim.
  [reconstruction] vLLM has no native NVFP4 KV cache; this is NeMo-RL's ModelOpt fake quantization of K/V.
* ``bf16``: no record; the cache stays unquantized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nemo_ais.formats.grids import E4M3_MAX
from nemo_ais.formats.nvfp4 import NVFP4_BLOCK, fake_quantize_nvfp4


def fake_quant_kv_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor E4M3 round trip: ``clamp(x / s, ±448) -> e4m3 -> * s`` (vLLM fp8 KV)."""
    q = (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


@dataclass(frozen=True)
class KVFormat:
    """Everything the package asks about a KV-cache format.

    Attributes:
        name: the ``kv_cache`` config value.
        held: calibrated float64 dequant scales ``s`` (any shape) -> what the engine holds per layer (fp32: ``s`` for
            fp8, the static amax ``s * 448`` for nvfp4); formed once per calibration, not per write.
        round_trip: ``(x, held_l, name) -> x`` quantized and dequantized, in ``x``'s dtype
            (``held_l``: the layer's held value, 0-dim; ``name`` labels errors).
        head_dim_multiple: the head dim must be a multiple of this (the block width).
    """

    name: str
    held: Callable[[torch.Tensor], torch.Tensor]
    round_trip: Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]
    head_dim_multiple: int = 1

    def check_head_dim(self, head_dim: int, where: str) -> None:
        """Raise ``ValueError`` naming ``where`` if ``head_dim`` does not fit the blocks."""
        if head_dim % self.head_dim_multiple:
            raise ValueError(
                f"{where}: kv_cache={self.name!r} needs a head dim that is a multiple of "
                f"{self.head_dim_multiple}, got {head_dim}"
            )


KV_FORMATS: dict[str, KVFormat] = {
    "fp8": KVFormat(
        "fp8", held=lambda scale: scale.to(torch.float32), round_trip=lambda x, scale, name: fake_quant_kv_fp8(x, scale)
    ),
    "nvfp4": KVFormat(
        "nvfp4",
        held=lambda scale: (scale * E4M3_MAX).to(torch.float32),  # s * 448 before the cast
        round_trip=lambda x, amax, name: fake_quantize_nvfp4(x, amax, name=name).to(x.dtype),
        head_dim_multiple=NVFP4_BLOCK,
    ),
}


def get_kv_format(name: str) -> KVFormat:
    """The record of a quantized KV-cache format (``ValueError`` naming the known ones)."""
    if name not in KV_FORMATS:
        known = " or ".join(repr(k) for k in KV_FORMATS)
        raise ValueError(f"kv_cache={name!r} is not a quantized KV-cache format: expected {known}")
    return KV_FORMATS[name]
