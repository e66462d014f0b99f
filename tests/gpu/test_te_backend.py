# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Transformer Engine's blockwise quantizer vs the torch reference, bit for bit (CUDA + TE)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fp8_oracles import TE_SHAPES
from skip_policy import NO_CUDA, require_te

from nemo_ais.fp8 import quantize_blockwise

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]


@pytest.fixture(scope="module")
def _needs_te():
    require_te()  # skips only if TE is absent; a present but broken TE fails


def _first_mismatch(a: torch.Tensor, b: torch.Tensor, what: str) -> str | None:
    a, b = a.cpu().numpy(), b.cpu().numpy()
    diff = np.argwhere(a != b)
    if diff.size == 0:
        return None
    idx = tuple(int(i) for i in diff[0])
    return f"{what}: {len(diff)} mismatch(es), first at {idx}: te={a[idx]!r} torch={b[idx]!r}"


@pytest.mark.parametrize("shape", TE_SHAPES)
@pytest.mark.parametrize("eps", [0.0, 1e-4])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.te
@pytest.mark.usefixtures("_needs_te")
def test_te_matches_torch_family_multiplier(shape, eps, ue8m0, dtype):
    g = torch.Generator(device="cuda").manual_seed(shape[0])
    x = torch.randn(shape, generator=g, device="cuda").to(dtype)
    x[:128, :128] = 0.0  # an all-zero tile: TE's amax == 0 rule
    q_te, s_te = quantize_blockwise(x, family="multiplier", eps=eps, ue8m0=ue8m0, backend="te")
    q_ref, s_ref = quantize_blockwise(x.cpu(), family="multiplier", eps=eps, ue8m0=ue8m0)
    assert q_te.dtype == torch.float8_e4m3fn and q_te.shape == x.shape
    assert s_te.shape == s_ref.shape and s_te.dtype == torch.float32
    msg = _first_mismatch(s_te.view(torch.int32), s_ref.view(torch.int32), "scale bits")
    assert msg is None, msg
    msg = _first_mismatch(q_te.view(torch.uint8), q_ref.view(torch.uint8), "codes")
    assert msg is None, msg


@pytest.mark.te
@pytest.mark.usefixtures("_needs_te")
def test_auto_picks_te_for_family_c_on_cuda_and_torch_otherwise():
    x = torch.randn(256, 384, device="cuda")
    q_auto, s_auto = quantize_blockwise(x, family="multiplier", eps=0.0, backend="auto")
    q_te, s_te = quantize_blockwise(x, family="multiplier", eps=0.0, backend="te")
    assert torch.equal(q_auto.view(torch.uint8), q_te.view(torch.uint8))
    assert torch.equal(s_auto, s_te)
    with pytest.raises(ValueError, match="family='multiplier' with block=\\(128, 128\\) only"):
        quantize_blockwise(x, family="reciprocal", backend="te")


@pytest.mark.te
@pytest.mark.usefixtures("_needs_te")
def test_te_backend_rejects_nan_and_handles_experts():
    x = torch.randn(2, 200, 300, device="cuda")
    q, s = quantize_blockwise(x, family="multiplier", eps=0.0, backend="te")
    q0, s0 = quantize_blockwise(x[1].cpu(), family="multiplier", eps=0.0)
    assert torch.equal(q[1].cpu().view(torch.uint8), q0.view(torch.uint8))
    assert torch.equal(s[1].cpu(), s0)
    x[1, 5, 7] = float("nan")
    with pytest.raises(ValueError, match="w: got 1 non-finite"):
        quantize_blockwise(x, family="multiplier", eps=0.0, backend="te", name="w")


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
def test_torch_reference_on_cuda_matches_cpu(family, monkeypatch):
    # the pure-torch path (Triton off) runs unchanged on CUDA tensors: the CPU bits
    monkeypatch.setenv("NEMO_AIS_TRITON", "0")
    x = torch.randn(2000, 1024, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q_gpu, s_gpu = quantize_blockwise(x.cuda(), family=family)
    q_cpu, s_cpu = quantize_blockwise(x, family=family)
    assert q_gpu.device.type == "cuda" and s_gpu.device.type == "cuda"
    msg = _first_mismatch(q_gpu.view(torch.uint8), q_cpu.view(torch.uint8), "codes")
    assert msg is None, msg
    msg = _first_mismatch(s_gpu.view(torch.int32), s_cpu.view(torch.int32), "scale bits")
    assert msg is None, msg
