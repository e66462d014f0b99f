# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A KV-cache format is one record (issue 24, item 2): the twin's cache and its checks read it.

Each record's round trip against a numpy oracle (tests/fp8_oracles.py, block_format_oracles.py);
the config's ``kv_cache`` values are exactly the records plus ``bf16``; a throwaway record
reaches the twin's cache with no other change.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from block_format_oracles import nvfp4_oracle
from fp8_oracles import decode_e4m3, encode_e4m3, f32

from nemo_ais.formats import fake_quantize_nvfp4
from nemo_ais.formats.grids import E4M3_MAX
from nemo_ais.formats.kv_cache import KV_FORMATS, KVFormat, fake_quant_kv_fp8, get_kv_format
from nemo_ais.refit.kv_scales import KVScales
from nemo_ais.rollout.config import KV_CACHE_FORMATS
from nemo_ais.rollout.kv_cache import QuantizedKVCache


def _states(seed: int = 0, head_dim: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, head_dim, generator=g)  # [batch, heads, positions, head dim]
    x[0, 0, 0, :4] = torch.tensor([30.0, -30.0, 1e-6, 0.0])  # saturates at s = 0.05, tiny, zero
    return x


def _scales(layers: int = 2) -> KVScales:
    scale = torch.tensor([[0.1, 0.05, 0.02], [0.3, 0.011, 0.7]], dtype=torch.float64)[:layers]
    return KVScales(amax=scale * E4M3_MAX, scale=scale, include_q=True)


def test_the_config_offers_exactly_the_records():
    assert KV_CACHE_FORMATS == ("bf16", *KV_FORMATS)
    assert all(record.name == name for name, record in KV_FORMATS.items())


def _round_trip(kind: str, x: torch.Tensor, s: float) -> torch.Tensor:
    record = KV_FORMATS[kind]
    return record.round_trip(x, record.held(torch.tensor(s, dtype=torch.float64)), "layer 0 K")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_round_trip_is_the_per_tensor_e4m3_oracle(dtype):
    x, s = _states().to(dtype), 0.05
    got = _round_trip("fp8", x, s)
    s32 = float(f32(s))
    ratio = f32(x.float().numpy().astype(np.float64) / s32)  # one fp32 division, as the engine
    codes = encode_e4m3(np.clip(ratio, -E4M3_MAX, E4M3_MAX))
    want = torch.from_numpy(f32(decode_e4m3(codes) * s32)).to(dtype)
    assert got.dtype == dtype and torch.equal(got, want)
    assert got[0, 0, 0, 0].item() == pytest.approx(E4M3_MAX * s32, rel=1e-2)  # saturated


def test_nvfp4_round_trip_is_the_modelopt_oracle_with_the_static_amax():
    x, s = _states(1), 0.011
    got = _round_trip("nvfp4", x, s)
    amax = float(f32(s * E4M3_MAX))  # the static amax s * 448, formed in float64
    *_, want = nvfp4_oracle(x.reshape(-1, x.shape[-1]).numpy(), amax=amax)
    np.testing.assert_array_equal(got.reshape(-1, x.shape[-1]).numpy(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_writes_what_it_wrote_before_the_records(dtype):
    """Each layer's K and V against the arithmetic of the cache before issue 24's records."""
    scales, k, v = _scales(), _states(2).to(dtype), _states(3).to(dtype)
    s = scales.scale
    before = {  # (x, layer, column) -> the former QuantizedKVCache._round_trip
        "fp8": lambda x, i, j: fake_quant_kv_fp8(x, s[:, j].to(torch.float32)[i]),
        "nvfp4": lambda x, i, j: fake_quantize_nvfp4(x, (s[:, j] * E4M3_MAX).to(torch.float32)[i], name="x").to(
            x.dtype
        ),
    }
    for kind in KV_FORMATS:
        cache = QuantizedKVCache(kind, scales)
        for layer in (0, 1):
            k_out, v_out = cache.update(k.clone(), v.clone(), layer)
            assert torch.equal(k_out[:, :, -5:], before[kind](k, layer, 1)), (kind, layer)
            assert torch.equal(v_out[:, :, -5:], before[kind](v, layer, 2)), (kind, layer)


def test_head_dim_and_unknown_format_errors_name_the_field():
    with pytest.raises(
        ValueError, match=r"RolloutTwin: kv_cache='nvfp4' needs a head dim that is a multiple of 16, got 20"
    ):
        get_kv_format("nvfp4").check_head_dim(20, "RolloutTwin")
    get_kv_format("fp8").check_head_dim(20, "RolloutTwin")  # per-tensor: any head dim
    cache = QuantizedKVCache("nvfp4", _scales())
    with pytest.raises(ValueError, match=r"layer 0 K of the KV cache: kv_cache='nvfp4' .* got 20"):
        cache.update(torch.zeros(1, 1, 2, 20), torch.zeros(1, 1, 2, 20), 0)
    with pytest.raises(
        ValueError, match=r"kv_cache='bf16' is not a quantized KV-cache format: expected 'fp8' or 'nvfp4'"
    ):
        QuantizedKVCache("bf16", _scales())


def test_a_new_kv_format_is_one_record(monkeypatch):
    halves = KVFormat(
        "halves",
        held=lambda scale: scale.to(torch.float32),
        round_trip=lambda x, scale, name: (x / scale).round() * scale,
        head_dim_multiple=8,
    )
    monkeypatch.setitem(KV_FORMATS, "halves", halves)
    cache = QuantizedKVCache("halves", _scales())
    k = _states(4, head_dim=16)
    k_out, _ = cache.update(k.clone(), k.clone(), 0)
    assert torch.equal(k_out, (k / 0.05).round() * 0.05)
    with pytest.raises(ValueError, match="multiple of 8, got 12"):
        cache.update(torch.zeros(1, 1, 1, 12), torch.zeros(1, 1, 1, 12), 1)
