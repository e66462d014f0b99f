# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The mismatch dial ``error_scale`` (k) of the simulated rollout engine (issue 26, item 1).

k = 0 is the BF16 engine bit for bit, k = 1 the format as it is bit for bit, and on a fixed
batch the measured mismatch D (mean |log-ratio|, NeMo-RL's gen_kl k3 and
token_mult_prob_error) grows with k. Every fake quantization is scaled alike: weights,
activations and the KV cache, and the QaRL trainer forward (it reads the twin's functions).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_fp8_twin_formats import _gen, _prompts, _tiny

from nemo_ais.config import validate_section
from nemo_ais.embedded.config import CONFIG_DIR, load_config, validate_config
from nemo_ais.rollout.fake_quant import linear_fake_quant, scale_error
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.linear import Fp8Linear
from nemo_ais.rollout.twin import RolloutPrecisionConfig, RolloutTwin, generate, logprob_mismatch, score_responses

FORMATS = [("fp8", "fp8"), ("mxfp8", "bf16"), ("nvfp4_w4a16", "fp8"), ("nvfp4_w4a4", "nvfp4")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen():
    return _tiny()


def _sample(model_or_twin, ids, mask):
    out = model_or_twin.generate(ids, mask, max_new_tokens=6, generator=_gen(3))
    return out.sequences, out.logprobs


@pytest.mark.parametrize(("fmt", "kv"), FORMATS)
def test_k0_is_the_bf16_engine_bit_for_bit(qwen, fmt, kv):
    ids, mask = _prompts()
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt, kv_cache=kv, error_scale=0.0))
    assert twin.quantized_module_names == () and not twin.config.enabled
    ref = generate(qwen, ids, mask, max_new_tokens=6, generator=_gen(3))
    seq, lp = _sample(twin, ids, mask)
    assert torch.equal(seq, ref.sequences) and torch.equal(lp, ref.logprobs)


@pytest.mark.parametrize(("fmt", "kv"), FORMATS)
def test_k1_is_the_format_bit_for_bit(qwen, fmt, kv):
    ids, mask = _prompts()
    calib = {"calibration_input_ids": ids, "calibration_attention_mask": mask}
    outs = []
    for extra in ({}, {"error_scale": 1.0}):
        twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt, kv_cache=kv, **extra))
        twin.sync_weights(dict(qwen.named_parameters()), **calib)
        outs.append(_sample(twin, ids, mask))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize(("fmt", "kv"), FORMATS)
def test_mismatch_grows_with_k_on_a_fixed_batch(qwen, fmt, kv):
    ids, mask = _prompts()
    responses = generate(qwen, ids, mask, max_new_tokens=8, generator=_gen(0)).response_ids
    resp_mask = torch.ones_like(responses, dtype=torch.float32)
    prev = score_responses(qwen, ids, mask, responses)
    calib = {"calibration_input_ids": ids, "calibration_attention_mask": mask}
    stats = []
    for k in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0):
        twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt, kv_cache=kv, error_scale=k))
        twin.sync_weights(dict(qwen.named_parameters()), **calib)
        stats.append(logprob_mismatch(prev, twin.score(ids, mask, responses), resp_mask))
    d = [s.mean_abs_delta for s in stats]
    assert d[0] == 0.0, d
    assert all(b > a for a, b in itertools.pairwise(d)), d
    kl = [s.gen_kl_error for s in stats]
    assert kl[-1] > kl[3] > kl[1], kl
    # the error is structured, not noise: D roughly proportional to k at small k
    assert 0.2 < d[1] / d[3] < 0.3 and 1.4 < d[4] / d[3] < 2.2, d


def test_every_fake_quantization_is_scaled_alike():
    g = _gen(7)
    w, x = torch.randn(64, 128, generator=g), torch.randn(5, 128, generator=g)
    for fmt in ("fp8", "mxfp8", "nvfp4_w4a4"):
        one = linear_fake_quant(RolloutPrecisionConfig(format=fmt))
        half = linear_fake_quant(RolloutPrecisionConfig(format=fmt, error_scale=0.5))
        amax = x.abs().amax() if one.static_input_amax else None
        for fn1, fnk, t, a in ((one.weight, half.weight, w, None), (one.activation, half.activation, x, amax)):
            q1, qk = fn1(t, amax=a), fnk(t, amax=a)
            # float64 oracle of x + k (q - x)
            expected = t.double() + 0.5 * (q1.double() - t.double())
            assert torch.allclose(qk.double(), expected, rtol=0, atol=1e-6), fmt
            assert not torch.equal(qk, q1) and not torch.equal(qk.to(t.dtype), t), fmt
    fp8 = Fp8Linear(w, error_scale=3.0)
    expected = w.double() + 3.0 * (Fp8Linear(w).weight_dequant.double() - w.double())
    assert torch.allclose(fp8.weight_dequant.double(), expected, rtol=0, atol=1e-5)


def test_kv_cache_error_is_scaled(qwen):
    ids, mask = _prompts()
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="bf16", kv_cache="fp8"))
    twin.calibrate_kv_scales(ids, mask)
    k = torch.randn(2, 2, 5, 32, generator=_gen(4))
    full = QuantizedKVCache("fp8", twin.kv_scales)._quantize(k, 1, "k")
    dialed = QuantizedKVCache("fp8", twin.kv_scales, error_scale=2.0)._quantize(k, 1, "k")
    assert torch.allclose(dialed.double(), k.double() + 2 * (full.double() - k.double()), atol=1e-6)
    assert torch.equal(scale_error(k, full, 1.0), full)


def test_fp8_codes_cannot_be_loaded_at_another_k():
    layer = Fp8Linear(torch.randn(8, 128), error_scale=0.5)
    with pytest.raises(ValueError, match=r"error_scale=0\.5 needs the high-precision weight"):
        layer.load_quantized(layer.weight, layer.weight_scale_inv)


@pytest.mark.parametrize("bad", [-0.5, 65.0, float("nan"), float("inf"), "big"])
def test_bad_k_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"rollout\.error_scale="):
        validate_section(RolloutPrecisionConfig, {"error_scale": bad}, "rollout")
    data = load_config(CONFIG_DIR / "default.yaml")
    data["rollout"]["error_scale"] = bad
    with pytest.raises(ValueError, match=r"rollout\.error_scale"):
        validate_config(data)


def test_embedded_config_passes_k_to_the_twin():
    data = load_config(CONFIG_DIR / "default.yaml", ["rollout.error_scale=2.5"])
    assert validate_config(data).precision.error_scale == 2.5
