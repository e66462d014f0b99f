# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The pure-torch FP8 paths give the same bits on CUDA as on CPU (no TE needed).

torch divides a CUDA tensor by a Python scalar as a multiply by the scalar's fp32
reciprocal, so ``amax / 448`` rounds twice there and once on CPU; before the fix this
moved 376 of 2,048,000 codes of the 2000x1024 weight case by one FP8 step on an H100.
"""

from __future__ import annotations

import pytest
import torch

from nemo_ais.fp8 import quantize_activations
from nemo_ais.fp8.fp8_linear import _fake_quant_groups_b

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    diff = (a.cpu() != b.cpu()).nonzero()
    if diff.numel() == 0:
        return None
    idx = tuple(diff[0].tolist())
    return f"{diff.shape[0]} mismatch(es), first at {idx}: cuda={a.cpu()[idx]} cpu={b.cpu()[idx]}"


@pytest.mark.parametrize("family", ["a", "b", "c"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quant_on_cuda_matches_cpu(family, dtype):
    x = torch.randn(512, 2048, generator=torch.Generator().manual_seed(2)).to(dtype) * 3
    q_gpu, s_gpu = quantize_activations(x.cuda(), family=family)
    q_cpu, s_cpu = quantize_activations(x, family=family)
    assert _mismatch(q_gpu.view(torch.uint8), q_cpu.view(torch.uint8)) is None
    assert _mismatch(s_gpu.view(torch.int32), s_cpu.view(torch.int32)) is None


def test_twin_fused_activation_fake_quant_on_cuda_matches_cpu():
    x = torch.randn(64, 37, 1024, generator=torch.Generator().manual_seed(4)) * 5
    got = _fake_quant_groups_b(x.cuda(), 128, 1e-10, "x")
    ref = _fake_quant_groups_b(x, 128, 1e-10, "x")
    assert _mismatch(got.view(torch.int32), ref.view(torch.int32)) is None
