# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Empty tensors through the FP8 quantizers: defined shapes and dtypes, never a crash.

The rule (``nemo_ais/formats/fp8_block.py`` module doc, ``docs/low_precision.md``): codes are an empty
``float8_e4m3fn`` tensor of the input's shape; scales keep ``ceil(dim / tile)`` per tiled
dim, which is 0 for an empty tiled dim. The expected scale shapes below are worked by
hand, not computed with the formula under test.
"""

import pytest
import torch

from nemo_ais.fp8 import (
    Fp8SyncConfig,
    dequantize_activations,
    dequantize_blockwise,
    fp8_weight_stream,
    quantize_activations,
    quantize_blockwise,
)
from nemo_ais.refit.kv_scales import KVScaleCalibrator, percentile_amax
from nemo_ais.rollout.linear import Fp8Linear

FP8 = torch.float8_e4m3fn

# (x shape, block, expected scale shape)
BLOCKWISE = [
    ((300, 0), (128, 128), (3, 0)),  # ceil(300/128) = 3 row tiles, no column tile
    ((0, 300), (128, 128), (0, 3)),
    ((0, 0), (128, 128), (0, 0)),
    ((5, 0), (128, 128), (1, 0)),  # a partial row tile still counts: ceil(5/128) = 1
    ((256, 0), (128, 128), (2, 0)),  # exact multiple: 2
    ((0, 9), (4, 8), (0, 2)),  # ceil(9/8) = 2
    ((2, 300, 0), (128, 128), (2, 3, 0)),  # experts [E, N, K]
    ((2, 0, 300), (128, 128), (2, 0, 3)),
    ((0, 300, 129), (128, 128), (0, 3, 2)),  # no expert: ceil(129/128) = 2 still shaped
]


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize(("shape", "block", "scale_shape"), BLOCKWISE)
def test_quantize_blockwise_of_an_empty_tensor(shape, block, scale_shape, family):
    x = torch.empty(shape, dtype=torch.bfloat16)
    q, s = quantize_blockwise(x, block, family, name="w")
    assert (tuple(q.shape), q.dtype) == (shape, FP8)
    assert (tuple(s.shape), s.dtype) == (scale_shape, torch.float32)
    back = dequantize_blockwise(q, s, block, torch.bfloat16)
    assert (tuple(back.shape), back.dtype) == (shape, torch.bfloat16)


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_empty_blockwise_with_ue8m0_and_auto_backend(eps):
    # the "auto" backend takes the reference on CPU; UE8M0 and TE's eps = 0 rule alike
    q, s = quantize_blockwise(torch.empty(0, 7), eps=eps, ue8m0=True, backend="auto")
    assert (tuple(q.shape), q.dtype, tuple(s.shape), s.dtype) == ((0, 7), FP8, (0, 1), torch.float32)


def test_empty_slice_has_the_scale_rows_of_its_tiles():
    # consistency with a non-empty neighbour: x[:, :0] keeps x's ceil(N/128) scale rows
    x = torch.randn(300, 200)
    _, s_full = quantize_blockwise(x)
    _, s_empty = quantize_blockwise(x[:, :0])
    assert tuple(s_full.shape) == (3, 2) and tuple(s_empty.shape) == (3, 0)


# (x shape, group, expected scale shape)
ACTIVATIONS = [
    ((0,), 128, (0,)),  # ceil(0/128) = 0 groups
    ((5, 0), 128, (5, 0)),
    ((0, 7), 128, (0, 1)),
    ((0, 3, 300), 128, (0, 3, 3)),  # empty leading (batch) dim
    ((2, 0, 300), 128, (2, 0, 3)),  # empty sequence dim
    ((2, 3, 0), 128, (2, 3, 0)),  # empty hidden dim
    ((0, 0, 0), 16, (0, 0, 0)),
]


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize(("shape", "group", "scale_shape"), ACTIVATIONS)
def test_quantize_activations_of_an_empty_tensor(shape, group, scale_shape, family):
    x = torch.empty(shape, dtype=torch.float32)
    q, s = quantize_activations(x, group, family, name="x")
    assert (tuple(q.shape), q.dtype) == (shape, FP8)
    assert (tuple(s.shape), s.dtype) == (scale_shape, torch.float32)
    back = dequantize_activations(q, s, group, torch.float16)
    assert (tuple(back.shape), back.dtype) == (shape, torch.float16)


def test_empty_dequantize_still_checks_the_scale_shape():
    q, _ = quantize_blockwise(torch.empty(300, 0))
    with pytest.raises(ValueError, match=r"w: got scale \[3, 1\] torch.float32, expected \[3, 0\]"):
        dequantize_blockwise(q, torch.ones(3, 1), name="w")
    qa, _ = quantize_activations(torch.empty(0, 3, 300))
    with pytest.raises(ValueError, match=r"a: got scale \[0, 3, 2\].*expected \[0, 3, 3\]"):
        dequantize_activations(qa, torch.ones(0, 3, 2), name="a")


def test_non_empty_results_are_unchanged_next_to_an_empty_batch():
    # an empty leading dim must not change how the other rows are quantized
    x = torch.randn(4, 3, 260)
    q, s = quantize_activations(x)
    q0, s0 = quantize_activations(torch.cat([x[:0], x]))
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)


def test_refit_stream_yields_an_empty_projection():
    name = "model.layers.0.self_attn.q_proj.weight"
    out = dict(fp8_weight_stream([(name, torch.empty(0, 256, dtype=torch.bfloat16))], Fp8SyncConfig()))
    q, s = out[name], out[name + "_scale_inv"]
    assert (tuple(q.shape), q.dtype, tuple(s.shape), s.dtype) == ((0, 256), FP8, (0, 2), torch.float32)


def test_fp8_linear_on_an_empty_batch():
    torch.manual_seed(0)
    layer = Fp8Linear.from_linear(torch.nn.Linear(256, 8))
    for layer_input in (torch.randn(0, 256), torch.randn(2, 0, 256)):
        y = layer(layer_input)
        assert tuple(y.shape) == (*layer_input.shape[:-1], 8) and y.dtype == torch.float32
    # the reference (non-fused) input path: a K that is not a multiple of the group
    odd = Fp8Linear.from_linear(torch.nn.Linear(200, 8))
    assert tuple(odd(torch.randn(0, 5, 200)).shape) == (0, 5, 8)


def test_percentile_amax_of_nothing_names_x_and_observe_skips_it():
    with pytest.raises(ValueError, match=r"percentile_amax: x is empty \(\[0, 64\]"):
        percentile_amax(torch.empty(0, 64), 99.9)
    cal = KVScaleCalibrator(1)
    cal.observe(0, "k", torch.empty(0, 64))
    assert cal.local_amax()[0].tolist() == [-1.0, -1.0, -1.0]  # nothing recorded
