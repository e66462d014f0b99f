# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The public quantizers on CUDA take the Triton kernels, with the PyTorch path's bits.

Each format's public quantizer on a CUDA tensor (``nemo_ais.formats.dispatch``: Triton)
against the same call with ``NEMO_AIS_TRITON=0`` (the PyTorch path on the same device),
byte for byte; and the refit stream's expert stacks on CUDA against one expert at a time
on the PyTorch path. Run by benchmarks/gpu_checks.sh (``pytest -m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from bit_equal import assert_same_bits, spy_triton

from nemo_ais.formats.dispatch import backend_for
from nemo_ais.formats.nvfp4 import quantize_nvfp4_experts
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4
from nemo_ais.refit.stream import RefitConfig, refit_stream

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _weight(shape, seed: int) -> torch.Tensor:
    """Rows and experts of very different scales (zero, underflowing, saturating blocks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 3)
    x[..., :3, :] = 0.0
    return x


LABELS = ("public", "PyTorch path")
CASES = {
    "fp8": (quantize_blockwise, "quantize_blockwise_triton", {}),
    "fp8 c ue8m0 eps 0": (
        quantize_blockwise,
        "quantize_blockwise_triton",
        {"family": "multiplier", "ue8m0": True, "eps": 0.0},
    ),
    "mxfp8": (quantize_mxfp8, "quantize_mxfp8_triton", {}),
    "mxfp4": (quantize_mxfp4, "quantize_mxfp4_triton", {}),
    "mxfp4 ties to zero": (quantize_mxfp4, "quantize_mxfp4_triton", {"round_ties_toward_zero": True}),
    "nvfp4": (quantize_nvfp4, "quantize_nvfp4_triton", {}),
    "nvfp4 16x16 static": (quantize_nvfp4, "quantize_nvfp4_triton", {"amax": 3.0, "rows_per_block": 16}),
}


@pytest.fixture
def triton_calls(monkeypatch):
    """Triton on; each Triton wrapper counts its calls."""
    monkeypatch.delenv("NEMO_AIS_TRITON", raising=False)
    kernels = [k for _, k, _ in CASES.values()]
    return spy_triton(monkeypatch, [*kernels, "quantize_nvfp4_experts_triton"])


def _pytorch_path(fn, x, kwargs, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("NEMO_AIS_TRITON", "0")
        return fn(x, **kwargs)


# 1000 rows: ragged FP8 tiles; [4, 384, 512]: an expert stack
@pytest.mark.parametrize(
    ("dtype", "shape"), [(torch.bfloat16, (1000, 2048)), (torch.bfloat16, (4, 384, 512)), (torch.float32, (1000, 2048))]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_public_quantizer_on_cuda_is_triton_with_the_pytorch_bits(case, dtype, shape, triton_calls, monkeypatch):
    assert backend_for("cuda") == "triton"
    fn, kernel, kwargs = CASES[case]
    x = _weight(shape, seed=1).to(dtype).cuda()
    want = _pytorch_path(fn, x, kwargs, monkeypatch)
    assert triton_calls == []
    got = fn(x, **kwargs)
    assert triton_calls == [kernel]
    assert_same_bits(got, want, f"{case} {dtype} {shape}", LABELS)


@pytest.mark.parametrize("rows_per_block", [1, 16])
@pytest.mark.parametrize("static", [False, True])
def test_nvfp4_experts_on_cuda_is_one_triton_launch_with_the_pytorch_bits(
    rows_per_block, static, triton_calls, monkeypatch
):
    x = (_weight((16, 384, 512), seed=2) * torch.logspace(-3, 1, 16)[:, None, None]).bfloat16()
    x = x.cuda()
    amax = torch.logspace(-2, 1, 16, device="cuda") if static else None
    kwargs = {"amax": amax, "rows_per_block": rows_per_block}
    want = _pytorch_path(quantize_nvfp4_experts, x, kwargs, monkeypatch)
    got = quantize_nvfp4_experts(x, **kwargs)
    assert triton_calls == ["quantize_nvfp4_experts_triton"]
    assert_same_bits(got, want, f"experts rows {rows_per_block} static {static}", LABELS)


def test_non_finite_input_on_cuda_raises_the_pytorch_error(triton_calls):
    x = torch.randn(256, 256, device="cuda")
    x[200, 3] = float("nan")
    for fn, _, kwargs in CASES.values():
        with pytest.raises(ValueError, match=r"w: got 1 non-finite.*\(200, 3\)"):
            fn(x, **kwargs, name="w")


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4_w4a16"])
def test_refit_expert_stacks_on_cuda_send_the_per_expert_pytorch_bytes(fmt, monkeypatch):
    # a Qwen3-30B-A3B-like layer on one TP-2 rank, 16 experts: stacks by Triton on CUDA
    g = torch.Generator().manual_seed(3)
    tensors = []
    for e in range(16):
        p = f"model.layers.0.mlp.experts.{e}."
        for proj, shape in (("gate_proj", (384, 2048)), ("up_proj", (384, 2048))):
            tensors.append((p + proj + ".weight", (torch.randn(shape, generator=g) * (e + 1))))
        tensors.append((p + "down_proj.weight", torch.randn(2048, 384, generator=g)))
    tensors = [(n, t.bfloat16().cuda()) for n, t in tensors]
    with monkeypatch.context() as m:
        m.setenv("NEMO_AIS_TRITON", "0")
        want = {n: t.clone() for n, t in refit_stream(tensors, RefitConfig(format=fmt))}
    got = {n: t.clone() for n, t in refit_stream(tensors, RefitConfig(format=fmt, num_experts=16))}
    assert sorted(got) == sorted(want)
    for name in want:
        assert_same_bits((got[name],), (want[name],), name, LABELS)
