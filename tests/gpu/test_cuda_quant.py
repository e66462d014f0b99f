# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The pure-torch quantizers give the same bits on CUDA as on CPU (no TE, no Triton).

FP8 (activations, the twin's fused fake quant), NVFP4 (1x16 and 16x16 tiles, static
amax, fake quant), MXFP8 and MXFP4: every byte of codes and scales, every bit of the
dequantized values.

torch divides a CUDA tensor by a Python scalar as a multiply by the scalar's fp32
reciprocal, so ``amax / 448`` rounds twice there and once on CPU; before the fix this
moved 376 of 2,048,000 codes of the 2000x1024 weight case by one FP8 step on an H100.
"""

from __future__ import annotations

import pytest
import torch

from nemo_ais.formats.fp8_block import _fake_quant_groups_divide
from nemo_ais.formats.nvfp4 import fake_quantize_nvfp4
from nemo_ais.fp8 import (
    dequantize_mxfp8,
    dequantize_nvfp4,
    quantize_activations,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(autouse=True)
def _pytorch_path(monkeypatch):
    """The PyTorch path on CUDA: Triton off (tests/gpu/test_triton_dispatch_cuda.py has it on)."""
    monkeypatch.setenv("NEMO_AIS_TRITON", "0")


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    diff = (a.cpu() != b.cpu()).nonzero()
    if diff.numel() == 0:
        return None
    idx = tuple(diff[0].tolist())
    return f"{diff.shape[0]} mismatch(es), first at {idx}: cuda={a.cpu()[idx]} cpu={b.cpu()[idx]}"


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quant_on_cuda_matches_cpu(family, dtype):
    x = torch.randn(512, 2048, generator=torch.Generator().manual_seed(2)).to(dtype) * 3
    q_gpu, s_gpu = quantize_activations(x.cuda(), family=family)
    q_cpu, s_cpu = quantize_activations(x, family=family)
    assert _mismatch(q_gpu.view(torch.uint8), q_cpu.view(torch.uint8)) is None
    assert _mismatch(s_gpu.view(torch.int32), s_cpu.view(torch.int32)) is None


def test_twin_fused_activation_fake_quant_on_cuda_matches_cpu():
    x = torch.randn(64, 37, 1024, generator=torch.Generator().manual_seed(4)) * 5
    got = _fake_quant_groups_divide(x.cuda(), 128, 1e-10, "x")
    ref = _fake_quant_groups_divide(x, 128, 1e-10, "x")
    assert _mismatch(got.view(torch.int32), ref.view(torch.int32)) is None


def _wide_weight(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp(torch.randn(shape[0], 1, generator=g) * 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_per_block", [1, 16])
@pytest.mark.parametrize("static_amax", [False, True])
def test_nvfp4_on_cuda_matches_cpu(dtype, rows_per_block, static_amax):
    x = _wide_weight((1000, 2048), seed=5).to(dtype)
    amax = float(x.float().abs().max()) * 0.5 if static_amax else None  # half: saturation
    q_gpu = quantize_nvfp4(x.cuda(), amax, rows_per_block=rows_per_block)
    q_cpu = quantize_nvfp4(x, amax, rows_per_block=rows_per_block)
    assert _mismatch(q_gpu.data, q_cpu.data) is None
    assert _mismatch(q_gpu.block_scale.view(torch.uint8), q_cpu.block_scale.view(torch.uint8)) is None
    assert _mismatch(q_gpu.global_scale.view(torch.int32), q_cpu.global_scale.view(torch.int32)) is None
    deq_gpu, deq_cpu = dequantize_nvfp4(q_gpu), dequantize_nvfp4(q_cpu)
    assert _mismatch(deq_gpu.view(torch.int32), deq_cpu.view(torch.int32)) is None
    fake = fake_quantize_nvfp4(x.cuda(), amax, rows_per_block=rows_per_block)
    assert _mismatch(fake.view(torch.int32), deq_cpu.view(torch.int32)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mx_formats_on_cuda_match_cpu(dtype):
    x = _wide_weight((1000, 2048), seed=6).to(dtype)
    g8, c8 = quantize_mxfp8(x.cuda()), quantize_mxfp8(x)
    assert _mismatch(g8.data.view(torch.uint8), c8.data.view(torch.uint8)) is None
    assert _mismatch(g8.scale, c8.scale) is None
    assert _mismatch(dequantize_mxfp8(g8).view(torch.int32), dequantize_mxfp8(c8).view(torch.int32)) is None
    for ties in (False, True):
        g4 = quantize_mxfp4(x.cuda(), round_ties_toward_zero=ties)
        c4 = quantize_mxfp4(x, round_ties_toward_zero=ties)
        assert _mismatch(g4.data, c4.data) is None and _mismatch(g4.scale, c4.scale) is None


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
@pytest.mark.parametrize(("eps", "ue8m0"), [(1e-4, False), (0.0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blockwise_fp8_on_cuda_matches_the_cpu_kernel(family, eps, ue8m0, dtype):
    # CPU: the fused C++ kernel (nemo_ais.formats.cpu_kernel); CUDA: the PyTorch path
    from nemo_ais.fp8 import quantize_blockwise

    x = _wide_weight((1000, 2000), seed=7).to(dtype)
    q_gpu, s_gpu = quantize_blockwise(x.cuda(), family=family, eps=eps, ue8m0=ue8m0)
    q_cpu, s_cpu = quantize_blockwise(x, family=family, eps=eps, ue8m0=ue8m0)
    assert _mismatch(q_gpu.view(torch.uint8), q_cpu.view(torch.uint8)) is None
    assert _mismatch(s_gpu.view(torch.int32), s_cpu.view(torch.int32)) is None
