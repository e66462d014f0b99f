# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The Triton quantizers under Triton's interpreter (CPU tensors), bit for bit.

CPU tensors run the kernels of :mod:`nemo_ais.kernels.triton_quant` in Triton's
interpreter (the module loads an interpreted copy of its kernels: no ``TRITON_INTERPRET``
needed, and compiled kernels in the same process are unaffected). Triton is part of the
``test`` extra, so these always run. Every output is compared byte for byte with the
PyTorch quantizer (:mod:`nemo_ais.fp8`) and, for the block formats, its plain reference;
a mismatch names the first differing index and both values (DeepGEMM style). Small shapes:
the interpreter runs each program in numpy.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from bit_equal import assert_same_bits as _assert_same

from nemo_ais.formats.mxfp4 import quantize_mxfp4_reference
from nemo_ais.formats.mxfp8 import quantize_mxfp8_reference
from nemo_ais.formats.nvfp4 import quantize_nvfp4_experts, quantize_nvfp4_reference
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4
from nemo_ais.kernels.triton_quant import (
    quantize_blockwise_triton,
    quantize_mxfp4_triton,
    quantize_mxfp8_triton,
    quantize_nvfp4_experts_triton,
    quantize_nvfp4_triton,
    triton_available,
)

# The interpreter evaluates in numpy, which warns where the kernels divide by zero on
# purpose (448 / 0 = inf in an all-zero tile, taken care of by the next `where`).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

FAMILY_EPS_UE8M0 = [
    (f, eps, ue) for f in ("reciprocal", "divide", "multiplier") for eps in (1e-4, 0.0) for ue in (False, True)
]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# a pairwise design: each (family, eps, ue8m0) once, the input dtype cycling through DTYPES,
# so every family, every eps and every ue8m0 meets every dtype (the dtype only changes the
# load's cast to fp32; the 36-case cross product costs 3x the interpreter time for no pair
# left uncovered)
FAMILY_EPS_UE8M0_DTYPE = [(*c, DTYPES[i % 3]) for i, c in enumerate(FAMILY_EPS_UE8M0)]


def _wide_range(shape, seed: int) -> torch.Tensor:
    """Magnitudes 1e-30..1e4 across the columns, zero rows, an all-zero tile, fp32 subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 4, shape[-1])
    x[..., :3, :] = 0.0
    if shape[-2] > 128 and shape[-1] > 128:
        x[..., :128, :128] = 0.0
    x[..., 5, :] = 1e-42
    x[..., 6, :] = -0.0
    return x


def _weight(shape, seed: int = 0, spread: float = 3.0) -> torch.Tensor:
    """Rows of very different scales (zero, underflowing and saturating blocks occur)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.exp(torch.randn(*shape[:-1], 1, generator=g) * spread)
    return torch.randn(shape, generator=g) * rows


def _e4m3_ties(n: int, seed: int) -> torch.Tensor:
    """[n, 128] rows whose max is 448 (scale 1, so q = x): every E4M3 midpoint, exactly."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    mids = torch.cat([(codes[1:] + codes[:-1]) / 2, torch.tensor([456.0, 464.0, 470.0])])
    x = mids[torch.randint(len(mids), (n, 128), generator=g)].float()
    x *= torch.where(torch.rand(n, 128, generator=g) < 0.5, -1.0, 1.0)
    x[:, 0] = 448.0
    return x


def test_triton_is_installed_for_the_test_extra():
    # the `test` extra pins Triton: CI runs every test of this file, none may skip
    assert triton_available()


# --------------------------------------------------------------------------------------
# FP8 128x128 (and other tiles)
# --------------------------------------------------------------------------------------


def test_the_pairwise_design_covers_every_pair():
    pairs = {(i, c[i], c[3]) for c in FAMILY_EPS_UE8M0_DTYPE for i in range(3)}
    assert pairs == {(i, c[i], d) for c in FAMILY_EPS_UE8M0 for i in range(3) for d in DTYPES}


@pytest.mark.parametrize(("family", "eps", "ue8m0", "dtype"), FAMILY_EPS_UE8M0_DTYPE)
def test_blockwise_wide_range_bit_exact(family, eps, ue8m0, dtype):
    x = _wide_range((300, 260), seed=1).to(dtype)
    args = dict(family=family, eps=eps, ue8m0=ue8m0)
    _assert_same(quantize_blockwise_triton(x, **args), quantize_blockwise(x, **args), "fp8")


@pytest.mark.parametrize("shape", [(128, 128), (256, 272), (303, 300), (305, 256)])
def test_blockwise_te_shapes_bit_exact(shape):
    x = _weight(shape, seed=2)
    _assert_same(quantize_blockwise_triton(x), quantize_blockwise(x), f"fp8 {shape}")


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
def test_blockwise_e4m3_ties_and_saturation(family):
    # amax 448 gives s = 1 (family multiplier: m = 1): the scaled values are the midpoints
    # themselves, so the round-to-nearest-even of the integer encoder is what is checked;
    # 456 / 464 / 470 round or clamp to 448 (torch's cast would give NaN above 464)
    x = _e4m3_ties(128, seed=3)
    got = quantize_blockwise_triton(x, family=family)
    _assert_same(got, quantize_blockwise(x, family=family), f"ties {family}")
    assert got[0].float().abs().max().item() == 448.0


def test_blockwise_fp64_input_and_odd_tiles():
    x = _weight((30, 41), seed=4).double()  # every tile below is ragged in rows and columns
    for block in [(64, 32), (1, 128), (7, 5)]:
        for family in ("reciprocal", "divide", "multiplier"):
            args = dict(block=block, family=family)
            _assert_same(quantize_blockwise_triton(x, **args), quantize_blockwise(x, **args), f"{block}")


def test_blockwise_expert_stack_is_one_launch_and_equals_per_expert():
    x = _weight((3, 200, 260), seed=5).to(torch.bfloat16)
    q, s = quantize_blockwise_triton(x, ue8m0=True)
    assert q.shape == x.shape and s.shape == (3, 2, 3)
    _assert_same((q, s), quantize_blockwise(x, ue8m0=True), "experts")
    for e in range(3):
        _assert_same((q[e], s[e]), quantize_blockwise(x[e], ue8m0=True), f"expert {e}")


def test_blockwise_all_zero_and_tiny_amax_tiles():
    x = torch.zeros(256, 256)
    x[130, 130] = 1e-40  # eps = 0: s underflows toward 0 and must stay finite
    x[5, 200] = 3.0
    for family in ("reciprocal", "divide", "multiplier"):
        for eps in (1e-4, 0.0):
            for ue8m0 in (False, True):
                args = dict(family=family, eps=eps, ue8m0=ue8m0)
                got = quantize_blockwise_triton(x, **args)
                _assert_same(got, quantize_blockwise(x, **args), f"{args}")
                assert torch.isfinite(got[1]).all()
                if (family, eps, ue8m0) == ("multiplier", 0.0, True):  # TE: m = 2^127
                    assert got[0][130, 130].float() != 0 and got[1][1, 1] == 2.0**-127


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_blockwise_non_finite_raises_naming_the_tensor(bad):
    x = _weight((130, 140))
    x[129, 7] = bad
    with pytest.raises(ValueError, match=r"layers\.0\.w.*non-finite.*\(129, 7\)"):
        quantize_blockwise_triton(x, name="layers.0.w")


def test_blockwise_bad_arguments_empty_and_non_contiguous():
    with pytest.raises(ValueError, match="family='d'"):
        quantize_blockwise_triton(torch.ones(4, 4), family="d")
    with pytest.raises(ValueError, match="eps=-1"):
        quantize_blockwise_triton(torch.ones(4, 4), eps=-1.0)
    with pytest.raises(ValueError, match="expected a 2-D"):
        quantize_blockwise_triton(torch.ones(4))
    for shape in [(0, 300), (300, 0), (2, 0, 5)]:
        _assert_same(quantize_blockwise_triton(torch.ones(shape)), quantize_blockwise(torch.ones(shape)), f"{shape}")
    x = _weight((260, 200), seed=6).t()
    _assert_same(quantize_blockwise_triton(x), quantize_blockwise(x), "transposed")


# --------------------------------------------------------------------------------------
# MXFP8 / MXFP4
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_mxfp8_bit_exact(dtype):
    x = _weight((3, 37, 96), seed=7).to(dtype)
    got = quantize_mxfp8_triton(x)
    _assert_same(got, quantize_mxfp8(x), "mxfp8")
    _assert_same(got, quantize_mxfp8_reference(x), "mxfp8 reference")


def test_mxfp8_exponent_clamping_zero_blocks_and_ties():
    x = torch.zeros(6, 64)
    x[1, 0] = 2.0**-140  # E clamped to -127 (byte 0)
    x[2, 0] = 3.0e38  # E = 120
    x[3, 0] = 2.0**-130  # x * 2^127 = 2^-3 exactly (2^127 as a subnormal multiplier's inverse)
    x[4, :6] = torch.tensor([449.0, 500.0, 480.0, 1.8, -0.0, 1e-40])
    x[4, 32] = torch.nextafter(torch.tensor(448 * 2.0**-127), torch.tensor(1.0))  # exact E = -126
    x[5] = _e4m3_ties(1, seed=8)[0, :64]
    x[5, 32:] = _e4m3_ties(1, seed=9)[0, :32] / 1024
    got = quantize_mxfp8_triton(x)
    _assert_same(got, quantize_mxfp8(x), "mxfp8 edges")
    _assert_same(got, quantize_mxfp8_reference(x), "mxfp8 edges reference")


@pytest.mark.parametrize("ties_toward_zero", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_bit_exact(ties_toward_zero, dtype):
    x = _weight((2, 21, 160), seed=10).to(dtype)
    got = quantize_mxfp4_triton(x, round_ties_toward_zero=ties_toward_zero)
    want = quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero)
    _assert_same(got, want, "mxfp4")
    ref = quantize_mxfp4_reference(x, round_ties_toward_zero=ties_toward_zero)
    _assert_same(got, ref, "mxfp4 reference")


@pytest.mark.parametrize("ties_toward_zero", [False, True])
def test_mxfp4_e2m1_ties_hand_worked(ties_toward_zero):
    # amax 6: E = 0, y = x; every E2M1 midpoint with both signs, plus saturation at 6
    x = torch.zeros(2, 32)
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 4.0, -0.0, 2.0**-140]
    x[0, : len(mids)] = torch.tensor(mids)
    x[0, 16 : 16 + len(mids)] = -torch.tensor(mids)
    x[1] = x[0] * 2.0**-126  # a subnormal block: y = x * 2^E rounds in fp32
    got = quantize_mxfp4_triton(x, round_ties_toward_zero=ties_toward_zero)
    _assert_same(got, quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero), "ties")


def test_mx_errors_and_empty():
    with pytest.raises(ValueError, match=r"w: got last dim K=48.*K % 32 == 0"):
        quantize_mxfp8_triton(torch.ones(2, 48), name="w")
    with pytest.raises(ValueError, match=r"w: got last dim K=20"):
        quantize_mxfp4_triton(torch.ones(2, 20), name="w")
    x = torch.ones(3, 64)
    x[2, 40] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite.*\(2, 40\)"):
        quantize_mxfp8_triton(x)
    with pytest.raises(ValueError, match=r"non-finite.*\(2, 40\)"):
        quantize_mxfp4_triton(x)
    empty = torch.ones(0, 64)
    _assert_same(quantize_mxfp8_triton(empty), quantize_mxfp8(empty), "empty mxfp8")
    _assert_same(quantize_mxfp4_triton(empty), quantize_mxfp4(empty), "empty mxfp4")


# --------------------------------------------------------------------------------------
# NVFP4
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows_per_block", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_nvfp4_bit_exact(dtype, rows_per_block):
    x = _weight((37, 96), seed=11).to(dtype)  # 37 rows: a ragged last 16x16 tile
    got = quantize_nvfp4_triton(x, rows_per_block=rows_per_block)
    _assert_same(got, quantize_nvfp4(x, rows_per_block=rows_per_block), "nvfp4")
    ref = quantize_nvfp4_reference(x, rows_per_block=rows_per_block)
    _assert_same(got, ref, "nvfp4 reference")


@pytest.mark.parametrize("rows_per_block", [1, 16])
def test_nvfp4_static_amax_saturation_and_headroom(rows_per_block):
    x = _weight((3, 20, 64), seed=12)  # experts: 16x16 tiles never straddle two of them
    amax_true = float(x.abs().max())
    for amax in (amax_true * 0.25, amax_true * 3.0, torch.tensor(amax_true)):
        got = quantize_nvfp4_triton(x, amax, rows_per_block=rows_per_block)
        want = quantize_nvfp4(x, amax, rows_per_block=rows_per_block)
        _assert_same(got, want, f"amax {amax}")


def test_nvfp4_ties_zero_and_underflowing_blocks_hand_worked():
    # as tests/unit/test_fp8_nvfp4.py: s_g = 1 (amax 2688); block 1 holds every E2M1
    # midpoint (r = 1, y = x); block 2 is all zero (scale 1.0); block 3 underflows E4M3
    # (r < 2^-9: clamped, byte 0x01); -0.0 encodes as +0
    x = torch.zeros(2, 64)
    x[0, 0], x[0, 1] = 2688.0, -2688.0
    b1 = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, -6.0, 0.5, 1.0, -0.0]
    x[0, 16 : 16 + len(b1)] = torch.tensor(b1)
    x[0, 48], x[0, 49] = 1e-4, 2.0**-10
    x[1, 16:32] = 1e-30  # d = 2^-9 * s_g: y = 1e-30 / d -> code 0
    got = quantize_nvfp4_triton(x)
    _assert_same(got, quantize_nvfp4(x), "hand-worked")
    assert got.block_scale.view(torch.uint8)[0].tolist() == [0x7E, 0x38, 0x38, 0x01]
    for amax in (0.0, 1e-38):  # s_g 0 -> 1; a tiny static amax makes d underflow
        _assert_same(quantize_nvfp4_triton(x, amax), quantize_nvfp4(x, amax), f"amax {amax}")


def test_nvfp4_zero_tensor_errors_and_empty():
    zero = torch.zeros(4, 32)
    _assert_same(quantize_nvfp4_triton(zero), quantize_nvfp4(zero), "zero tensor")
    with pytest.raises(ValueError, match="rows_per_block=8"):
        quantize_nvfp4_triton(zero, rows_per_block=8)
    with pytest.raises(ValueError, match=r"w: got last dim K=40"):
        quantize_nvfp4_triton(torch.ones(2, 40), name="w")
    x = torch.ones(3, 32)
    x[1, 3] = -float("inf")
    with pytest.raises(ValueError, match=r"w: got 1 non-finite.*\(1, 3\)"):
        quantize_nvfp4_triton(x, name="w")
    with pytest.raises(ValueError, match=r"non-finite.*\(1, 3\)"):
        quantize_nvfp4_triton(x, amax=1.0)
    for amax in (None, 2.0):
        empty = torch.ones(0, 32)
        _assert_same(quantize_nvfp4_triton(empty, amax), quantize_nvfp4(empty, amax), "empty")


def test_nvfp4_experts_one_launch_equals_flattened_rows():
    x = _weight((4, 8, 48), seed=13).to(torch.bfloat16)
    got = quantize_nvfp4_triton(x)
    flat = quantize_nvfp4_triton(x.reshape(32, 48))
    assert np.array_equal(got.data.reshape(32, 24).numpy(), flat.data.numpy())
    _assert_same(got, quantize_nvfp4(x), "experts")


@pytest.mark.parametrize("rows_per_block", [1, 16])
def test_nvfp4_experts_have_one_global_scale_each(rows_per_block):
    # experts of very different scales: each must equal quantize_nvfp4 of that expert alone
    x = _weight((3, 20, 48), seed=14) * torch.tensor([1e-3, 1.0, 1e3])[:, None, None]
    static = torch.tensor([1.0, 0.5, 4000.0])
    for amax in (None, static):
        got = quantize_nvfp4_experts_triton(x, amax, rows_per_block=rows_per_block)
        assert got.global_scale.shape == (3,)
        for e in range(3):
            want = quantize_nvfp4(x[e], None if amax is None else amax[e], rows_per_block=rows_per_block)
            one = type(got)(got.data[e], got.block_scale[e], got.global_scale[e])
            _assert_same(one, want, f"expert {e} amax {amax}")


def test_nvfp4_experts_errors():
    with pytest.raises(ValueError, match=r"expected \[E, N, K\]"):
        quantize_nvfp4_experts_triton(torch.ones(4, 32))
    with pytest.raises(ValueError, match=r"amax: got \[2\]"):
        quantize_nvfp4_experts_triton(torch.ones(3, 4, 32), torch.ones(2))
    x = torch.ones(3, 4, 32)
    # a negative or non-finite amax: refused as the PyTorch path refuses it (once garbage codes)
    for bad in (-1.0, float("nan")):
        amax = torch.tensor([1.0, 2.0, bad])
        with pytest.raises(ValueError, match=r"amax: got .*expected one finite value >= 0") as err:
            quantize_nvfp4_experts_triton(x, amax)
        with pytest.raises(ValueError, match=re.escape(str(err.value))):
            quantize_nvfp4_experts(x, amax)
    x[2, 1, 5] = float("nan")
    with pytest.raises(ValueError, match=r"w\[2\]: got 1 non-finite.*\(1, 5\)"):
        quantize_nvfp4_experts_triton(x, name="w")
