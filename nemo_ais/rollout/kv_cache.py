# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's quantized KV cache: K and V fake-quantized as vLLM writes them into its cache.

HF's ``DynamicCache.update`` receives K after RoPE and V, what vLLM's
``reshape_and_cache`` writes; attention reads the dequantized states. Per layer ``l``:
``fp8``: ``e4m3(clamp(x / s_l, ±448)) * s_l`` (calibrated K and V scales); ``nvfp4``:
``fake_quantize_nvfp4(x, amax_l)`` with the static ``amax_l = s_l * 448``. An optional
:class:`~nemo_ais.refit.kv_scales.KVSaturationCounter` counts the clipped elements.
[reconstruction] vLLM has no native NVFP4 KV cache; NeMo-RL simulates one by ModelOpt
fake quantization of K/V, which is this.
"""

from __future__ import annotations

from typing import Literal

import torch

from nemo_ais.formats.grids import E4M3_MAX
from nemo_ais.formats.nvfp4 import NVFP4_BLOCK, fake_quantize_nvfp4
from nemo_ais.refit.kv_scales import KVSaturationCounter, KVScales
from nemo_ais.rollout.fake_quant import scale_error
from nemo_ais.rollout.sampling import GrowingKVCache

__all__ = ["QuantizedKVCache", "fake_quant_kv_fp8"]


def fake_quant_kv_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor E4M3 round trip: ``clamp(x / s, ±448) -> e4m3 -> * s`` (vLLM fp8 KV)."""
    q = (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


class QuantizedKVCache(GrowingKVCache):
    """HF ``DynamicCache`` (growing in place) whose writes are fake-quantized per layer (``kind``: fp8 or nvfp4).

    ``k_scale`` / ``v_scale``: fp32 ``[layers]`` dequant scales; ``k_amax`` / ``v_amax``:
    ``scale * 448``; ``saturation``: the counter, or None;
    ``error_scale``: the mismatch dial k (``x + k (q(x) - x)``; 1: the format as is).
    """

    def __init__(
        self,
        kind: Literal["fp8", "nvfp4"],
        scales: KVScales,
        saturation: KVSaturationCounter | None = None,
        error_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.saturation = saturation
        self.error_scale = error_scale
        if kind not in ("fp8", "nvfp4"):
            raise ValueError(f"kind={kind!r} is invalid: expected 'fp8' or 'nvfp4'")
        self.kind = kind
        # columns (q, k, v) of the calibrated table; the engine holds them as fp32
        self.k_scale = scales.scale[:, 1].to(torch.float32)
        self.v_scale = scales.scale[:, 2].to(torch.float32)
        self.k_amax = (scales.scale[:, 1] * E4M3_MAX).to(torch.float32)
        self.v_amax = (scales.scale[:, 2] * E4M3_MAX).to(torch.float32)

    def _quantize(self, x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        if self.saturation is not None:
            self.saturation.observe(layer, which, x)
        return scale_error(x, self._round_trip(x, layer, which), self.error_scale)

    def _round_trip(self, x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        if self.kind == "fp8":
            return fake_quant_kv_fp8(x, getattr(self, f"{which}_scale")[layer])
        if x.shape[-1] % NVFP4_BLOCK:
            raise ValueError(
                f"nvfp4 KV cache: layer {layer} {which.upper()} has head dim {x.shape[-1]}, "
                f"expected a multiple of {NVFP4_BLOCK}"
            )
        amax = getattr(self, f"{which}_amax")[layer]
        return fake_quantize_nvfp4(x, amax, name=f"layer {layer} {which.upper()}").to(x.dtype)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Fake-quantize the new K and V, then store them (``DynamicCache.update``)."""
        key_states = self._quantize(key_states, layer_idx, "k")
        value_states = self._quantize(value_states, layer_idx, "v")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
