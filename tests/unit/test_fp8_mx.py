# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""MXFP8 and MXFP4 quantizers bit for bit against the float64 oracle and hand-worked cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from block_format_oracles import mx_exponent, mxfp4_oracle, mxfp8_oracle
from fp8_oracles import first_mismatch

from nemo_ais.formats.mxfp4 import MXFP4Tensor, dequantize_mxfp4, quantize_mxfp4, quantize_mxfp4_reference
from nemo_ais.formats.mxfp8 import MXFP8Tensor, fake_quantize_mxfp8, quantize_mxfp8_reference
from nemo_ais.fp8 import dequantize_mxfp8, quantize_mxfp8  # the public names


def _assert_equal(actual, expected, what):
    msg = first_mismatch(np.asarray(actual), np.asarray(expected), what)
    assert msg is None, msg


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


def _weight(shape, dtype=torch.float32, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.exp(torch.randn(*shape[:-1], 1, generator=g) * spread)
    return (torch.randn(shape, generator=g) * rows).to(dtype)


def _check_mxfp8(x: torch.Tensor):
    q = quantize_mxfp8(x)
    data, scale, deq = mxfp8_oracle(x.float().numpy())
    tag = f"{list(x.shape)} {x.dtype}"
    _assert_equal(q.data.view(torch.uint8).numpy(), data, f"data {tag}")
    _assert_equal(q.scale.numpy(), scale, f"scale {tag}")
    _assert_equal(_bits(dequantize_mxfp8(q)), deq.view(np.int32), f"dequant {tag}")
    ref = quantize_mxfp8_reference(x)
    _assert_equal(ref.data.view(torch.uint8).numpy(), data, f"reference data {tag}")
    _assert_equal(ref.scale.numpy(), scale, f"reference scale {tag}")
    _assert_equal(_bits(fake_quantize_mxfp8(x)), deq.view(np.int32), f"fake quant {tag}")


def _check_mxfp4(x: torch.Tensor, ties_toward_zero: bool):
    q = quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero)
    data, scale, deq = mxfp4_oracle(x.float().numpy(), ties_toward_zero)
    tag = f"{list(x.shape)} {x.dtype} ties_toward_zero={ties_toward_zero}"
    _assert_equal(q.data.numpy(), data, f"data {tag}")
    _assert_equal(q.scale.numpy(), scale, f"scale {tag}")
    _assert_equal(_bits(dequantize_mxfp4(q)), deq.view(np.int32), f"dequant {tag}")
    ref = quantize_mxfp4_reference(x, round_ties_toward_zero=ties_toward_zero)
    _assert_equal(ref.data.numpy(), data, f"reference data {tag}")


# --------------------------------------------------------------------------------------
# MXFP8
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(2))
def test_mxfp8_random_bit_exact(dtype, seed):
    _check_mxfp8(_weight((11, 128), dtype, seed=seed))


# amax -> NVIDIA E = ceil(log2(amax / 448)), worked by hand, and OCP's floor(log2 amax) - 8
EXPONENT_CASES = [
    (448.0, 0, 0),  # 448 / 448 = 1 = 2^0: both 0
    (449.0, 1, 0),  # 449/448 > 1: ceil 1; log2 449 = 8.81 -> floor 8 - 8 = 0 (OCP saturates)
    (500.0, 1, 0),  # the note's example: NVIDIA 2^1, OCP 2^0
    (256.0, 0, 0),  # 256/448 = 0.57 -> log2 = -0.8 -> ceil 0; floor(8) - 8 = 0: agree
    (480.0, 1, 0),  # significand 480/256 = 1.875 > 1.75: they differ
    (448.0 / 8, -3, -3),  # exactly a power of two times 448: ceil keeps it
    (1.0, -8, -8),  # 1/448 = 2^-8.8: ceil -8; floor(0) - 8 = -8
    (1.8, -7, -8),  # 1.8 = 1.8 * 2^0 > 1.75: NVIDIA -7 (1.8/448 = 2^-7.96), OCP -8
]


@pytest.mark.parametrize(("amax", "nvidia", "ocp"), EXPONENT_CASES)
def test_mxfp8_exponent_is_nvidias_ceil_rule(amax, nvidia, ocp):
    x = torch.zeros(1, 32)
    x[0, 5] = amax
    x[0, 6] = -amax / 3
    q = quantize_mxfp8(x)
    assert q.scale.item() == nvidia + 127
    assert math.floor(math.log2(amax)) - 8 == ocp  # the rule we do not follow, for contrast
    assert mx_exponent(amax, 448.0) == nvidia  # the oracle agrees
    scaled = amax * 2.0**-nvidia
    assert 224.0 < scaled <= 448.0, "the scaled block max lies in (224, 448]: no saturation"
    assert q.data.float()[0, 5].item() <= 448.0


def test_mxfp8_e8m0_clamping_and_zero_block():
    x = torch.zeros(4, 32)
    x[1, 0] = 2.0**-140  # 2^-140 / 448 = 2^-148.8: E = -148 -> clamped to -127 (byte 0)
    x[2, 0] = 3.0e38  # 3e38 / 448 = 2^119.0...: E = 120 (byte 247); largest fp32 is 2^128
    x[3, 0] = 2.0**-130  # below 2^-127 * 448 too: byte 0, and x * 2^127 = 2^-3 is exact
    q = quantize_mxfp8(x)
    assert q.scale[:, 0].tolist() == [0, 0, 247, 0]  # row 0 is all zero: byte 0
    assert (q.data[0].float() == 0).all()
    deq = dequantize_mxfp8(q)
    assert deq[0].abs().sum() == 0 and deq[3, 0].item() == 2.0**-130
    _check_mxfp8(x)


def test_nemo_rl_zero_scale_byte_rewrite_keeps_the_values():
    # NeMo-RL main (`quantize_mxfp8_weight`) rewrites scale byte 0 -> 1 for its TRT-LLM
    # kernel; the codes of an all-zero block are 0, so the decoded tensor is unchanged
    x = _weight((4, 96), seed=3)
    x[1, 32:64] = 0
    q = quantize_mxfp8(x)
    assert q.scale[1, 1].item() == 0
    rewritten = MXFP8Tensor(q.data, torch.where(q.scale == 0, 1, q.scale).to(torch.uint8))
    assert torch.equal(dequantize_mxfp8(rewritten), dequantize_mxfp8(q))


def test_mxfp8_errors_and_empty():
    with pytest.raises(ValueError, match=r"^x: got last dim K=48 .*K % 32 == 0"):
        quantize_mxfp8(torch.ones(2, 48))
    bad = _weight((3, 64))
    bad[2, 40] = float("nan")
    with pytest.raises(ValueError, match=r"act: got 1 non-finite .*\(2, 40\)"):
        quantize_mxfp8(bad, name="act")
    q = quantize_mxfp8(torch.ones(2, 64))
    with pytest.raises(ValueError, match=r"scale byte 255 \(UE8M0 NaN\) at index \(1, 0\)"):
        dequantize_mxfp8(MXFP8Tensor(q.data, torch.tensor([[127, 127], [255, 127]]).byte()))
    with pytest.raises(ValueError, match=r"expected uint8 \[2, 2\]"):
        dequantize_mxfp8(MXFP8Tensor(q.data, q.scale[:, :1]))
    empty = quantize_mxfp8(torch.empty(0, 3, 64, dtype=torch.bfloat16))
    assert empty.data.shape == (0, 3, 64) and empty.scale.shape == (0, 3, 2)
    assert dequantize_mxfp8(empty).shape == (0, 3, 64)
    assert quantize_mxfp8(torch.empty(4, 0)).scale.shape == (4, 0)


@pytest.mark.parametrize("shape", [(4096, 4096), (12288, 4096)])
def test_mxfp8_qwen_sized_round_trip_within_the_grid_bound(shape):
    # E4M3 keeps 3 mantissa bits: |x - x_hat| <= 2^-4 |x| for normal codes, and at most half
    # the subnormal quantum, 2^(E - 10), below 2^(E - 6)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(5)) * 0.02).bfloat16()
    q = quantize_mxfp8(x)
    for r0 in range(0, shape[0], 2048):
        rows = slice(r0, r0 + 2048)
        xr = x[rows].float()
        err = (dequantize_mxfp8(MXFP8Tensor(q.data[rows], q.scale[rows])) - xr).abs()
        expo = q.scale[rows].to(torch.int32) - 127
        floor = torch.ldexp(torch.ones_like(xr[:, ::32]), expo - 10).repeat_interleave(32, -1)
        bound = torch.maximum(xr.abs() * 2**-4, floor)
        assert not (err > bound).any(), f"rows {r0}+: error above the E4M3 bound"
    if shape == (4096, 4096):
        ref = quantize_mxfp8_reference(x)
        _assert_equal(q.data.view(torch.uint8).numpy(), ref.data.view(torch.uint8).numpy(), "data")
        _assert_equal(q.scale.numpy(), ref.scale.numpy(), "scale")


# --------------------------------------------------------------------------------------
# MXFP4
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ties_toward_zero", [False, True])
@pytest.mark.parametrize("seed", range(2))
def test_mxfp4_random_bit_exact(ties_toward_zero, seed):
    _check_mxfp4(_weight((9, 96), seed=seed), ties_toward_zero)


def test_mxfp4_ties_hand_worked():
    # amax 6: E = ceil(log2(6/6)) = 0, so y = x and the ties show directly.
    # even: .75->1 (code 2), 1.75->2 (4), 3.5->4 (6), 5->4 (6); toward zero: .75->.5 (1),
    # 1.75->1.5 (3), 3.5->3 (5), 5->4 (6)
    x = torch.zeros(1, 32)
    x[0, :6] = torch.tensor([6.0, 0.75, 1.75, 3.5, 5.0, -0.75])
    even = quantize_mxfp4(x)
    toward_zero = quantize_mxfp4(x, round_ties_toward_zero=True)
    assert even.scale.item() == 127 and toward_zero.scale.item() == 127
    assert even.data[0, :3].tolist() == [7 | 2 << 4, 4 | 6 << 4, 6 | 10 << 4]
    assert toward_zero.data[0, :3].tolist() == [7 | 1 << 4, 3 | 5 << 4, 6 | 9 << 4]
    assert dequantize_mxfp4(toward_zero)[0, :6].tolist() == [6, 0.5, 1.5, 3, 4, -0.5]
    _check_mxfp4(x, False)
    _check_mxfp4(x, True)


def test_mxfp4_errors_and_empty():
    with pytest.raises(ValueError, match=r"^w: got last dim K=16 .*K % 32 == 0"):
        quantize_mxfp4(torch.ones(2, 16), name="w")
    q = quantize_mxfp4(torch.empty(0, 64))
    assert q.data.shape == (0, 32) and q.scale.shape == (0, 2)
    with pytest.raises(ValueError, match=r"expected uint8 \[1, 1\]"):
        dequantize_mxfp4(MXFP4Tensor(torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(1, 2)))


@pytest.mark.parametrize("ties_toward_zero", [False, True])
def test_mxfp4_negative_zero_matches_the_oracle(ties_toward_zero):
    # Issue 27: -0.0 (no sign bit under the x < 0 rule) in a live block, in an all -0.0
    # block (amax 0: the E = -127 zero-block scale), and tiny negatives that round to -0
    x = torch.zeros(2, 64)
    x[0, :6] = torch.tensor([6.0, -0.0, -0.1, -0.0, 0.0, -3.0])
    x[0, 32:] = -0.0
    x[1, :3] = torch.tensor([-0.0, -1e-30, 2.0])
    _check_mxfp4(x, ties_toward_zero)
    q = quantize_mxfp4(x, round_ties_toward_zero=ties_toward_zero)
    assert q.data[0, 0].item() == 7  # 6 -> code 7; -0.0 -> code 0 (not 8)
    assert q.scale[0, 1].item() == 0  # the all -0.0 block: E = -127
    deq = dequantize_mxfp4(q)
    assert (deq[0, 32:] == 0).all()


@pytest.mark.parametrize("amax", [1e-37, 1e-39, 1e-44])
def test_mxfp4_tiny_blocks_match_the_oracle(amax):
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 9] = amax, -amax / 2
    _check_mxfp4(x, False)


def _just_above(value: float) -> float:
    """The next fp32 above ``value`` (an amax whose quotient by the element max rounds down onto 2^-127)."""
    return torch.nextafter(torch.tensor(value, dtype=torch.float32), torch.tensor(1.0)).item()


@pytest.mark.parametrize("element", ["mxfp8", "mxfp4"])
def test_an_amax_whose_fp32_quotient_rounds_onto_2_pow_minus_127_takes_the_exact_exponent(element):
    """ceil(log2(amax / element_max)) of the exact quotient: -126 (byte 1), not -127 (which then doubles the value)."""
    element_max = 448.0 if element == "mxfp8" else 6.0
    x = torch.zeros(2, 32)
    x[0, 0] = _just_above(element_max * 2.0**-127)
    x[1, 0] = element_max * 2.0**-127  # exactly on it: -127
    assert [mx_exponent(v, element_max) for v in x[:, 0].tolist()] == [-126, -127]
    if element == "mxfp8":
        _check_mxfp8(x)
    else:
        _check_mxfp4(x, False)
