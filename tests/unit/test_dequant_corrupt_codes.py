# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""A corrupt code tensor is refused by every dequantizer, never turned into NaN that travels on.

E4M3 has one NaN pattern (S.1111.111: 0x7F, 0xFF) and no infinity; the quantizers saturate at 448 and never write it.
Property: every quantizer's codes hold no NaN pattern over random, huge and tiny inputs; planting one byte of it in
any E4M3 field (FP8 codes, MXFP8 data, NVFP4 block scales) makes the dequantizer raise naming the field and the index.
"""

from __future__ import annotations

import pytest
import torch

from nemo_ais.formats.fp8_block import dequantize_activations, quantize_activations
from nemo_ais.formats.mxfp8 import MXFP8Tensor
from nemo_ais.formats.nvfp4 import NVFP4Tensor
from nemo_ais.fp8 import (  # the public names
    dequantize_blockwise,
    dequantize_mxfp8,
    dequantize_nvfp4,
    quantize_blockwise,
    quantize_mxfp8,
    quantize_nvfp4,
)
from nemo_ais.rollout.linear import Fp8Linear


def _plant(codes: torch.Tensor, index: tuple[int, ...], byte: int) -> torch.Tensor:
    bits = codes.view(torch.uint8).clone()
    bits[index] = byte
    return bits.view(codes.dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g)
    x[:128, :128] *= 1e30  # saturating tile
    x[128:, 128:] *= 1e-30  # tiny tile
    return x


def _is_nan_code(codes: torch.Tensor) -> torch.Tensor:
    return (codes.view(torch.uint8) & 0x7F) == 0x7F


def test_no_quantizer_writes_an_e4m3_nan_pattern():
    x = _inputs()
    q, _ = quantize_blockwise(x)
    assert not _is_nan_code(q).any()
    assert not _is_nan_code(quantize_activations(x)[0]).any()
    assert not _is_nan_code(quantize_mxfp8(x).data).any()
    assert not _is_nan_code(quantize_nvfp4(x).block_scale).any()


@pytest.mark.parametrize("byte", [0x7F, 0xFF])
def test_fp8_blockwise_refuses_a_nan_code(byte):
    q, s = quantize_blockwise(_inputs())
    assert torch.isfinite(dequantize_blockwise(q, s)).all()
    with pytest.raises(
        ValueError, match=r"^w: got 1 E4M3 NaN code\(s\) .* in q \[256, 256\] \(first at index \(3, 200\)\)"
    ):
        dequantize_blockwise(_plant(q, (3, 200), byte), s, name="w")
    qa, sa = quantize_activations(_inputs())
    with pytest.raises(ValueError, match=r"^q: got 1 E4M3 NaN code\(s\) .* \(first at index \(0, 5\)\)"):
        dequantize_activations(_plant(qa, (0, 5), byte), sa)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fp8_blockwise_refuses_a_non_finite_scale(bad):
    q, s = quantize_blockwise(_inputs())
    s = s.clone()
    s[1, 0] = bad
    with pytest.raises(
        ValueError, match=r"^w scale: got 1 non-finite value\(s\) in \[2, 2\] .* \(first at index \(1, 0\)"
    ):
        dequantize_blockwise(q, s, name="w")


def test_mxfp8_refuses_a_nan_data_code():
    q = quantize_mxfp8(_inputs())
    with pytest.raises(
        ValueError, match=r"^a: got 1 E4M3 NaN code\(s\) .* in data \[256, 256\] \(first at index \(7, 7\)\)"
    ):
        dequantize_mxfp8(MXFP8Tensor(_plant(q.data, (7, 7), 0xFF), q.scale), name="a")


def test_nvfp4_refuses_a_nan_block_scale():
    q = quantize_nvfp4(_inputs())
    bad = NVFP4Tensor(q.data, _plant(q.block_scale, (9, 3), 0x7F), q.global_scale)
    with pytest.raises(
        ValueError, match=r"^q: got 1 E4M3 NaN code\(s\) .* in block_scale \[256, 16\] \(first at index \(9, 3\)\)"
    ):
        dequantize_nvfp4(bad)


def test_the_twin_refuses_corrupt_fp8_codes_from_a_refit_naming_the_layer():
    layer = Fp8Linear.from_linear(torch.nn.Linear(256, 128, bias=False), name="model.layers.0.mlp.down_proj")
    q, s = quantize_blockwise(torch.randn(128, 256))
    held = (layer.weight.clone(), layer.weight_scale_inv.clone(), layer.weight_dequant.clone())
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.mlp\.down_proj: got 1 E4M3 NaN code\(s\) .* in weight "):
        layer.load_quantized(_plant(q, (0, 0), 0x7F), s)
    # refused before anything is stored: the layer still holds its last good refit
    after = (layer.weight, layer.weight_scale_inv, layer.weight_dequant)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(held, after, strict=True))


def test_fresh_codes_skip_the_value_checks(monkeypatch):
    """The fake-quant paths dequantize codes the quantizer just wrote: no NaN-code scan, no host read per forward."""
    import nemo_ais.formats.fp8_block as fp8_block
    import nemo_ais.formats.mxfp8 as mxfp8
    from nemo_ais.rollout.config import RolloutPrecisionConfig

    calls = []
    for module in (fp8_block, mxfp8):
        monkeypatch.setattr(module, "check_e4m3_codes", lambda *a, **k: calls.append(a[1]))
    x = _inputs()
    knobs = RolloutPrecisionConfig(format="fp8", activation_family="reciprocal")  # the unfused activation path
    fp8_block._fake_weight(x, name="w", knobs=knobs)
    fp8_block._fake_activation(x, name="x", knobs=knobs)
    mxfp8.fake_quantize_mxfp8(x)
    assert calls == []
    q, s = quantize_blockwise(x)
    dequantize_blockwise(q, s, name="checked")
    assert calls == ["checked"]
    # and check=False gives the same values bit for bit
    assert torch.equal(dequantize_blockwise(q, s, check=False), dequantize_blockwise(q, s))
