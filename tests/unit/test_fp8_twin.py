# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Simulated FP8 rollout engine (nemo_ais.rollout.twin) against independent oracles.

Tiny HF models are built offline from a config with random init (HF default
``initializer_range=0.02``; nothing is fetched). Their W8A8 mismatch (token_mult_prob_error
~1.01-1.02) is in the range reported for real FP8 rollouts (1.01-1.05).
"""

import math
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from tiny_models import tiny_lm, tiny_moe

from nemo_ais.formats.fp8_block import (
    _fake_quant_groups_divide,
    dequantize_activations,
    dequantize_blockwise,
    quantize_activations,
    quantize_blockwise,
)
from nemo_ais.rollout.linear import Fp8Experts, Fp8Linear
from nemo_ais.rollout.twin import (
    Fp8RolloutConfig,
    Fp8Twin,
    RolloutPrecisionConfig,
    RolloutTwin,
    generate,
    logprob_mismatch,
    score_responses,
)

VOCAB = 512
E4M3_MAX = 448.0


def _tiny(kind="qwen2", hidden=128, layers=3, seed=0, init=0.02):
    return tiny_lm(
        kind,
        seed=seed,
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        max_position_embeddings=128,
        initializer_range=init,
    )


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen():
    return _tiny("qwen2")


def _prompts(batch=8, length=12, seed=1, pad_rows=(0, 3)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for i, row in enumerate(pad_rows):  # left-pad a few rows by 2, 4, ... tokens
        mask[row, : 2 * (i + 1)] = 0
        ids[row, : 2 * (i + 1)] = 0
    return ids, mask


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# disabled twin == original, bit for bit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_disabled_twin_is_exact_copy(kind):
    model = _tiny(kind, layers=2)
    twin = Fp8Twin(model, Fp8RolloutConfig(enabled=False, kv_cache_fp8=True))
    assert twin.fp8_module_names == ()
    ids, mask = _prompts()
    kw = dict(max_new_tokens=10, temperature=0.9, generator=None, eos_token_id=5)
    ref = generate(model, ids, mask, **{**kw, "generator": _gen(7)})
    out = twin.generate(ids, mask, **{**kw, "generator": _gen(7)})
    for name in ("sequences", "response_ids", "response_mask", "logprobs"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), name
    assert twin.kv_scales is None  # disabled: no FP8 KV cache either
    scored_ref = score_responses(model, ids, mask, ref.response_ids, temperature=0.9)
    scored = twin.score(ids, mask, ref.response_ids, temperature=0.9)
    assert torch.equal(scored, scored_ref)


# --------------------------------------------------------------------------------------
# W8A8 linear
# --------------------------------------------------------------------------------------


def _ref_blockwise_fake_quant(w, block=128, eps=1e-4):
    """Family "reciprocal" per 128x128 tile with plain loops: s = amax/448, q = rne(x * (1/s)) * s."""
    out = torch.empty_like(w)
    for i in range(0, w.shape[0], block):
        for j in range(0, w.shape[1], block):
            tile = w[i : i + block, j : j + block]
            s = torch.clamp(tile.abs().max(), min=eps) / E4M3_MAX
            q = (tile * (1.0 / s)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            out[i : i + block, j : j + block] = q.float() * s
    return out


# K = 272: neither dim a multiple of 128 (reference activation path); K = 256: the fused
# activation fake-quant path
@pytest.mark.parametrize("k", [272, 256])
def test_fp8_linear_equals_independent_reference(k):
    torch.manual_seed(3)
    lin = torch.nn.Linear(k, 300, bias=True)
    fp8 = Fp8Linear.from_linear(lin, name="proj.weight")
    x = torch.randn(3, 5, k) * 3.0
    # composed separately from the quantizer's public functions
    w_q, s_w = quantize_blockwise(lin.weight.detach(), (128, 128), "reciprocal", 1e-4)
    x_q, s_x = quantize_activations(x, 128, "divide", 1e-10)
    w_dq = dequantize_blockwise(w_q, s_w, (128, 128))
    x_dq = dequantize_activations(x_q, s_x, 128)
    ref = (x_dq.reshape(-1, k) @ w_dq.t()).reshape(3, 5, 300) + lin.bias.detach()
    y = fp8(x)
    assert torch.equal(fp8.weight.view(torch.uint8), w_q.view(torch.uint8))
    assert torch.equal(fp8.weight_scale_inv, s_w)
    assert torch.equal(y, ref), (y - ref).abs().max()
    # the dequantized weight against a plain-loop oracle of the tile rule
    assert torch.equal(fp8.weight_dequant, _ref_blockwise_fake_quant(lin.weight.detach()))
    # and the fp32 GEMM against float64 on the same FP8 operands (accumulation order only)
    ref64 = x_dq.double() @ w_dq.double().t() + lin.bias.double()
    torch.testing.assert_close(y.double(), ref64, rtol=1e-5, atol=1e-4)
    # it is a real quantization: not the fp32 linear
    assert (y - lin(x)).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_activation_fake_quant_is_bit_identical(dtype):
    torch.manual_seed(4)
    x = torch.randn(5, 3, 512) * torch.logspace(-12, 6, 512)  # 18 decades across groups
    x[0, 0, :128] = 0.0  # an all-zero group: q = 0, finite scale
    x[1, 2, 130] = -1e30  # one huge value: its group saturates nothing, others unaffected
    x = x.to(dtype)
    ref = dequantize_activations(*quantize_activations(x, 128, "divide", 1e-10), 128)
    got = _fake_quant_groups_divide(x, 128, 1e-10, "x")
    assert torch.equal(got, ref), (got - ref).abs().max()
    bad = x.clone()
    bad[2, 1, 7] = float("nan")
    with pytest.raises(ValueError, match=r"x: got 1 non-finite value\(s\).*first at index \(2, 1, 7\)"):
        _fake_quant_groups_divide(bad, 128, 1e-10, "x")


def test_fp8_linear_rejects_bad_weight():
    fp8 = Fp8Linear(torch.randn(16, 32), name="layer.q_proj.weight")
    with pytest.raises(ValueError, match=r"layer.q_proj.weight: got \[16, 31\]"):
        fp8.load_weight(torch.randn(16, 31))
    bad = torch.randn(16, 32)
    bad[2, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        fp8.load_weight(bad)


# --------------------------------------------------------------------------------------
# which modules are FP8 and which stay high precision
# --------------------------------------------------------------------------------------


def test_bf16_kept_modules_are_bit_identical(qwen):
    cfg = Fp8RolloutConfig(num_first_layers_in_bf16=1, num_last_layers_in_bf16=1)
    twin = Fp8Twin(qwen, cfg)
    projs = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    expected = tuple(f"model.layers.1.{p}" for p in projs)
    assert twin.fp8_module_names == expected
    twin_params = dict(twin.model.named_parameters())
    n_checked = 0
    for name, param in qwen.named_parameters():
        fp8_weight = any(name == f"{m}.weight" for m in expected)
        if fp8_weight:
            assert name not in twin_params  # replaced by FP8 codes + scales
            module = twin.model.get_submodule(name.rsplit(".", 1)[0])
            assert isinstance(module, Fp8Linear)
            assert module.weight.dtype == torch.float8_e4m3fn
            continue
        # embeddings, lm_head, norms, biases, layers 0 and 2: bit-identical
        assert torch.equal(twin_params[name], param), name
        n_checked += 1
    assert n_checked == len(list(qwen.parameters())) - len(expected)
    assert "lm_head.weight" in twin_params and "model.embed_tokens.weight" in twin_params


def test_bf16_layer_counts_validated(qwen):
    with pytest.raises(ValueError, match="num_first_layers_in_bf16=2 \\+ num_last_layers_in_bf16=2"):
        Fp8Twin(qwen, Fp8RolloutConfig(num_first_layers_in_bf16=2, num_last_layers_in_bf16=2))


def test_config_validation():
    with pytest.raises(ValidationError, match="extra"):
        Fp8RolloutConfig(unknown_field=1)
    with pytest.raises(ValidationError, match=r"block\n.*expected two positive ints"):
        Fp8RolloutConfig(block=(128, 0))
    with pytest.raises(ValidationError, match="kv_calibration_margin"):
        Fp8RolloutConfig(kv_calibration_margin=0.5)
    with pytest.raises(ValidationError, match="kv_calibration_reduction"):
        Fp8RolloutConfig(kv_calibration_reduction="max")
    assert Fp8RolloutConfig().kv_calibration_reduction == "percentile_of_amax"  # NeMo-RL's
    with pytest.raises(ValidationError, match="activation_family"):
        Fp8RolloutConfig(activation_family="d")
    # an all-zero group's scale eps / 448 underflowed to 0: NaN from the fused fake quant
    with pytest.raises(ValidationError, match=r"activation_eps\n.*expected 0 or >= 1e-35"):
        Fp8RolloutConfig(activation_eps=1e-45)
    x = torch.randn(4, 128)
    x[1] = 0.0
    for eps in (0.0, 1e-35):  # the bound and the zero group's own rule: finite
        lin = Fp8Linear(torch.randn(64, 128), activation_eps=Fp8RolloutConfig(activation_eps=eps).activation_eps)
        assert torch.isfinite(lin(x)).all()
    cfg = Fp8RolloutConfig()
    with pytest.raises(ValidationError, match="frozen"):
        cfg.enabled = False


# --------------------------------------------------------------------------------------
# mismatch: nonzero, measured, in a sensible band
# --------------------------------------------------------------------------------------


def test_w8a8_mismatch_is_nonzero_and_bounded(qwen):
    twin = Fp8Twin(qwen, Fp8RolloutConfig())
    ids, mask = _prompts()
    out = twin.generate(ids, mask, max_new_tokens=16, generator=_gen(0))
    ref = score_responses(qwen, ids, mask, out.response_ids)
    stats = logprob_mismatch(out.logprobs, ref, out.response_mask)
    print(f"\nW8A8 twin vs fp32 model: {stats}")
    assert stats.n_tok == 8 * 16
    assert 1e-3 < stats.mean_abs_delta < 0.2
    assert 1.0 < stats.token_mult_prob_error < 1.5
    assert stats.exp_mean_abs_delta <= stats.token_mult_prob_error  # Jensen
    # scoring under the twin sees the same engine (up to FP8 rounding flips caused by
    # the different fp32 summation order of a full forward vs the incremental one)
    twin_scored = twin.score(ids, mask, out.response_ids)
    assert logprob_mismatch(twin_scored, out.logprobs, out.response_mask).mean_abs_delta < (stats.mean_abs_delta / 2)


def test_logprob_mismatch_hand_worked():
    a = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]])
    b = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, 9.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # |delta| on valid tokens: 0.5, 0, 1, 0 -> mean 0.375, max 1
    s = logprob_mismatch(a, b, m)
    assert s.n_tok == 4 and s.mean_abs_delta == 0.375 and s.max_abs_delta == 1.0
    assert math.isclose(s.token_mult_prob_error, (math.exp(0.5) + 1 + math.e + 1) / 4)
    assert math.isclose(s.exp_mean_abs_delta, math.exp(0.375))
    empty = logprob_mismatch(a, b, torch.zeros_like(m))
    assert empty.token_mult_prob_error == 1.0 and empty.n_tok == 0


# --------------------------------------------------------------------------------------
# weight refit
# --------------------------------------------------------------------------------------


def test_sync_weights_requantizes_and_is_idempotent():
    model = _tiny(layers=2)
    twin = Fp8Twin(model, Fp8RolloutConfig())
    ids, mask = _prompts()
    resp = torch.randint(4, VOCAB, (8, 6), generator=_gen(2))
    before = twin.score(ids, mask, resp)
    # the trainer takes a step: every weight moves
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    n = twin.sync_weights(model.state_dict())
    assert n == len(model.state_dict())
    q_proj = twin.model.model.layers[1].self_attn.q_proj
    w_new = model.model.layers[1].self_attn.q_proj.weight.detach()
    w_q, s_w = quantize_blockwise(w_new)
    assert torch.equal(q_proj.weight.view(torch.uint8), w_q.view(torch.uint8))
    assert torch.equal(q_proj.weight_scale_inv, s_w)
    assert torch.equal(twin.model.lm_head.weight, model.lm_head.weight)
    after = twin.score(ids, mask, resp)
    assert (after - before).abs().max() > 1e-3
    # the refit is idempotent, and a stream of (name, tensor) pairs is equivalent
    state = {k: v.clone() for k, v in twin.model.state_dict().items()}
    twin.sync_weights(iter(list(model.state_dict().items())))
    for k, v in twin.model.state_dict().items():
        assert torch.equal(
            v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v,
            state[k].view(torch.uint8) if v.dtype == torch.float8_e4m3fn else state[k],
        ), k
    assert torch.equal(twin.score(ids, mask, resp), after)
    # a fresh twin of the stepped model is the same engine
    assert torch.equal(Fp8Twin(model, Fp8RolloutConfig()).score(ids, mask, resp), after)


def _fp8_state(twin):
    return {k: v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v for k, v in twin.model.state_dict().items()}


def test_sync_weights_from_the_vllm_refit_stream():
    """The twin as the consumer of stream.fp8_weight_stream: same engine as re-quantizing."""
    from nemo_ais.refit.stream import Fp8SyncConfig, fp8_weight_stream

    model = _tiny(layers=2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    from_hp = Fp8Twin(model, Fp8RolloutConfig())  # quantized from the stepped weights
    twin = Fp8Twin(_tiny(layers=2), Fp8RolloutConfig())
    stream = list(fp8_weight_stream(model.state_dict().items(), Fp8SyncConfig()))
    assert any(t.dtype == torch.float8_e4m3fn for _, t in stream)
    assert twin.sync_weights(stream) == len(stream)
    got, ref = _fp8_state(twin), _fp8_state(from_hp)
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    ids, mask = _prompts()
    resp = torch.randint(4, VOCAB, (8, 5), generator=_gen(1))
    assert torch.equal(twin.score(ids, mask, resp), from_hp.score(ids, mask, resp))
    # codes without their scales (or the reverse) are refused
    name = "model.layers.0.self_attn.q_proj.weight"
    codes = dict(stream)[name]
    with pytest.raises(ValueError, match=r"q_proj\.weight got only its codes"):
        twin.sync_weights([(name, codes)])
    with pytest.raises(ValueError, match="scale_inv: got \\[1, 2\\]"):
        twin.sync_weights([(name, codes), (name + "_scale_inv", torch.ones(1, 2))])


def test_kv_scales_sent_with_the_refit(qwen):
    from nemo_ais.refit.kv_scales import KVScaleCalibrator

    ids, mask = _prompts()
    calibrator = KVScaleCalibrator(3)
    calibrator.token_mask = mask
    with torch.no_grad(), calibrator.install_hooks(qwen):
        qwen(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
    sent = calibrator.compute_scales()
    twin = Fp8Twin(qwen, Fp8RolloutConfig(kv_cache_fp8=True))
    twin.sync_weights(sent.named_tensors())  # q, k, v scales of 3 layers
    # the engine holds exactly what was sent (fp32 on the wire), not a recalibration
    assert torch.equal(twin.kv_scales.scale, sent.scale.float().double())
    assert twin.kv_scales.to_vllm() == pytest.approx(sent.to_vllm(), rel=1e-7)
    cache = twin._cache(ids, mask)
    assert torch.equal(cache.held["k"], sent.scale[:, 1].float())  # fp32 in the engine
    partial = [(n, t) for n, t in sent.named_tensors() if "layers.2." not in n]
    with pytest.raises(ValueError, match="missing: layer 2 k, layer 2 v"):
        twin.sync_weights(partial)


def test_sync_weights_rejects_bad_tensors(qwen):
    twin = Fp8Twin(qwen, Fp8RolloutConfig())
    with pytest.raises(ValueError, match=r"unknown tensor name 'model\.layers\.0\.foo\.weight'"):
        twin.sync_weights({"model.layers.0.foo.weight": torch.zeros(1)})
    bad = qwen.model.layers[0].mlp.up_proj.weight.detach().clone()
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"sync_weights: model\.layers\.0\.mlp\.up_proj\.weight: got 1 non-finite"):
        twin.sync_weights([("model.layers.0.mlp.up_proj.weight", bad)])
    with pytest.raises(ValueError, match=r"model.norm.weight got \[3\], expected \[128\]"):
        twin.sync_weights([("model.norm.weight", torch.ones(3))])


# --------------------------------------------------------------------------------------
# FP8 KV cache
# --------------------------------------------------------------------------------------


def _kv_scale_oracle(model, ids, mask, percentile=99.9, margin=1.05):
    """numpy-style percentile (torch.quantile, float64) of the non-pad K and V the forward leaves in its HF cache
    (after RoPE: what vLLM's FP8 cache stores)."""
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
    scales = [
        [
            float(torch.quantile(states.transpose(1, 2)[mask.bool()].abs().double().flatten(), percentile / 100))
            * margin
            / E4M3_MAX
            for states in (layer.keys, layer.values)
        ]
        for layer in cache.layers
    ]
    return torch.tensor(scales, dtype=torch.float64)


def test_fp8_kv_cache_scales_and_mismatch(qwen):
    ids, mask = _prompts(batch=64)
    w8a8 = Fp8Twin(qwen, Fp8RolloutConfig())
    kv = Fp8Twin(qwen, Fp8RolloutConfig(kv_cache_fp8=True))
    scales = kv.calibrate_kv_scales(ids, mask).scale[:, 1:]  # columns k, v
    assert scales.shape == (3, 2)
    assert bool(torch.isfinite(scales).all()) and bool((scales > 0).all())
    assert bool((scales != 1.0).all())  # never the silent default
    # oracle of the default rule (NeMo-RL's: one forward = one observation, so its amax):
    # the max (percentile 100) of the cached K / V of the same (W8A8) forward
    oracle = _kv_scale_oracle(w8a8.model, ids, mask, percentile=100.0)
    torch.testing.assert_close(scales, oracle, rtol=1e-6, atol=0)
    # the element rule: P99.9 of the same outputs
    element = Fp8Twin(qwen, Fp8RolloutConfig(kv_cache_fp8=True, kv_calibration_reduction="element_percentile"))
    got = element.calibrate_kv_scales(ids, mask).scale[:, 1:]
    torch.testing.assert_close(got, _kv_scale_oracle(w8a8.model, ids, mask), rtol=1e-6, atol=0)
    # trainer-side calibration (NeMo-RL): observe the fp32 model instead
    trainer_side = Fp8Twin(qwen, Fp8RolloutConfig(kv_cache_fp8=True))
    got = trainer_side.calibrate_kv_scales(ids, mask, model=qwen).scale[:, 1:]
    torch.testing.assert_close(got, _kv_scale_oracle(qwen, ids, mask, percentile=100.0), rtol=1e-6, atol=0)

    out = w8a8.generate(ids, mask, max_new_tokens=16, generator=_gen(0))
    ref = score_responses(qwen, ids, mask, out.response_ids)
    kv_scored = kv.score(ids, mask, out.response_ids)
    w8a8_scored = w8a8.score(ids, mask, out.response_ids)
    m = out.response_mask
    base = logprob_mismatch(w8a8_scored, ref, m)
    with_kv = logprob_mismatch(kv_scored, ref, m)
    print(f"\nW8A8: {base}\nW8A8 + FP8 KV: {with_kv}")
    # FP8 KV is a second, independent error source: it moves the log-probs by an amount
    # of the same order as W8A8 does, and on average it adds to the mismatch (over 1024
    # tokens and prompt seeds 0-3: x1.05-1.15; on a few hundred tokens the two errors can
    # partly cancel, which is why this test uses 64 prompts).
    shift = logprob_mismatch(kv_scored, w8a8_scored, m)
    print(f"FP8 KV vs W8A8 only: {shift}")
    assert shift.mean_abs_delta > 0.1 * base.mean_abs_delta
    assert with_kv.mean_abs_delta > base.mean_abs_delta
    assert 1.0 < with_kv.token_mult_prob_error < 1.5


def _record_kv_writes(cache) -> list:
    """``(layer, "k" | "v", x)`` of every tensor the quantized cache is handed."""
    seen, quantize = [], cache._quantize

    def recording(x, layer, which):
        seen.append((layer, which, x))
        return quantize(x, layer, which)

    cache._quantize = recording
    return seen


@pytest.mark.parametrize("kv_cache", ["fp8", "nvfp4"])
def test_kv_cache_counts_the_elements_it_saturates(qwen, kv_cache):
    ids, mask = _prompts()
    frac = {}
    for rule in ("percentile_of_amax", "element_percentile"):
        twin = RolloutTwin(
            qwen, RolloutPrecisionConfig(format="bf16", kv_cache=kv_cache, kv_calibration_reduction=rule)
        )
        assert twin.kv_saturation is None
        out = twin.generate(ids, mask, max_new_tokens=4, generator=_gen(0))
        # oracle: the K (after RoPE) and V the cache received, counted against the scales
        twin.kv_saturation = None
        cache = twin._cache(ids, mask)
        seen = _record_kv_writes(cache)
        score_responses(twin.model, ids, mask, out.response_ids, past_key_values=cache)
        counted = twin.kv_saturation
        for kind in "kv":
            xs = [(layer, x) for layer, which, x in seen if which == kind]
            col = "qkv".index(kind)
            over = sum(int(((x.float() / counted.scale[layer, col]).abs() > 448).sum()) for layer, x in xs)
            assert counted.fractions()[kind] == over / sum(x.numel() for _, x in xs)
        frac[rule] = counted.metrics()
        assert set(frac[rule]) == {"kv_cache/saturated_frac_k", "kv_cache/saturated_frac_v"}
    # the element rule clips what NeMo-RL's keeps (the calibration max sits below 448 * s)
    for key, value in frac["element_percentile"].items():
        assert value > frac["percentile_of_amax"][key], key


def test_kv_scales_recalibrated_after_sync(qwen):
    ids, mask = _prompts()
    twin = Fp8Twin(qwen, Fp8RolloutConfig(kv_cache_fp8=True))
    assert twin.kv_scales is None
    twin.generate(ids, mask, max_new_tokens=2, generator=_gen(0))  # calibrates on prompts
    first = twin.kv_scales
    assert first is not None
    k0 = "model.layers.0.self_attn.k_proj.weight"
    scaled = {k0: qwen.state_dict()[k0] * 1.5}
    twin.sync_weights(scaled)
    assert twin.kv_scales is None  # stale after every refit
    twin.sync_weights(scaled, calibration_input_ids=ids, calibration_attention_mask=mask)
    # layer 0: k_proj output = (1.5 W_k) x + b with b = 0 at init; 1.5 W_k re-quantizes
    # to the same codes with 1.5x scales, and x (the normed embedding) is unchanged, so
    # its k scale grows 1.5x (to fp32 rounding)
    assert float(qwen.model.layers[0].self_attn.k_proj.bias.detach().abs().max()) == 0.0
    k_new, k_old = twin.kv_scales.scale[:, 1], first.scale[:, 1]
    torch.testing.assert_close(k_new[0], k_old[0] * 1.5, rtol=1e-6, atol=0)
    # V of layer 0 does not depend on W_k at all: bit-identical scale; later layers move
    v_new, v_old = twin.kv_scales.scale[:, 2], first.scale[:, 2]
    assert torch.equal(v_new[0], v_old[0])
    assert not torch.equal(v_new[1:], v_old[1:])


# --------------------------------------------------------------------------------------
# generation loop
# --------------------------------------------------------------------------------------


def test_generate_logprobs_match_teacher_forcing(qwen):
    ids, mask = _prompts()
    out = generate(qwen, ids, mask, max_new_tokens=12, temperature=0.7, generator=_gen(4))
    scored = score_responses(qwen, ids, mask, out.response_ids, temperature=0.7)
    # incremental (KV cache) vs one full forward, fp32: summation order only
    torch.testing.assert_close(out.logprobs, scored, rtol=0, atol=2e-5)
    assert torch.equal(out.sequences[:, :12], ids)
    assert torch.equal(out.sequences[:, 12:], out.response_ids)
    assert out.logprobs.dtype == torch.float32 and bool((out.logprobs <= 0).all())


def _shipped_attention():
    """The embedded preset's attention: 4 / 4 heads (no GQA copy of K / V), eager."""
    return tiny_lm(
        "qwen2",
        vocab_size=VOCAB,
        hidden_size=128,
        num_key_value_heads=4,
        max_position_embeddings=128,
        initializer_range=0.02,
        attn_implementation="eager",
    )


@pytest.mark.parametrize("kind", ["gqa", "shipped"])
def test_the_growing_kv_cache_generates_what_hf_dynamic_cache_does(qwen, kind):
    from transformers import DynamicCache

    from nemo_ais.rollout.sampling import GrowingKVCache

    model = qwen if kind == "gqa" else _shipped_attention()
    ids, mask = _prompts(length=12)
    hf = generate(model, ids, mask, max_new_tokens=60, generator=_gen(3), past_key_values=DynamicCache())
    cache = GrowingKVCache()
    ours = generate(model, ids, mask, max_new_tokens=60, generator=_gen(3), past_key_values=cache)
    assert all(torch.equal(x, y) for x, y in zip(hf, ours, strict=True))  # every bit
    for layer in cache.layers:  # capacity 12 (the prefill, exact), 64, then 130 at token 65
        assert layer.keys.shape[-2] == 12 + 60 - 1 and layer._k.shape[-2] == 130
        assert layer.keys.data_ptr() == layer._k.data_ptr()  # a view of the buffer: no copy
    # keys another cache method replaced (a crop, a beam reorder) start a new buffer from
    # them: a view handed out before is never written into
    layer = cache.layers[0]
    handed = layer.keys
    before = handed.clone()
    layer.crop(20)
    layer.reorder_cache(torch.arange(ids.shape[0]).flip(0))
    kept = layer.keys.clone()
    new_k = torch.randn(ids.shape[0], kept.shape[1], 1, kept.shape[-1])
    k, _ = layer.update(new_k, new_k.clone())
    assert torch.equal(k, torch.cat([kept, new_k], dim=-2))
    assert torch.equal(handed, before)


def test_greedy_eval_decoding_is_the_same_with_hf_dynamic_cache(monkeypatch):
    from transformers import DynamicCache

    import nemo_ais.embedded.model as embedded_model

    model = _shipped_attention()
    ids = _prompts(length=10, pad_rows=())[0]
    kwargs = dict(max_new_tokens=30, eos_token_id=3, pad_token_id=0)
    ours = embedded_model.greedy_decode(model, ids, **kwargs)
    monkeypatch.setattr(embedded_model, "GrowingKVCache", DynamicCache)
    assert torch.equal(ours, embedded_model.greedy_decode(model, ids, **kwargs))


def test_generation_is_deterministic_given_generator(qwen):
    ids, mask = _prompts()
    a = generate(qwen, ids, mask, max_new_tokens=8, generator=_gen(11))
    b = generate(qwen, ids, mask, max_new_tokens=8, generator=_gen(11))
    c = generate(qwen, ids, mask, max_new_tokens=8, generator=_gen(12))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_top_k_1_is_greedy(qwen):
    ids, mask = _prompts()
    out = generate(qwen, ids, mask, max_new_tokens=6, top_k=1, generator=_gen(5))
    # oracle: recompute the full sequence at every step, no cache, take argmax
    seq, attn = ids.clone(), mask.clone()
    for t in range(6):
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        logits = qwen(input_ids=seq, attention_mask=attn, position_ids=pos).logits[:, -1]
        greedy = logits.argmax(-1)
        assert torch.equal(out.response_ids[:, t], greedy), t
        seq = torch.cat([seq, greedy[:, None]], -1)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)


def test_exponential_race_samples_the_softmax():
    # a one-token "model": logits fixed, 4000 rows; frequencies vs softmax(z / T)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    model = _ScriptedLM([logits] * 1)
    ids = torch.zeros(4000, 1, dtype=torch.long)
    out = generate(model, ids, torch.ones_like(ids), max_new_tokens=1, temperature=1.5, generator=_gen(0))
    freq = torch.bincount(out.response_ids[:, 0], minlength=5).double() / 4000
    p = torch.softmax(logits.double() / 1.5, -1)
    # 4 sigma of a binomial proportion at n = 4000
    assert bool(((freq - p).abs() <= 4 * (p * (1 - p) / 4000).sqrt()).all()), (freq, p)
    torch.testing.assert_close(out.logprobs[:, 0].double(), p.log()[out.response_ids[:, 0]])


class _ScriptedLM(torch.nn.Module):
    """Returns scripted logits for step t (same for every row unless 2-D per-row given)."""

    def __init__(self, script):
        super().__init__()
        self.script = script
        self.calls = 0

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep):
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        b = input_ids.shape[0]
        logits = step.expand(b, -1) if step.dim() == 1 else step
        return SimpleNamespace(logits=logits[:, None, :].float())


def test_eos_and_response_mask_hand_built():
    # vocab 5, EOS = 4, greedy. Row 0 emits EOS at step 1, row 1 at step 2, row 2 never.
    big = 10.0

    def step(tokens):
        z = torch.zeros(3, 5)
        z[torch.arange(3), torch.tensor(tokens)] = big
        return z

    script = [step([1, 2, 3]), step([4, 2, 3]), step([1, 4, 3]), step([4, 4, 3])]
    ids = torch.tensor([[0, 7, 8], [6, 7, 8], [0, 0, 8]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    out = generate(
        _ScriptedLM(script), ids, mask, max_new_tokens=4, top_k=1, eos_token_id=4, pad_token_id=0, generator=_gen(0)
    )
    assert out.response_ids.tolist() == [[1, 4, 0, 0], [2, 2, 4, 0], [3, 3, 3, 3]]
    assert out.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    # log p of the argmax when one logit is 10 and four are 0: -log(1 + 4 e^-10)
    lp = -math.log1p(4 * math.exp(-big))
    expected = torch.tensor(out.response_mask.tolist(), dtype=torch.float64) * lp
    torch.testing.assert_close(out.logprobs.double(), expected, rtol=0, atol=1e-7)
    assert out.sequences.tolist()[2] == [0, 0, 8, 3, 3, 3, 3]


def test_generation_stops_when_all_rows_end():
    script = [torch.tensor([0.0, 0.0, 0.0, 0.0, 20.0])]  # EOS first, every row
    lm = _ScriptedLM(script)
    ids = torch.ones(2, 2, dtype=torch.long)
    out = generate(lm, ids, torch.ones_like(ids), max_new_tokens=5, top_k=1, eos_token_id=4, pad_token_id=1)
    assert lm.calls == 1
    assert out.response_ids.tolist() == [[4, 1, 1, 1, 1]] * 2
    assert out.response_mask.tolist() == [[1, 0, 0, 0, 0]] * 2
    assert out.logprobs[:, 1:].abs().sum() == 0


def test_left_padding_equals_unpadded(qwen):
    ids, mask = _prompts(batch=4, pad_rows=(1, 2))
    twin = Fp8Twin(qwen, Fp8RolloutConfig())
    for engine in (qwen, twin.model):
        batch = generate(engine, ids, mask, max_new_tokens=8, top_k=1)
        for row in (1, 2):
            start = int((mask[row] == 0).sum())
            alone = generate(engine, ids[row : row + 1, start:], mask[row : row + 1, start:], max_new_tokens=8, top_k=1)
            assert torch.equal(alone.response_ids[0], batch.response_ids[row])
            # fp32 with different batch shapes: only the GEMM summation order differs.
            # Under W8A8 a last-bit difference can flip one activation's FP8 rounding
            # (one E4M3 step), so there the bound is on the mean over the tokens.
            delta = (alone.logprobs[0] - batch.logprobs[row]).abs()
            if engine is qwen:
                assert float(delta.max()) <= 2e-5, delta
            else:
                assert float(delta.mean()) <= 1e-3, delta


def test_logprobs_mode_unfiltered_vs_processed(qwen):
    ids, mask = _prompts()
    kw = dict(max_new_tokens=6, temperature=0.8, top_k=5, top_p=0.9)
    raw = generate(qwen, ids, mask, generator=_gen(3), **kw)
    proc = generate(qwen, ids, mask, generator=_gen(3), logprobs_mode="processed", **kw)
    assert torch.equal(raw.response_ids, proc.response_ids)  # mode changes reports only
    # oracle: unfiltered = tempered log-softmax; processed = that minus log(kept mass)
    unf = score_responses(qwen, ids, mask, raw.response_ids, temperature=0.8)
    torch.testing.assert_close(raw.logprobs, unf, rtol=0, atol=2e-5)
    assert bool((proc.logprobs > raw.logprobs).all())  # renormalised over a subset
    scored = score_responses(
        qwen,
        ids,
        mask,
        raw.response_ids,
        logprobs_mode="processed",
        **{k: kw[k] for k in ("temperature", "top_k", "top_p")},
    )
    torch.testing.assert_close(proc.logprobs, scored, rtol=0, atol=2e-5)


def test_generate_rejects_bad_input(qwen):
    ids, mask = _prompts()
    right = mask.flip(-1)
    with pytest.raises(ValueError, match="LEFT-padded"):
        generate(qwen, ids, right, max_new_tokens=2)
    with pytest.raises(ValueError, match="temperature=0"):
        generate(qwen, ids, mask, max_new_tokens=2, temperature=0)
    with pytest.raises(ValueError, match="attention_mask: got"):
        generate(qwen, ids, mask[:, 1:], max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p=0"):
        generate(qwen, ids, mask, max_new_tokens=2, top_p=0.0)


# --------------------------------------------------------------------------------------
# MoE: fused transformers-5 experts
# --------------------------------------------------------------------------------------


def _tiny_moe():
    return tiny_moe(VOCAB)


def test_moe_experts_w8a8_against_per_token_reference():
    model = _tiny_moe()
    twin = Fp8Twin(model, Fp8RolloutConfig())
    assert "model.layers.1.mlp.experts" in twin.fp8_module_names
    assert "model.layers.1.mlp.gate" not in twin.fp8_module_names  # router stays
    assert torch.equal(twin.model.model.layers[1].mlp.gate.weight, model.model.layers[1].mlp.gate.weight)
    fp8 = twin.model.model.layers[1].mlp.experts
    assert isinstance(fp8, Fp8Experts)
    src = model.model.layers[1].mlp.experts
    # oracle: the 3-D (all experts at once) quantizer path, one token at a time
    wgu = dequantize_blockwise(*quantize_blockwise(src.gate_up_proj.detach()))
    wd = dequantize_blockwise(*quantize_blockwise(src.down_proj.detach()))

    def fq(x):
        return dequantize_activations(*quantize_activations(x))

    torch.manual_seed(5)
    x = torch.randn(6, 128)
    top_k_index = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 3], [0, 2], [1, 2]])
    top_k_weights = torch.rand(6, 2)
    ref = torch.zeros(6, 128, dtype=torch.float64)
    for t in range(6):
        for k in range(2):
            e = int(top_k_index[t, k])
            gate, up = (fq(x[t : t + 1]) @ wgu[e].t()).chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up
            ref[t] += float(top_k_weights[t, k]) * (fq(h) @ wd[e].t())[0].double()
    got = fp8(x, top_k_index, top_k_weights)
    # row batching vs one row at a time: fp32 summation order only (no FP8 flip here)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    assert (got - src(x, top_k_index, top_k_weights)).abs().max() > 1e-4  # really quantized


def test_moe_twin_sync_and_mismatch():
    model = _tiny_moe()
    twin = Fp8Twin(model, Fp8RolloutConfig())
    ids, mask = _prompts()
    out = twin.generate(ids, mask, max_new_tokens=8, generator=_gen(0))
    ref = score_responses(model, ids, mask, out.response_ids)
    stats = logprob_mismatch(out.logprobs, ref, out.response_mask)
    assert 1e-3 < stats.mean_abs_delta and stats.token_mult_prob_error < 1.5
    disabled = Fp8Twin(model, Fp8RolloutConfig(enabled=False))
    assert torch.equal(disabled.score(ids, mask, out.response_ids), ref)
    # refit of the fused 3-D expert tensors
    name = "model.layers.0.mlp.experts.down_proj"
    new = model.state_dict()[name] * 2.0 + 0.01
    assert twin.sync_weights({name: new}) == 1
    q, s = quantize_blockwise(new)
    for e, linear in enumerate(twin.model.model.layers[0].mlp.experts.down_proj):
        assert torch.equal(linear.weight.view(torch.uint8), q[e].view(torch.uint8))
        assert torch.equal(linear.weight_scale_inv, s[e])
    with pytest.raises(ValueError, match=r"experts\.down_proj: got \[128, 128\], expected \[4, N, K\]"):
        twin.sync_weights({name: new[0]})


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4_w4a16"])
def test_compute_dtype_bfloat16_refit_quantizes_the_bf16_cast_weights(fmt):
    # an fp32 trainer's refit is cast as the twin was at build: the same weights change nothing
    model = tiny_lm("qwen2", hidden_size=128)
    twin = RolloutTwin(model, RolloutPrecisionConfig(format=fmt, compute_dtype="bfloat16", verify_refit=True))

    def held():  # the fake-quantized weights are non-persistent buffers: not in state_dict()
        return {**dict(twin.model.named_parameters()), **dict(twin.model.named_buffers())}

    before = {name: t.clone() for name, t in held().items()}
    assert any(name.endswith("weight_dequant") for name in before) or fmt == "fp8"
    twin.sync_weights(model.state_dict())
    changed = [name for name, t in held().items() if not torch.equal(t, before[name])]
    assert changed == []
    assert twin.readback.weight_error == 0.0 and twin.readback.weights_checked > 0


def test_a_refit_with_bad_kv_scales_names_them_and_holds_no_stale_scale():
    model = tiny_lm("qwen2", hidden_size=128)  # 2 layers
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="fp8", kv_cache="fp8"))
    kv = "model.layers.{}.self_attn.{}_scale"
    good = {kv.format(i, k): torch.tensor(0.5) for i in range(2) for k in "kv"}
    twin.sync_weights(good)
    assert twin.kv_scales is not None
    with pytest.raises(ValueError, match=r"missing: layer 0 v, layer 1 k, layer 1 v; .*no such layer: layer 5 k\)"):
        twin.sync_weights(
            {**model.state_dict(), kv.format(0, "k"): torch.tensor(0.5), kv.format(5, "k"): torch.tensor(1.0)}
        )
    assert twin.kv_scales is None  # not the previous refit's: the next batch calibrates them
    twin.sync_weights(good)
    assert twin.kv_scales is not None
    with pytest.raises(ValueError, match=r"self_attn\.k_scale is a \[2\] torch\.float32 tensor, expected one float32"):
        twin.sync_weights({kv.format(0, "k"): torch.tensor([0.5, 0.5])})
    assert twin.kv_scales is None  # a refusal inside the load too


@pytest.mark.parametrize(("fmt", "name"), [("fp8", "lm_head.weight"), ("mxfp8", "model.layers.0.mlp.down_proj.weight")])
def test_fp8_codes_for_a_module_the_twin_holds_in_high_precision_are_refused(fmt, name):
    model = tiny_lm("qwen2", hidden_size=128)
    twin = RolloutTwin(model, RolloutPrecisionConfig(format=fmt))
    codes = model.state_dict()[name].to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=rf"{name} arrived as float8_e4m3fn codes, but the twin holds it in high"):
        twin.sync_weights({name: codes})


def test_a_temperature_below_vllms_sampling_epsilon_is_refused():
    model = tiny_lm("qwen2", hidden_size=128)
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="bf16", kv_cache="bf16"))
    ids, mask = torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"temperature=1e-40 is invalid: expected a finite float >= 1e-05"):
        twin.generate(ids, mask, max_new_tokens=2, temperature=1e-40)


def test_compute_dtype_bfloat16(qwen):
    twin = Fp8Twin(qwen, Fp8RolloutConfig(compute_dtype="bfloat16"))
    assert qwen.lm_head.weight.dtype == torch.float32  # the original is untouched
    assert torch.equal(twin.model.lm_head.weight, qwen.lm_head.weight.to(torch.bfloat16))
    fp8 = twin.model.model.layers[0].mlp.down_proj
    # quantized from the bf16-cast weight, as vLLM quantizes the BF16 checkpoint
    w_q, _ = quantize_blockwise(qwen.model.layers[0].mlp.down_proj.weight.detach().bfloat16())
    assert torch.equal(fp8.weight.view(torch.uint8), w_q.view(torch.uint8))
    ids, mask = _prompts()
    out = twin.generate(ids, mask, max_new_tokens=4, generator=_gen(0))
    ref = score_responses(qwen, ids, mask, out.response_ids)
    stats = logprob_mismatch(out.logprobs, ref, out.response_mask)
    assert out.logprobs.dtype == torch.float32 and 1e-3 < stats.mean_abs_delta < 0.2
