# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The compiled Triton quantizers on a CUDA device, bit for bit against the PyTorch paths.

Edge-case tensors are compared with the CPU quantizers (the reference bits); real weight
shapes and a Qwen3-30B-A3B-shaped expert stack with the PyTorch path on the same device
(``without_triton``: the public quantizers would dispatch to these kernels; itself tested
equal to CPU in tests/gpu/test_cuda_quant.py). Run by benchmarks/gpu_checks.sh.
"""

from __future__ import annotations

import pytest
import torch
from bit_equal import assert_same_bits as _assert_same

from nemo_ais.formats.dispatch import without_triton
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4
from nemo_ais.kernels.triton_quant import (
    quantize_blockwise_triton,
    quantize_mxfp4_triton,
    quantize_mxfp8_triton,
    quantize_nvfp4_experts_triton,
    quantize_nvfp4_triton,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _wide_range(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 4, shape[-1])
    x[..., :3, :] = 0.0
    x[..., :128, :128] = 0.0
    x[..., 5, :] = 1e-42
    x[..., 6, :] = -0.0
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    x[..., 7, : codes.numel() - 1] = (codes[1:] + codes[:-1]) / 2  # E4M3 midpoints
    x[..., 7, 200] = 448.0
    return x


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("eps", [1e-4, 0.0])
@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # fp16: interpreter tests
def test_blockwise_edges_equal_cpu(dtype, family, eps, ue8m0):
    x = _wide_range((300, 1000), seed=1).to(dtype)
    args = dict(family=family, eps=eps, ue8m0=ue8m0)
    _assert_same(quantize_blockwise_triton(x.cuda(), **args), quantize_blockwise(x, **args), "fp8")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_formats_edges_equal_cpu(dtype):
    x = _wide_range((300, 1024), seed=2).to(dtype)
    xc = x.cuda()
    _assert_same(quantize_mxfp8_triton(xc), quantize_mxfp8(x), "mxfp8")
    for ties in (False, True):
        want = quantize_mxfp4(x, round_ties_toward_zero=ties)
        _assert_same(quantize_mxfp4_triton(xc, round_ties_toward_zero=ties), want, "mxfp4")
    for rows in (1, 16):
        for amax in (None, 1.0, 1e4):
            want = quantize_nvfp4(x, amax, rows_per_block=rows)
            got = quantize_nvfp4_triton(xc, amax, rows_per_block=rows)
            _assert_same(got, want, f"nvfp4 rows {rows} amax {amax}")


@pytest.mark.parametrize("shape", [(4096, 4096), (14336, 4096), (128, 1536, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_weights_and_expert_stacks_equal_the_pytorch_path(shape, dtype):
    # (128, 1536, 2048): Qwen3-30B-A3B's gate_up experts of one layer, one launch
    g = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(shape, generator=g, device="cuda") * 0.02).to(dtype)
    with without_triton():  # the public quantizers' PyTorch path on the same device
        want = [
            quantize_blockwise(x),
            quantize_blockwise(x, ue8m0=True),
            quantize_mxfp8(x),
            quantize_mxfp4(x),
            quantize_nvfp4(x),
            quantize_nvfp4(x, rows_per_block=16),
        ]
    _assert_same(quantize_blockwise_triton(x), want[0], "fp8")
    _assert_same(quantize_blockwise_triton(x, ue8m0=True), want[1], "ue")
    _assert_same(quantize_mxfp8_triton(x), want[2], "mxfp8")
    _assert_same(quantize_mxfp4_triton(x), want[3], "mxfp4")
    _assert_same(quantize_nvfp4_triton(x), want[4], "nvfp4")
    _assert_same(quantize_nvfp4_triton(x, rows_per_block=16), want[5], "nvfp4 16x16")


@pytest.mark.parametrize("rows_per_block", [1, 16])
def test_nvfp4_expert_stack_with_a_scale_per_expert(rows_per_block):
    # Qwen3-30B-A3B's gate_proj stack on a TP-2 rank, experts of different scales
    g = torch.Generator(device="cuda").manual_seed(4)
    scales = torch.logspace(-3, 1, 128, device="cuda")[:, None, None]
    x = (torch.randn(128, 384, 2048, generator=g, device="cuda") * scales).bfloat16()
    got = quantize_nvfp4_experts_triton(x, rows_per_block=rows_per_block)
    for e in (0, 1, 77, 127):
        with without_triton():
            want = quantize_nvfp4(x[e], rows_per_block=rows_per_block)
        one = type(got)(got.data[e], got.block_scale[e], got.global_scale[e])
        _assert_same(one, want, f"expert {e}")


def test_non_finite_input_raises_on_cuda():
    x = torch.randn(256, 256, device="cuda")
    x[200, 3] = float("nan")
    for fn in (quantize_blockwise_triton, quantize_mxfp8_triton, quantize_nvfp4_triton):
        with pytest.raises(ValueError, match=r"w: got 1 non-finite.*\(200, 3\)"):
            fn(x, name="w")
