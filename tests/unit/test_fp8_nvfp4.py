# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""NVFP4 quantizer (nemo_ais.formats.nvfp4) bit for bit against the float64 oracle and hand-worked cases.

The oracle (tests/block_format_oracles.py) imports nothing from nemo_ais; hand-worked
cases carry their arithmetic in comments. Every comparison is on bytes or int32 bits and
reports the first mismatching index and both values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from block_format_oracles import E2M1_GRID, e2m1_code, nvfp4_oracle
from fp8_oracles import first_mismatch

from nemo_ais.formats.grids import (
    e2m1_codes,
    e2m1_codes_reference,
    e2m1_encode_,
    e2m1_signed_values_,
    e2m1_values,
    pack_code_pairs,
    pack_nibbles,
)
from nemo_ais.formats.nvfp4 import NVFP4Tensor, fake_quantize_nvfp4, quantize_nvfp4_reference
from nemo_ais.fp8 import dequantize_nvfp4, quantize_nvfp4  # the public names

E4M3 = torch.float8_e4m3fn


def _assert_equal(actual, expected, what):
    msg = first_mismatch(np.asarray(actual), np.asarray(expected), what)
    assert msg is None, msg


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


def _scale_bytes(q: NVFP4Tensor) -> np.ndarray:
    return q.block_scale.view(torch.uint8).numpy()


def _assert_matches_oracle(x: torch.Tensor, amax=None, rows_per_block=1):
    q = quantize_nvfp4(x, amax, rows_per_block=rows_per_block)
    data, scales, s_g, deq = nvfp4_oracle(x.float().numpy(), amax, rows_per_block)
    tag = f"{list(x.shape)} {x.dtype} amax={amax} rows_per_block={rows_per_block}"
    _assert_equal(q.data.numpy(), data, f"data {tag}")
    _assert_equal(_scale_bytes(q), scales, f"block scales {tag}")
    assert q.global_scale.item() == float(s_g), tag
    _assert_equal(_bits(dequantize_nvfp4(q)), deq.view(np.int32), f"dequant {tag}")
    ref = quantize_nvfp4_reference(x, amax, rows_per_block=rows_per_block)
    _assert_equal(ref.data.numpy(), data, f"reference data {tag}")
    _assert_equal(_scale_bytes(ref), scales, f"reference scales {tag}")
    fake = fake_quantize_nvfp4(x, amax, rows_per_block=rows_per_block)
    _assert_equal(_bits(fake), deq.view(np.int32), f"fake quant {tag}")


def _weight(shape, dtype=torch.float32, seed=0, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.exp(torch.randn(*shape[:-1], 1, generator=g) * spread)
    return (torch.randn(shape, generator=g) * rows).to(dtype)


# --------------------------------------------------------------------------------------
# E2M1 rounding: oracle, reference and fast path agree on every grid point and tie
# --------------------------------------------------------------------------------------


def _probe_values() -> np.ndarray:
    """Grid points, midpoints, and the float32 neighbours of each, plus extremes."""
    grid = np.array(E2M1_GRID, dtype=np.float32)
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    pts = np.concatenate([grid, mids, [6.5, 7.0, 100.0, 3e38, 1e-45, 1e-30, 0.1]])
    pts = pts.astype(np.float32)
    near = np.concatenate([np.nextafter(pts, np.float32(0)), np.nextafter(pts, np.float32(9e9))])
    return np.unique(np.concatenate([pts, near]).astype(np.float32))


@pytest.mark.parametrize("ties_toward_zero", [False, True])
def test_e2m1_rounding_fast_reference_and_oracle_agree(ties_toward_zero):
    a = _probe_values()
    expected = np.array([e2m1_code(float(v), ties_toward_zero) for v in a], dtype=np.uint8)
    t = torch.from_numpy(a)
    ref = e2m1_codes_reference(t, ties_toward_zero=ties_toward_zero).numpy()
    fast = e2m1_codes(t, ties_toward_zero=ties_toward_zero).numpy()
    _assert_equal(ref, expected, "reference codes")
    _assert_equal(fast, expected, "fast codes")


def test_e2m1_ties_hand_worked():
    # ties go to the even code: 0.25->0 (code 0), 0.75->1 (code 2), 1.25->1 (2), 1.75->2 (4),
    # 2.5->2 (4), 3.5->4 (6), 5->4 (6); toward zero: 0.75->0.5 (1), 1.75->1.5 (3), 3.5->3 (5)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_codes(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert e2m1_codes(ties, ties_toward_zero=True).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert [e2m1_code(v) for v in ties.tolist()] == [0, 2, 2, 4, 4, 6, 6]  # the oracle too
    assert e2m1_codes(torch.tensor([6.0, 6.01, 1e9])).tolist() == [7, 7, 7]  # saturation


def _signed_probe() -> torch.Tensor:
    """Signed fp32: the probe values, every multiple of 2^20 in bits (the table's class
    edges) and its fp32 neighbours up to 6.5, and random finite bit patterns of any sign."""
    pos = torch.from_numpy(_probe_values())
    edges = torch.arange(0, 0x40D0_0000 >> 20, dtype=torch.int32) << 20  # 0 .. 6.5
    edges = torch.cat([edges, edges + 1, edges - 1]).clamp_(min=0).view(torch.float32)
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), generator=g, dtype=torch.int64)
    rand = rand.to(torch.int32).view(torch.float32)
    mags = torch.cat([pos, edges, rand[torch.isfinite(rand)].abs()])
    return torch.cat([mags, -mags])


@pytest.mark.parametrize("ties_toward_zero", [False, True])
def test_e2m1_table_encoder_equals_the_reference_with_sign(ties_toward_zero):
    """``e2m1_encode_`` (class table) == ``e2m1_codes_reference(|y|) | 8 * signbit(y)``."""
    y = _signed_probe()
    sign = torch.signbit(y).to(torch.uint8) << 3
    expected = e2m1_codes_reference(y.abs(), ties_toward_zero=ties_toward_zero) | sign
    out = torch.empty(y.shape, dtype=torch.uint8)
    tmp = torch.empty(y.shape, dtype=torch.int32)
    codes = e2m1_encode_(y.clone(), out, tmp, ties_toward_zero=ties_toward_zero)
    _assert_equal(codes.numpy(), expected.numpy(), "table codes")
    if not ties_toward_zero:  # the value table: E2M1 value with the sign (code 8 is -0.0)
        values = e2m1_signed_values_(y.clone(), torch.empty_like(y))
        _assert_equal(_bits(values), _bits(e2m1_values(expected)), "table values")


def test_pack_code_pairs_equals_pack_nibbles():
    codes = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(0))
    codes = codes.to(torch.uint8)
    out = torch.empty(6, 32, dtype=torch.uint8)
    packed = pack_code_pairs(codes, out, torch.empty(6, 32, dtype=torch.int16))
    _assert_equal(packed.numpy(), pack_nibbles(codes).numpy(), "packed bytes")
    # hand-worked: codes (3, 12) -> 3 | 12 << 4 = 0xC3
    pair = torch.tensor([[3, 12]], dtype=torch.uint8)
    one = torch.empty(1, 1, dtype=torch.uint8)
    assert pack_code_pairs(pair, one, torch.empty(1, 1, dtype=torch.int16)).item() == 0xC3


# --------------------------------------------------------------------------------------
# NVFP4 against the oracle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_random_weights_bit_exact(dtype):
    x = _weight((9, 96), dtype, seed=3)
    if dtype == torch.float64:  # computed in fp32: the oracle sees the fp32 rounding
        x = x.float().double()
    _assert_matches_oracle(x)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_static_amax_and_2d_tiles_bit_exact(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 40)), 16 * int(rng.integers(1, 9))
    x = _weight((n, k), seed=seed, spread=3.0)
    amax_true = float(x.abs().max())
    for amax in (None, amax_true * 0.25, amax_true * 3.0):  # stale amax: saturation, headroom
        _assert_matches_oracle(x, amax)
    _assert_matches_oracle(x, rows_per_block=16)


def test_ties_saturation_and_packing_hand_worked():
    # amax = 2688 = 6 * 448 gives s_g = 1 exactly. Block 0 holds the tensor amax: r = 2688 /
    # 6 = 448, scale 448, y = 2688 / 448 = 6 -> code 7 (and -2688 -> code 15).
    # Block 1 has amax 6: r = 6 / 6 = 1, scale 1, d = 1, so y = x: the ties round to even.
    b0 = [2688.0, -2688.0] + [0.0] * 14
    b1 = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, -6.0, 0.5, 1.0, 0, 0]
    q = quantize_nvfp4(torch.tensor([b0 + b1]))
    assert q.global_scale.item() == 1.0
    assert q.block_scale.float().tolist() == [[448.0, 1.0]]
    codes = [(b & 0xF, b >> 4) for b in q.data[0].tolist()]
    flat = [c for pair in codes for c in pair]
    # block 1: 6->7, .25->0, .75->2, 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6, -.25->8 (-0),
    # -.75->10, -5->14, -6->15, .5->1, 1->2, 0, 0
    assert flat[:2] == [7, 15]
    assert flat[16:] == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 15, 1, 2, 0, 0]
    # packing: element 2j in the low nibble, 2j+1 in the high one
    assert q.data[0, 8].item() == (7 | 0 << 4) and q.data[0, 14].item() == (1 | 2 << 4)
    deq = dequantize_nvfp4(q)[0, 16:].tolist()
    assert deq == [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -1, -4, -6, 0.5, 1, 0, 0]


def test_values_above_a_static_amax_saturate():
    # static amax 2688 -> s_g = 1; a live value of 5376 gives r = 5376 / 6 = 896, clamped to
    # 448, so d = 448 and y = 12 -> code 7 (6): it decodes to 6 * 448 = 2688
    x = torch.tensor([[5376.0, 448.0] + [0.0] * 14])
    q = quantize_nvfp4(x, amax=2688.0)
    assert q.block_scale.float().tolist() == [[448.0]] and q.data[0, 0].item() == (7 | 2 << 4)
    assert dequantize_nvfp4(q)[0, :2].tolist() == [2688.0, 448.0]  # 448 / 448 = 1 -> code 2


def test_zero_and_underflowing_blocks_hand_worked():
    # s_g = 1 again (amax 2688). Block 1 all zero: r = 0 -> scale 1.0 (byte 0x38), codes 0.
    # Block 2 has amax 1e-4: r = 1e-4 / 6 = 1.7e-5 < 2^-9 -> clamped to 2^-9 (byte 0x01);
    # d = 2^-9, so 1e-4 -> y = 0.0512 -> code 0 and 2^-10 -> y = 0.5 -> code 1.
    x = torch.zeros(1, 48)
    x[0, 0] = 2688.0
    x[0, 32], x[0, 33] = 1e-4, 2.0**-10
    q = quantize_nvfp4(x)
    assert q.block_scale.view(torch.uint8).tolist() == [[0x7E, 0x38, 0x01]]  # 448, 1.0, 2^-9
    assert q.data[0, 8:16].tolist() == [0] * 8
    assert q.data[0, 16].item() == (0 | 1 << 4)
    assert dequantize_nvfp4(q)[0, 33].item() == 2.0**-10


def test_global_scale_is_amax_over_2688_in_fp32():
    x = _weight((4, 32), seed=5)
    amax = x.abs().max()
    expected = np.float32(np.float64(np.float32(amax)) / 2688.0)  # one rounded division
    assert quantize_nvfp4(x).global_scale.item() == float(expected)
    assert quantize_nvfp4(x, amax=5376.0).global_scale.item() == 2.0
    assert quantize_nvfp4(x).global_scale.shape == () and quantize_nvfp4(x).global_scale.dtype == (torch.float32)


def test_2d_tiles_share_one_scale_per_16x16():
    x = _weight((40, 64), seed=7)  # 40 rows: tiles of 16, 16 and a partial one of 8
    q = quantize_nvfp4(x, rows_per_block=16)
    s = q.block_scale.view(torch.uint8)
    for r0 in (0, 16, 32):
        tile = s[r0 : r0 + 16]
        assert (tile == tile[0]).all(), f"rows {r0}.. do not share their tile's scales"
    # the tile scale is the 1x16 scale of the tile's amax row, so it is never smaller
    one_d = quantize_nvfp4(x).block_scale.float()
    assert (q.block_scale.float() >= one_d).all()


def test_zero_tensor_and_zero_amax_are_defined():
    q = quantize_nvfp4(torch.zeros(3, 32))
    # amax = 0: s_g = 0 is replaced by 1 (TE's rule), block scales 1.0, codes 0
    assert q.global_scale.item() == 1.0
    assert (q.block_scale.float() == 1.0).all() and (q.data == 0).all()
    assert (dequantize_nvfp4(q) == 0).all()
    # a caller-given amax of 0 for a nonzero x: s_g = 1, elements saturate at the block's
    # clamped scale; a defined, finite result
    x = torch.full((1, 16), 3000.0)
    assert torch.isfinite(dequantize_nvfp4(quantize_nvfp4(x, amax=0.0))).all()


def test_negative_zero_encodes_as_plus_zero():
    # sign bit = x < 0 (ModelOpt): -0.0 has no sign bit; a tiny negative value has one
    x = torch.tensor([[6.0, -0.0, -1e-9] + [0.0] * 13])
    q = quantize_nvfp4(x)
    assert q.data[0, 0].item() == 7 and q.data[0, 1].item() == 8  # (-0.0 -> 0), (-1e-9 -> 8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_raises_naming_the_tensor(bad):
    x = _weight((5, 32))
    x[3, 17] = bad
    with pytest.raises(ValueError, match=r"w\.q_proj: got 1 non-finite .*\(3, 17\)"):
        quantize_nvfp4(x, name="w.q_proj")
    with pytest.raises(ValueError, match=r"w\.q_proj: got 1 non-finite"):
        quantize_nvfp4(x, amax=10.0, name="w.q_proj")  # a given amax does not hide it


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: quantize_nvfp4(torch.ones(4, 24)), r"^x: got last dim K=24 .*K % 16 == 0"),
        (lambda: quantize_nvfp4(torch.ones(4, 24), name="w"), r"^w: .*K % 16 == 0"),
        (lambda: quantize_nvfp4(torch.ones(4, 16, dtype=torch.int64)), r"^x: .*floating"),
        (lambda: quantize_nvfp4(torch.ones(4, 16), amax=-1.0), r"^amax: got -1\.0"),
        (lambda: quantize_nvfp4(torch.ones(4, 16), amax=float("nan")), r"^amax: got nan"),
        (lambda: quantize_nvfp4(torch.ones(16), rows_per_block=16), r"at least 2 dims"),
        (lambda: quantize_nvfp4(torch.ones(4, 16), rows_per_block=8), r"rows_per_block=8"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_dequantize_checks_its_input():
    q = quantize_nvfp4(torch.ones(2, 32))
    with pytest.raises(ValueError, match=r"q: got data .* block_scale \[2, 1\]"):
        dequantize_nvfp4(NVFP4Tensor(q.data, q.block_scale[:, :1], q.global_scale))
    with pytest.raises(ValueError, match=r"q: got global_scale .* expected a finite fp32"):
        dequantize_nvfp4(NVFP4Tensor(q.data, q.block_scale, torch.tensor(float("inf"))))


@pytest.mark.parametrize(
    ("shape", "data_shape", "scale_shape"),
    [((0, 32), (0, 16), (0, 2)), ((5, 0), (5, 0), (5, 0)), ((2, 0, 16), (2, 0, 8), (2, 0, 1))],
)
def test_empty_input_is_defined(shape, data_shape, scale_shape):
    q = quantize_nvfp4(torch.empty(shape, dtype=torch.bfloat16))
    assert (tuple(q.data.shape), q.data.dtype) == (data_shape, torch.uint8)
    assert (tuple(q.block_scale.shape), q.block_scale.dtype) == (scale_shape, E4M3)
    assert q.global_scale.item() == 1.0  # amax of nothing is 0 -> s_g = 1
    assert tuple(dequantize_nvfp4(q).shape) == shape


def test_leading_dims_equal_the_flattened_2d_result():
    x = _weight((3, 5, 64), seed=9)
    q3, q2 = quantize_nvfp4(x), quantize_nvfp4(x.reshape(15, 64))
    assert q3.data.shape == (3, 5, 32) and q3.block_scale.shape == (3, 5, 4)
    assert torch.equal(q3.data.reshape(15, 32), q2.data)
    assert q3.shape == (3, 5, 64)


# --------------------------------------------------------------------------------------
# Qwen-sized weights: fast path == reference, and the round trip within the grid's bound
# --------------------------------------------------------------------------------------


def _nvfp4_error_bound(x: torch.Tensor, q: NVFP4Tensor) -> torch.Tensor:
    """Per element: half the E2M1 grid spacing at |y| times the block's divisor d.

    |y| < 2: spacing 0.5; < 4: 1; otherwise 2 (|y| may exceed 6 by at most the E4M3
    rounding of the block scale, 2^-4 relative, where saturation costs < 0.4 d <= d).
    """
    k = x.shape[-1]
    d = (q.block_scale.float() * q.global_scale).repeat_interleave(16, dim=-1)
    a = x.float().abs() / d
    half = torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0))
    return (half * d).view(*x.shape[:-1], k)


@pytest.mark.parametrize("shape", [(4096, 4096), (12288, 4096)])  # Qwen3-8B attn; MLP up
def test_qwen_sized_round_trip_within_the_grid_bound(shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(11)) * 0.02).bfloat16()
    q = quantize_nvfp4(x)
    rel_rms = []
    for r0 in range(0, shape[0], 2048):  # check in row chunks (memory)
        rows = slice(r0, r0 + 2048)
        part = NVFP4Tensor(q.data[rows], q.block_scale[rows], q.global_scale)
        xr = x[rows].float()
        err = (dequantize_nvfp4(part) - xr).abs()
        bound = _nvfp4_error_bound(xr, part)
        excess = (err - bound * (1 + 2**-20)).clamp_min(0)
        assert not excess.any(), f"rows {r0}+: error above the grid bound at {excess.argmax()}"
        rel_rms.append(float(err.square().mean() / xr.square().mean()))
    # Gaussian blocks: |y| mostly < 4, so the RMS error is well inside the worst case
    # (d/2 per element, d ~ amax_b/6 ~ 0.3 sigma for 16 Gaussian samples)
    assert 0.0 < np.sqrt(np.mean(rel_rms)) < 0.15
    if shape == (4096, 4096):
        ref = quantize_nvfp4_reference(x)
        _assert_equal(q.data.numpy(), ref.data.numpy(), "fast vs reference data")
        _assert_equal(_scale_bytes(q), _scale_bytes(ref), "fast vs reference scales")


# --------------------------------------------------------------------------------------
# NeMo-RL's own code on our tensors
# --------------------------------------------------------------------------------------


def test_nemo_rl_marlin_scale_canonicalisation_leaves_our_scales_unchanged():
    # NeMo-RL v0.7.0 clears the E4M3 sign bit of `weight_scale` before Marlin's unsigned
    # conversion; our block scales are non-negative, so its real function is a no-op on them
    from nemo_rl.modelopt.models.generation.vllm_modelopt_patch import _canonicalize_nvfp4_weight_scale

    q = quantize_nvfp4(_weight((64, 128), seed=13))
    layer = torch.nn.Module()
    layer.weight_scale = torch.nn.Parameter(q.block_scale.clone(), requires_grad=False)
    _canonicalize_nvfp4_weight_scale(layer)
    _assert_equal(layer.weight_scale.view(torch.uint8).numpy(), _scale_bytes(q), "scale bytes")
    assert not (q.block_scale.view(torch.uint8) & 0x80).any()


@pytest.mark.parametrize("amax", [1e-37, 1e-39, 1e-41, 3e-42, 1e-44, 1.4e-45])
def test_tiny_tensor_amax_and_the_zero_scale_guard_match_the_oracle(amax):
    # Issue 27: below ~1e-39 the tensor amax is an fp32 subnormal, and amax / 2688 rounds
    # to a subnormal s_g or (amax < ~1.9e-42) to 0, which the guard replaces by 1. Each
    # case, measured from x and given as a static amax, against the float64 oracle.
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 17], x[1, 5] = amax, -amax / 3, amax / 7
    assert float(x.abs().max()) > 0  # representable: the guard sees a nonzero amax
    _assert_matches_oracle(x)
    _assert_matches_oracle(x, amax)
    _assert_matches_oracle(torch.ones(1, 16), amax)  # a stale tiny amax saturates


def test_zero_scale_guard_fires_below_the_subnormal_quotient():
    # 1.4e-45 (the smallest fp32 subnormal) / 2688 underflows to 0: s_g = 1, as the oracle
    x = torch.zeros(1, 16)
    x[0, 3] = 1.4e-45
    assert quantize_nvfp4(x).global_scale.item() == 1.0
    _, _, s_g, _ = nvfp4_oracle(x.numpy())
    assert float(s_g) == 1.0


def test_negative_zero_and_tiny_negatives_match_the_oracle():
    x = torch.tensor([[6.0, -0.0, -1e-9, -0.0, 0.0, -3.0] + [0.0] * 10])
    _assert_matches_oracle(x)
    _assert_matches_oracle(torch.full((1, 16), -0.0))  # an all -0.0 tensor: amax 0


def test_an_expert_stack_dequantizes_with_its_global_scale_per_expert():
    from nemo_ais.formats.nvfp4 import quantize_nvfp4_experts

    torch.manual_seed(0)
    x = torch.randn(3, 8, 32) * torch.tensor([1e-3, 1.0, 1e3])[:, None, None]  # three global scales
    q = quantize_nvfp4_experts(x)
    assert q.global_scale.shape == (3,)
    out = dequantize_nvfp4(q)
    for e in range(3):  # expert e as quantize_nvfp4 of it alone, bit for bit
        assert torch.equal(out[e], dequantize_nvfp4(quantize_nvfp4(x[e])))
    with pytest.raises(
        ValueError, match=r"got global_scale \[2\] .* \(or \[E\], one per expert, for data \[E, N, K/2\]\)"
    ):
        dequantize_nvfp4(NVFP4Tensor(q.data, q.block_scale, q.global_scale[:2]))
