# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The public quantizers' dispatch (nemo_ais.formats.dispatch), without a GPU.

The decision itself for every device and switch; then the public quantizers with CPU
tensors routed to the Triton kernels (``_TRITON_DEVICES`` patched: they run under Triton's
interpreter), bit for bit against the PyTorch path (no C++ kernel, no Triton), and each
Triton wrapper seen to run (or not, when switched off).
"""

from __future__ import annotations

import re

import pytest
import torch
from bit_equal import assert_same_bits, spy_triton

import nemo_ais.formats.cpu_kernel as cpu_kernel_mod
from nemo_ais.formats import dispatch
from nemo_ais.formats.dispatch import backend_for, without_triton
from nemo_ais.formats.nvfp4 import quantize_nvfp4_experts
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# --------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------


def test_cuda_takes_triton_cpu_the_cpp_kernel_else_torch(monkeypatch):
    monkeypatch.delenv("NEMO_AIS_TRITON", raising=False)
    assert backend_for("cuda") == backend_for(torch.device("cuda", 1)) == "triton"
    assert backend_for("cuda", torch.float64) == "triton"  # the kernels take every float
    assert backend_for("cpu") == "cpu"  # the C++ kernel is built on this machine
    assert backend_for("cpu", torch.float64) == "torch"  # not a dtype the C++ kernel takes
    assert backend_for("cpu", contiguous=False) == backend_for("cpu", numel=0) == "torch"
    assert backend_for("meta") == "torch"
    monkeypatch.setattr(cpu_kernel_mod, "cpu_kernel", lambda: None)  # no compiler / switched off
    assert backend_for("cpu") == "torch" and backend_for("cuda") == "triton"


def test_nemo_ais_triton_0_switches_triton_off(monkeypatch):
    monkeypatch.setenv("NEMO_AIS_TRITON", "0")
    assert backend_for("cuda") == "torch"
    monkeypatch.setenv("NEMO_AIS_TRITON", "1")
    assert backend_for("cuda") == "triton"


def test_without_triton_importable_cuda_takes_torch(monkeypatch):
    monkeypatch.setattr(dispatch, "_triton_importable", lambda: False)
    assert backend_for("cuda") == "torch"


def test_without_triton_block_and_its_scope(monkeypatch):
    monkeypatch.delenv("NEMO_AIS_TRITON", raising=False)
    with without_triton():
        assert backend_for("cuda") == "torch"
        with without_triton():
            pass
        assert backend_for("cuda") == "torch"
    assert backend_for("cuda") == "triton"


# --------------------------------------------------------------------------------------
# The public quantizers through Triton (interpreter on CPU tensors) == the PyTorch path
# --------------------------------------------------------------------------------------

CASES = {
    "fp8": (quantize_blockwise, "quantize_blockwise_triton", (2, 130, 160), {}),
    "fp8 2-D ue8m0 c": (
        quantize_blockwise,
        "quantize_blockwise_triton",
        (130, 160),
        {"family": "multiplier", "ue8m0": True},
    ),
    "mxfp8": (quantize_mxfp8, "quantize_mxfp8_triton", (2, 24, 96), {}),
    "mxfp4": (quantize_mxfp4, "quantize_mxfp4_triton", (24, 96), {"round_ties_toward_zero": True}),
    "nvfp4": (quantize_nvfp4, "quantize_nvfp4_triton", (40, 64), {}),
    "nvfp4 16x16 static": (quantize_nvfp4, "quantize_nvfp4_triton", (2, 40, 64), {"amax": 2.0, "rows_per_block": 16}),
    "nvfp4 experts": (quantize_nvfp4_experts, "quantize_nvfp4_experts_triton", (3, 20, 64), {}),
    "nvfp4 experts 16x16": (
        quantize_nvfp4_experts,
        "quantize_nvfp4_experts_triton",
        (3, 20, 64),
        {"rows_per_block": 16},
    ),
}


@pytest.fixture
def cpu_routed_to_triton(monkeypatch):
    """CPU tensors take the Triton path (its interpreter); each wrapper counts its calls."""
    monkeypatch.delenv("NEMO_AIS_TRITON", raising=False)
    monkeypatch.setattr(dispatch, "_TRITON_DEVICES", ("cuda", "cpu"))
    return spy_triton(monkeypatch, [kernel for _, kernel, _, _ in CASES.values()])


def _reference(fn, x, kwargs, monkeypatch):
    """The PyTorch path: no Triton, no C++ kernel."""
    with monkeypatch.context() as m, without_triton():
        m.setattr(cpu_kernel_mod, "cpu_kernel", lambda: None)
        return fn(x, **kwargs)


def _input(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 3)
    x[..., 0, :32] = 0.0  # an all-zero block
    scales = torch.logspace(-2, 2, shape[0]).view(-1, *[1] * (len(shape) - 1))
    return (x * scales).to(torch.bfloat16)


@pytest.mark.parametrize("case", sorted(CASES))
def test_public_quantizer_takes_triton_with_the_pytorch_bits(case, cpu_routed_to_triton, monkeypatch):
    fn, kernel, shape, kwargs = CASES[case]
    x = _input(shape)
    want = _reference(fn, x, kwargs, monkeypatch)
    assert cpu_routed_to_triton == []
    got = fn(x, **kwargs)
    assert cpu_routed_to_triton == [kernel]
    assert_same_bits(got, want, case)


@pytest.mark.parametrize("off", ["NEMO_AIS_TRITON=0", "Triton not importable"])
def test_switched_off_the_public_quantizer_takes_no_triton(off, cpu_routed_to_triton, monkeypatch):
    if off == "NEMO_AIS_TRITON=0":
        monkeypatch.setenv("NEMO_AIS_TRITON", "0")
    else:
        monkeypatch.setattr(dispatch, "_triton_importable", lambda: False)
    x = _input((24, 96))
    assert_same_bits(quantize_mxfp8(x), _reference(quantize_mxfp8, x, {}, monkeypatch), "off")
    assert cpu_routed_to_triton == []


@pytest.mark.parametrize("case", ["fp8", "mxfp8", "nvfp4", "nvfp4 experts"])
def test_non_finite_input_through_triton_raises_the_pytorch_error(case, cpu_routed_to_triton):
    # the kernel flags the block and calls the public quantizer again, which must take the
    # PyTorch path (no second Triton call, no recursion) and raise naming the tensor
    fn, kernel, shape, kwargs = CASES[case]
    x = _input(shape)
    index = (1,) * (len(shape) - 1) + (3,)
    x[index] = float("nan")
    # an expert stack names the expert (w[1]) and the index within it
    name, index = ("w[1]", index[1:]) if "experts" in case else ("w", index)
    with pytest.raises(ValueError, match=re.escape(name) + r": got 1 non-finite.*" + re.escape(str(index))):
        fn(x, **kwargs, name="w")
    assert cpu_routed_to_triton == [kernel]


# --------------------------------------------------------------------------------------
# quantize_nvfp4_experts on the PyTorch path
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows_per_block", [1, 16])
@pytest.mark.parametrize("static", [False, True])
def test_nvfp4_experts_is_each_expert_with_its_own_global_scale(rows_per_block, static):
    x = _input((4, 24, 48), seed=3)
    amax = torch.tensor([1.0, 50.0, 0.0, 3.0]) if static else None
    got = quantize_nvfp4_experts(x, amax, rows_per_block=rows_per_block)
    assert got.global_scale.shape == (4,)
    for e in range(4):
        want = quantize_nvfp4(x[e], None if amax is None else amax[e], rows_per_block=rows_per_block)
        assert_same_bits((got.data[e], got.block_scale[e], got.global_scale[e]), tuple(vars(want).values()), f"{e}")
    if not static:  # experts of different scales: a global scale each
        assert len(set(got.global_scale.tolist())) == 4


def test_nvfp4_experts_errors_and_empty():
    with pytest.raises(ValueError, match=r"w: got \[4, 32\] with rows_per_block=1, expected \[E, N, K\]"):
        quantize_nvfp4_experts(torch.ones(4, 32), name="w")
    with pytest.raises(ValueError, match="rows_per_block=8"):
        quantize_nvfp4_experts(torch.ones(2, 4, 32), rows_per_block=8)
    with pytest.raises(ValueError, match=r"amax: got \[3\] torch.float32, expected floating \[2\]"):
        quantize_nvfp4_experts(torch.ones(2, 4, 32), torch.ones(3))
    with pytest.raises(ValueError, match=r"w: got last dim K=40"):
        quantize_nvfp4_experts(torch.ones(2, 4, 40), name="w")
    empty = quantize_nvfp4_experts(torch.ones(2, 0, 32))
    assert empty.data.shape == (2, 0, 16) and empty.global_scale.tolist() == [1.0, 1.0]


def test_a_triton_kernel_that_fails_is_logged_once_and_the_pytorch_path_runs(cpu_routed_to_triton, monkeypatch, caplog):
    # a Triton / driver that cannot compile or launch a kernel: the same bits from the
    # PyTorch path, one warning naming the kernel and the error, no second attempt
    from nemo_ais.kernels import triton_quant

    def broken(*args, **kwargs):
        cpu_routed_to_triton.append("broken")
        raise RuntimeError("PTX .version 8.7 does not support .target sm_90a")

    monkeypatch.setattr(triton_quant, "quantize_mxfp8_triton", broken)
    monkeypatch.setattr(dispatch, "_BROKEN", [])
    x = _input((24, 96))
    want = _reference(quantize_mxfp8, x, {}, monkeypatch)
    with caplog.at_level("WARNING", logger="nemo_ais.formats.dispatch"):
        assert_same_bits(quantize_mxfp8(x), want, "after a failed launch")
        assert_same_bits(quantize_mxfp8(x), want, "second call")
    assert cpu_routed_to_triton == ["broken"]  # tried once, then off for the process
    (record,) = caplog.records
    assert "quantize_mxfp8_triton failed (RuntimeError: PTX .version 8.7" in record.getMessage()
    assert backend_for("cuda") == "torch"
    with pytest.raises(ValueError, match="K=48"):  # the caller's own errors still raise
        quantize_mxfp8(torch.ones(2, 48))
