# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Bit-exactness of the blockwise FP8 quantizer against the float64 oracle in tests/fp8_oracles.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fp8_oracles import TE_SHAPES, decode_e4m3, dequantize_oracle, encode_e4m3, first_mismatch, quantize_oracle

from nemo_ais.formats.fp8_block import _saturate_
from nemo_ais.fp8 import (
    E4M3_MAX,
    dequantize_activations,
    dequantize_blockwise,
    quantize_activations,
    quantize_blockwise,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
)

FAMILIES = ("reciprocal", "divide", "multiplier")
FAMILY_EPS = [("reciprocal", 1e-4), ("divide", 1e-4), ("multiplier", 0.0)]  # DeepGEMM/vLLM, vLLM act-style, TE


def _codes(q: torch.Tensor) -> np.ndarray:
    return q.view(torch.uint8).numpy()


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


def _assert_equal(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    msg = first_mismatch(actual, expected, what)
    assert msg is None, msg


def _assert_matches_oracle(x, block, family, eps, ue8m0=False):
    q, s = quantize_blockwise(x, block, family=family, eps=eps, ue8m0=ue8m0)
    x32 = x.float().numpy()
    codes, scales = quantize_oracle(x32, block, family, eps, ue8m0)
    tag = f"{list(x.shape)} {x.dtype} family={family} eps={eps} ue8m0={ue8m0}"
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    _assert_equal(_codes(q), codes, f"codes {tag}")
    _assert_equal(_bits(s), scales.view(np.int32), f"scale bits {tag}")
    deq = dequantize_blockwise(q, s, block)
    _assert_equal(_bits(deq), dequantize_oracle(codes, scales, block).view(np.int32), f"dequant {tag}")


def _weight(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 2)
    return x.to(dtype)


def test_encoder_oracle_matches_every_e4m3_code_and_tie():
    # the oracle's encoder itself: every finite code round-trips, and every midpoint
    # between neighbouring codes rounds to the even one, as torch's cast does
    codes = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
    vals = decode_e4m3(codes)
    _assert_equal(encode_e4m3(vals), codes, "encode(decode(code))")
    torch_vals = torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy()
    _assert_equal(torch_vals, vals, "decode vs torch")
    pos = np.unique(vals[vals >= 0])
    mids = ((pos[1:] + pos[:-1]) / 2).astype(np.float32)
    mids = np.concatenate([mids, -mids])
    got = torch.from_numpy(mids).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    _assert_equal(got, encode_e4m3(mids), "ties to even")


@pytest.mark.parametrize("shape", TE_SHAPES)
@pytest.mark.parametrize(("family", "eps"), FAMILY_EPS)
def test_te_shapes_bit_exact(shape, family, eps):
    _assert_matches_oracle(_weight(shape, seed=shape[0] + shape[1]), (128, 128), family, eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
def test_dtypes_and_ue8m0_bit_exact(dtype, ue8m0, family):
    x = _weight((305, 300), dtype)
    if dtype == torch.float64:  # oracle input is the fp32 rounding of x, as the convention says
        x = x.float().double()
    _assert_matches_oracle(x, (128, 128), family, 1e-4, ue8m0)


def test_random_shapes_and_blocks_bit_exact():
    rng = np.random.default_rng(1)
    for trial in range(12):
        n, k = (int(v) for v in rng.integers(1, 400, size=2))
        block = [(128, 128), (64, 32), (1, 128), (7, 5)][trial % 4]
        family = ("reciprocal", "divide", "multiplier")[trial % 3]
        _assert_matches_oracle(_weight((n, k), seed=trial), block, family, [1e-4, 0.0][trial % 2])


def test_expert_stack_equals_per_expert():
    x = _weight((3, 200, 260))
    q, s = quantize_blockwise(x)
    assert q.shape == x.shape and s.shape == (3, 2, 3)
    for e in range(3):
        codes, scales = quantize_oracle(x[e].numpy(), (128, 128), "reciprocal", 1e-4)
        _assert_equal(_codes(q[e]), codes, f"expert {e} codes")
        _assert_equal(_bits(s[e]), scales.view(np.int32), f"expert {e} scales")
    _assert_equal(dequantize_blockwise(q, s)[1].numpy(), dequantize_blockwise(q[1], s[1]).numpy(), "3-D dequant")


def _near_ties(n_blocks: int, seed: int) -> torch.Tensor:
    """Blocks whose values sit next to E4M3 rounding midpoints after scaling by 448/amax.

    That is where one fp32 ulp of the scaled value (the only difference between the
    families) can flip the FP8 rounding; on plain random data the families agree.
    """
    g = torch.Generator().manual_seed(seed)
    codes = torch.arange(1, 126, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    mids = (codes[1:] + codes[:-1]) / 2
    blocks = []
    for _ in range(n_blocks):
        amax = float(torch.rand((), generator=g, dtype=torch.float64)) * 3 + 0.01
        pick = mids[torch.randint(len(mids), (128 * 128,), generator=g)]
        jitter = 1 + (torch.rand(128 * 128, generator=g, dtype=torch.float64) - 0.5) * 1e-6
        vals = (pick * jitter * amax / E4M3_MAX).float().view(128, 128)
        vals[0, 0] = amax
        blocks.append(vals)
    return torch.cat(blocks, dim=1)


def test_families_within_one_fp8_step():
    for x in (_weight((2000, 1024), seed=3), _near_ties(8, seed=4)):
        mags = []
        for family in FAMILIES:
            q, _ = quantize_blockwise(x, family=family, eps=1e-4)
            c = _codes(q).astype(np.int64)
            mags.append(np.where(c & 0x80, -(c & 0x7F), c & 0x7F))  # signed, monotone in value
        for i, j in [(0, 1), (0, 2), (1, 2)]:
            step = np.abs(mags[i] - mags[j])
            assert step.max() <= 1, f"families {FAMILIES[i]} vs {FAMILIES[j]} differ by {step.max()} steps"
    # near the rounding midpoints the three formulas are genuinely not bit-identical
    assert all((mags[0] != m).any() for m in mags[1:]), (
        "expected reciprocal/divide and reciprocal/multiplier to differ somewhere"
    )


@pytest.mark.parametrize(
    ("family", "eps", "scale"),
    [("reciprocal", 1e-4, 1e-4 / 448), ("divide", 1e-10, 1e-10 / 448), ("multiplier", 0.0, 1.0)],
)
def test_all_zero_block_gives_zero_codes_and_finite_scale(family, eps, scale):
    x = _weight((256, 256))
    x[:128, 128:] = 0.0
    q, s = quantize_blockwise(x, family=family, eps=eps)
    assert torch.isfinite(s).all()
    assert (_codes(q[:128, 128:]) == 0).all()
    assert s[0, 1].item() == pytest.approx(scale, rel=1e-6)
    assert (dequantize_blockwise(q, s)[:128, 128:] == 0).all()


def test_block_max_maps_to_448_and_out_of_range_saturates():
    x = _weight((128, 128))
    q, s = quantize_blockwise(x)
    amax = x.abs().max()
    assert float(q.float().abs().max()) == E4M3_MAX
    # 448 * s is the block amax up to one fp32 rounding
    assert abs(float(s) * E4M3_MAX - float(amax)) <= float(amax) * 2**-23
    big = torch.tensor([464.0, 500.0, 1e6, -1e30, 447.0, -448.0])
    got = _saturate_(big.clone()).to(torch.float8_e4m3fn).float()
    assert got.tolist() == [448.0, 448.0, 448.0, -448.0, 448.0, -448.0]


@pytest.mark.parametrize("family", ["reciprocal", "divide"])
def test_ue8m0_scales_are_powers_of_two_at_least_amax_over_448(family):
    x = _weight((384, 512)) * 1e-3
    x[0, 0] = 448.0 * 2.0**-5  # amax/448 exactly a power of two: ceil keeps it
    _, s = quantize_blockwise(x, family=family, ue8m0=True)
    mant, _ = torch.frexp(s)
    assert (mant == 0.5).all(), "scale is not a power of two"
    amax = x.abs().reshape(3, 128, 4, 128).amax(dim=(1, 3))
    ratio = amax / E4M3_MAX
    assert (s >= ratio).all() and (s < 2 * ratio).all()
    assert s[0, 0].item() == 2.0**-5


def test_ue8m0_family_c_rounds_multiplier_down():
    x = _weight((128, 256))
    _, s = quantize_blockwise(x, family="multiplier", eps=0.0, ue8m0=True)
    m = 1.0 / s
    assert (torch.frexp(m).mantissa == 0.5).all()
    amax = x.abs().reshape(128, 2, 128).amax(dim=(0, 2))
    assert (m <= E4M3_MAX / amax).all() and (2 * m > E4M3_MAX / amax).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weight_raises_naming_tensor(bad):
    x = _weight((300, 130))
    x[257, 3] = bad
    with pytest.raises(ValueError, match=r"model\.layers\.3\.mlp\.up_proj\.weight: got 1 non-finite.*\(257, 3\)"):
        quantize_blockwise(x, name="model.layers.3.mlp.up_proj.weight")
    y = _weight((4, 256))
    y[2, 200] = bad
    with pytest.raises(ValueError, match=r"hidden: got 1 non-finite.*\(2, 200\)"):
        quantize_activations(y, name="hidden")


@pytest.mark.parametrize(
    "quantize", [quantize_blockwise, quantize_activations, quantize_mxfp8, quantize_mxfp4, quantize_nvfp4]
)
def test_float64_beyond_float32_range_is_refused_by_name(quantize):
    # finite in float64, inf in the float32 the formats compute in: was an IndexError
    # (FP8), a NaN block scale (NVFP4) or a silent clamp to the format max (MX)
    x = torch.ones(2, 256, dtype=torch.float64)
    x[1, 37] = -1e39
    with pytest.raises(ValueError, match=r"w: got 1 non-finite or beyond float32 value\(s\) .*\(1, 37\): -1e\+39"):
        quantize(x, name="w")
    x[1, 37] = 3e38  # within range: quantized
    quantize(x, name="w")


def test_input_is_not_modified_and_non_contiguous_ok():
    x = _weight((256, 384))
    before = x.clone()
    quantize_blockwise(x)
    assert torch.equal(x, before)
    xt = _weight((300, 260)).t()
    _assert_matches_oracle(xt, (128, 128), "reciprocal", 1e-4)


def test_tiny_amax_with_eps_zero_stays_finite():
    x = torch.zeros(128, 128)
    x[0, 0] = 1e-44  # denormal amax: amax / 448 underflows, 448 / amax overflows fp32
    for family in ("reciprocal", "divide", "multiplier"):
        q, s = quantize_blockwise(x, family=family, eps=0.0)
        # documented result: a finite positive scale and codes 0 (the value is below what
        # fp32 scales can resolve; TE's max-float clamp of the multiplier gives the same)
        assert torch.isfinite(s).all() and (s > 0).all()
        assert (_codes(q) == 0).all()


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
def test_a_tiny_amax_with_eps_zero_dequantizes_to_its_values(family, ue8m0):
    # amax 5e-39: amax / 448 is an fp32 subnormal whose reciprocal overflows; the applied
    # multiplier FLT_MAX then no longer inverted the stored scale (reciprocal: 5e-39 came back
    # 1.95e-41). The scale floors at 2^-126 (exact reciprocal 2^126): dequantize inverts it.
    x = torch.zeros(1, 16)
    x[0, :4] = torch.tensor([1e-39, 2e-39, 5e-39, -3e-40])
    q, s = quantize_blockwise(x, (1, 16), family, eps=0.0, ue8m0=ue8m0)
    back = dequantize_blockwise(q, s, (1, 16))
    nonzero = x != 0
    torch.testing.assert_close(back[nonzero], x[nonzero], rtol=2**-3, atol=0)  # E4M3: 3 mantissa bits
    if family != "multiplier":  # TE's rule stores s = 1 / m, m clamped to FLT_MAX: consistent already
        assert s.item() >= torch.finfo(torch.float32).smallest_normal


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"family": "d"}, "family='d'"),
        ({"eps": -1.0}, "eps=-1.0"),
        ({"eps": float("nan")}, "eps=nan"),
        ({"block": (128, 0)}, r"block=\(128, 0\)"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_blockwise(torch.ones(4, 4), name="w", **kwargs)


def test_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"w: got \[4\] torch.float32, expected a 2-D"):
        quantize_blockwise(torch.ones(4), name="w")
    with pytest.raises(ValueError, match=r"w: got .* torch.int64"):
        quantize_blockwise(torch.ones(4, 4, dtype=torch.long), name="w")
    q, s = quantize_blockwise(torch.ones(200, 200))
    with pytest.raises(ValueError, match=r"got scale \[1, 2\] torch.float32, expected \[2, 2\]"):
        dequantize_blockwise(q, s[:1])
    with pytest.raises(ValueError, match=r"expected torch\.float8_e4m3fn"):
        dequantize_blockwise(q.float(), s)


@pytest.mark.parametrize("family", ["reciprocal", "divide", "multiplier"])
def test_activations_bit_exact_per_token_group(family):
    x = _weight((2, 7, 300)).reshape(2, 7, 300)
    q, s = quantize_activations(x, family=family)
    assert q.shape == x.shape and s.shape == (2, 7, 3)
    codes, scales = quantize_oracle(x.reshape(14, 300).numpy(), (1, 128), family, 1e-10)
    _assert_equal(_codes(q).reshape(14, 300), codes, "activation codes")
    _assert_equal(_bits(s).reshape(14, 3), scales.view(np.int32), "activation scales")
    deq = dequantize_activations(q, s)
    expected = dequantize_oracle(codes, scales, (1, 128)).reshape(2, 7, 300)
    _assert_equal(_bits(deq), expected.view(np.int32), "activation dequant")
    assert dequantize_activations(q, s, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_activation_1d_and_group_size():
    x = _weight((1, 100))[0]
    q, s = quantize_activations(x, group=32, ue8m0=True)
    assert s.shape == (4,)
    codes, scales = quantize_oracle(x[None].numpy(), (1, 32), "divide", 1e-10, True)
    _assert_equal(_codes(q), codes[0], "1-D codes")
    _assert_equal(_bits(s), scales[0].view(np.int32), "1-D scales")


def test_backend_selection_without_te_or_cuda():
    x = _weight((200, 300))
    q, s = quantize_blockwise(x, family="multiplier", eps=0.0, backend="auto")  # CPU: torch reference
    q_ref, s_ref = quantize_blockwise(x, family="multiplier", eps=0.0)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    with pytest.raises(ValueError, match=r"w: backend='cuda' is invalid"):
        quantize_blockwise(x, backend="cuda", name="w")
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"nemo-ais\[te\]"):
            quantize_blockwise(x, family="multiplier", backend="te")
    else:
        with pytest.raises(ValueError, match="needs a CUDA tensor"):
            quantize_blockwise(x, family="multiplier", backend="te")


def test_activations_spanning_several_bands_bit_exact():
    # 3000 rows x 384: the quantizer's ~4 MiB working bands hold 2730 rows, so two bands
    x = _weight((2, 1500, 384)).reshape(2, 1500, 384)
    q, s = quantize_activations(x, family="reciprocal", eps=1e-4)
    codes, scales = quantize_oracle(x.reshape(3000, 384).numpy(), (1, 128), "reciprocal", 1e-4)
    _assert_equal(_codes(q).reshape(3000, 384), codes, "multi-band activation codes")
    _assert_equal(_bits(s).reshape(3000, 3), scales.view(np.int32), "multi-band activation scales")


@pytest.mark.parametrize(("old", "new"), [("a", "reciprocal"), ("b", "divide"), ("c", "multiplier")])
def test_former_family_letters_are_refused_naming_the_new_name(old, new):
    from nemo_ais.formats.fp8_block import FAMILY_FORMULAS, RENAMED_FAMILIES
    from nemo_ais.fp8 import Fp8SyncConfig
    from nemo_ais.rollout.config import RolloutPrecisionConfig
    from nemo_ais.sections import validate_section

    assert RENAMED_FAMILIES[old] == new and new in FAMILY_FORMULAS
    renamed = rf"family='{old}' was renamed '{new}'"
    with pytest.raises(ValueError, match=renamed):
        quantize_blockwise(torch.ones(4, 4), family=old)
    with pytest.raises(ValueError, match=rf"ais_fp8_refit\.family=.*{renamed}"):
        validate_section(Fp8SyncConfig, {"family": old}, "ais_fp8_refit")
    with pytest.raises(ValueError, match=rf"rollout\.family=.*{renamed}"):
        validate_section(RolloutPrecisionConfig, {"family": old}, "rollout")
    assert validate_section(Fp8SyncConfig, {"family": new}, "ais_fp8_refit").family == new
