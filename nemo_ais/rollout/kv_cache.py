# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's quantized KV cache: K and V fake-quantized as vLLM writes them into its cache.

HF's ``DynamicCache.update`` receives K after RoPE and V, what vLLM's ``reshape_and_cache`` writes; attention reads the
dequantized states. Layer ``l``'s writes take the KV-cache format's round trip (:mod:`nemo_ais.formats.kv_cache`:
``fp8``, ``nvfp4``) with its calibrated scale ``s_l``.
"""

from __future__ import annotations

import torch

from nemo_ais.formats.kv_cache import get_kv_format
from nemo_ais.refit.kv_scales import KVSaturationCounter, KVScales
from nemo_ais.rollout.fake_quant import scale_error
from nemo_ais.rollout.sampling import GrowingKVCache

_COLUMNS = {"k": 1, "v": 2}  # of the calibrated (q, k, v) table


class QuantizedKVCache(GrowingKVCache):
    """HF ``DynamicCache`` (growing in place) whose writes take a KV-cache format's round trip.

    ``kind``: the format (``fp8``, ``nvfp4``); ``scales``: the calibrated table (float64 ``[layers, 3]`` dequant scales;
    ``held``: the record's per-layer K and V values from it); ``saturation``: an optional
    :class:`~nemo_ais.refit.kv_scales.KVSaturationCounter` of the clipped elements; ``error_scale``: the mismatch dial
    k (``x + k (q(x) - x)``; 1: the format as is).
    """

    def __init__(
        self, kind: str, scales: KVScales, saturation: KVSaturationCounter | None = None, error_scale: float = 1.0
    ) -> None:
        super().__init__()
        self.format = get_kv_format(kind)
        self.kind = kind
        # what the engine holds per layer and K / V (fp32), formed once for every write
        self.held = {which: self.format.held(scales.scale[:, j]) for which, j in _COLUMNS.items()}
        self.saturation = saturation
        self.error_scale = error_scale

    def _quantize(self, x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        if self.saturation is not None:
            self.saturation.observe(layer, which, x)
        name = f"layer {layer} {which.upper()}"
        if x.shape[-1] % self.format.head_dim_multiple:  # no message built on the hot path
            self.format.check_head_dim(x.shape[-1], f"{name} of the KV cache")
        q = self.format.round_trip(x, self.held[which][layer], name)
        return scale_error(x, q, self.error_scale)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Fake-quantize the new K and V, then store them (``DynamicCache.update``)."""
        key_states = self._quantize(key_states, layer_idx, "k")
        value_states = self._quantize(value_states, layer_idx, "v")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
