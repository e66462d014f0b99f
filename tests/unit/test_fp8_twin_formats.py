# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The twin in every rollout format (fp8, mxfp8, nvfp4_w4a16, nvfp4_w4a4; bf16/fp8/nvfp4 KV).

Checks, on tiny HF models built offline (random init, nothing fetched): the BF16 arm is an
exact copy; every quantized linear is bit-equal to the public registry's two functions
(what a QARL-style trainer uses); NVFP4 fused shards share one global amax; the W4A4
static input amax equals an independent max over the trainer's hooked inputs; the
exclusions match NeMo-RL's own ignore patterns; the NVFP4 KV cache stores
``fake_quantize_nvfp4`` of K/V; ``gen_kl_error`` equals NeMo-RL's ``calculate_kl`` +
``masked_mean``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_lm, tiny_moe

from nemo_ais.config import validate_section
from nemo_ais.formats.nvfp4 import fake_quantize_nvfp4
from nemo_ais.refit.config import RENAMED_KEYS, RefitConfig, WeightFormatFields
from nemo_ais.rollout.fake_quant import LINEAR_FAKE_QUANT, fused_shard_group, shared_weight_amax, straight_through
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.linear import Fp8Linear, QuantExperts, QuantLinear
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
QUANTIZED_FORMATS = ["fp8", "mxfp8", "nvfp4_w4a16", "nvfp4_w4a4"]
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _tiny(layers=3, hidden=128, seed=0):
    return tiny_lm(
        seed=seed, vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, max_position_embeddings=128
    )


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def qwen():
    return _tiny()


def _prompts(batch=6, length=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids[0, :3] = 0
    return ids, mask


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"format": "nvfp8"}, r"rollout\.format="),
        ({"kv_cache": "int8"}, r"rollout\.kv_cache="),
        ({"keep_patterns": ["(unclosed"]}, r"rollout\.keep_patterns"),
        ({"block": [128, 0]}, r"rollout\.block="),
        ({"nvfp4_rows_per_block": 8}, r"rollout\.nvfp4_rows_per_block="),
        ({"num_first_layers_in_bf16": -1}, r"rollout\.num_first_layers_in_bf16="),
        ({"compute_dtype": "float16"}, r"rollout\.compute_dtype="),
    ],
)
def test_config_rejects_bad_values_by_field(data, match):
    with pytest.raises(ValueError, match=match):
        validate_section(RolloutPrecisionConfig, data, "rollout")


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_weight_format_knobs_have_one_name_in_the_twin_and_the_refit(old):
    """One spelling of each weight-format knob: the twin's config and the refit's agree."""
    new = RENAMED_KEYS[old]
    shared = WeightFormatFields.model_fields
    assert new in shared
    for cls in (RolloutPrecisionConfig, RefitConfig):
        assert old not in cls.model_fields
        assert cls.model_fields[new].default == shared[new].default
        with pytest.raises(ValueError, match=rf"^rollout\.{old} was renamed {new} "):
            validate_section(cls, {old: shared[new].default}, "rollout")
    twin = RolloutPrecisionConfig(format="fp8", block=(64, 32), family="divide", eps=0.5)
    refit = RefitConfig(format="fp8", block=(64, 32), family="divide", eps=0.5)
    assert twin.weight_block == refit.weight_block == (64, 32)
    assert (twin.family, twin.eps) == (refit.family, refit.eps)
    assert RolloutPrecisionConfig(format="mxfp8").weight_block == RefitConfig(format="mxfp8").weight_block


def test_former_fp8_keys_translate():
    assert Fp8RolloutConfig().format == "fp8" and Fp8RolloutConfig().kv_cache == "bf16"
    on = Fp8RolloutConfig(kv_cache_fp8=True, ue8m0=True)
    assert (on.format, on.kv_cache, on.ue8m0, on.kv_cache_fp8, on.enabled) == ("fp8", "fp8", True, True, True)
    off = Fp8RolloutConfig(enabled=False, kv_cache_fp8=True, compute_dtype="bfloat16")
    assert (off.format, off.kv_cache, off.compute_dtype, off.enabled) == ("bf16", "bf16", None, False)
    assert isinstance(off, RolloutPrecisionConfig)
    assert Fp8RolloutConfig(**off.model_dump()) == off  # round trip through the new keys
    with pytest.raises(ValueError, match=r"rollout\.fp8\.enabled .* cannot be combined with format"):
        validate_section(Fp8RolloutConfig, {"enabled": False, "format": "fp8"}, "rollout.fp8")
    with pytest.raises(ValueError, match=r"kv_cache_fp8='yes' is invalid"):
        Fp8RolloutConfig(kv_cache_fp8="yes")


# --------------------------------------------------------------------------------------
# the BF16 arm and the module sets
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config", [RolloutPrecisionConfig(format="bf16"), Fp8RolloutConfig(enabled=False, kv_cache_fp8=True)]
)
def test_bf16_arm_is_bit_identical(qwen, config):
    twin = RolloutTwin(qwen, config)
    assert twin.quantized_module_names == () and not twin.config.enabled
    ids, mask = _prompts()
    ref = generate(qwen, ids, mask, max_new_tokens=6, generator=_gen(3))
    out = twin.generate(ids, mask, max_new_tokens=6, generator=_gen(3))
    for field in ("sequences", "logprobs"):
        assert torch.equal(getattr(out, field), getattr(ref, field)), field
    assert twin.kv_scales is None


@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_every_decoder_linear_is_quantized(qwen, fmt):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt))
    expected = tuple(f"model.layers.{i}.{blk}.{p}" for i in range(3) for blk, p in _blocks())
    assert twin.quantized_module_names == expected
    kind = Fp8Linear if fmt == "fp8" else QuantLinear
    assert all(isinstance(twin.model.get_submodule(n), kind) for n in expected)
    assert isinstance(twin.model.lm_head, torch.nn.Linear)  # not quantized


def _blocks():
    return [("self_attn", p) for p in PROJ[:4]] + [("mlp", p) for p in PROJ[4:]]


def test_exclusions_match_nemo_rl_ignore_patterns(qwen):
    # NeMo-RL's real-quant NVFP4 default keeps *self_attn* (and lm_head, routers) in BF16:
    # attention_in_bf16 selects the same decoder linears as its own matcher
    from nemo_rl.modelopt.utils import DEFAULT_NVFP4_IGNORE, matches_quant_ignore_pattern

    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="nvfp4_w4a16", attention_in_bf16=True))
    decoder_linears = [n for n, m in qwen.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    upstream = [n for n in decoder_linears if not matches_quant_ignore_pattern(n, DEFAULT_NVFP4_IGNORE)]
    assert list(twin.quantized_module_names) == upstream
    cfg = RolloutPrecisionConfig(
        format="mxfp8", num_first_layers_in_bf16=1, num_last_layers_in_bf16=1, keep_patterns=(r"mlp\.down_proj$",)
    )
    names = RolloutTwin(qwen, cfg).quantized_module_names
    assert names == tuple(f"model.layers.1.{b}.{p}" for b, p in _blocks() if p != "down_proj")


def test_in_dim_not_a_multiple_of_the_block_is_named():
    model = _tiny(hidden=80)  # 80 % 32 != 0 for MXFP8; head dim 20 for the NVFP4 KV cache
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj: in-dim 80 .* 32"):
        RolloutTwin(model, RolloutPrecisionConfig(format="mxfp8"))
    with pytest.raises(ValueError, match=r"kv_cache='nvfp4' needs a head dim .* got 20"):
        RolloutTwin(model, RolloutPrecisionConfig(format="bf16", kv_cache="nvfp4"))
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="nvfp4_w4a16"))  # 80 % 16 == 0
    assert len(twin.quantized_module_names) == 21


# --------------------------------------------------------------------------------------
# the registry: the twin's linears are exactly its two functions
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_twin_linears_equal_the_registry_bit_for_bit(qwen, fmt):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt))
    ids, mask = _prompts()
    twin.score(ids, mask, ids[:, :2])  # calibrates the W4A4 input amax
    fq = LINEAR_FAKE_QUANT[fmt]
    originals = {f"{n}.weight": qwen.get_submodule(n).weight for n in twin.quantized_module_names}
    amax = shared_weight_amax(originals) if fq.shared_weight_amax else {}
    x = torch.randn(3, 5, 128, generator=_gen(8)) * 2
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.2.mlp.up_proj"):
        module = twin.model.get_submodule(name)
        w_fq = fq.weight(originals[f"{name}.weight"], amax=amax.get(f"{name}.weight"))
        assert torch.equal(module.weight_dequant.view(torch.int32), w_fq.view(torch.int32)), name
        input_amax = getattr(module, "input_amax", None)
        expected = F.linear(fq.activation(x, amax=input_amax).float(), w_fq)
        if module.bias is not None:
            expected = expected + module.bias.float()
        assert torch.equal(module(x).view(torch.int32), expected.view(torch.int32)), name
    # a trainer's straight-through forward gives the same values and identity gradients
    w = originals["model.layers.0.mlp.up_proj.weight"].detach().clone().requires_grad_(True)
    w_ste = straight_through(fq.weight, w, amax=amax.get("model.layers.0.mlp.up_proj.weight"))
    assert torch.equal(w_ste, twin.model.get_submodule("model.layers.0.mlp.up_proj").weight_dequant)
    w_ste.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def test_nvfp4_fused_shards_share_one_global_amax(qwen):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="nvfp4_w4a16"))
    layer = qwen.model.layers[1]
    qkv = max(float(getattr(layer.self_attn, p).weight.detach().abs().max()) for p in PROJ[:3])
    gate_up = max(float(getattr(layer.mlp, p).weight.detach().abs().max()) for p in PROJ[4:6])
    tl = twin.model.model.layers[1]
    assert [float(getattr(tl.self_attn, p).weight_amax) for p in PROJ[:3]] == [qkv] * 3
    assert [float(getattr(tl.mlp, p).weight_amax) for p in PROJ[4:6]] == [gate_up] * 2
    assert float(tl.mlp.down_proj.weight_amax) == float(layer.mlp.down_proj.weight.detach().abs().max())
    assert fused_shard_group("model.layers.1.self_attn.v_proj.weight") == ("model.layers.1.self_attn.qkv_proj")
    # refit: a partial fused group is refused; the whole model re-quantizes like a fresh twin
    name = "model.layers.1.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"k_proj\.weight, .*v_proj\.weight missing"):
        twin.sync_weights({name: qwen.state_dict()[name] * 3})
    moved = {k: v * 1.5 if "layers.1.self_attn" in k else v for k, v in qwen.state_dict().items()}
    twin.sync_weights(moved)
    fresh_model = _tiny()
    fresh_model.load_state_dict(moved)
    fresh = RolloutTwin(fresh_model, RolloutPrecisionConfig(format="nvfp4_w4a16"))
    for n in twin.quantized_module_names:
        a, b = twin.model.get_submodule(n), fresh.model.get_submodule(n)
        assert torch.equal(a.weight_dequant, b.weight_dequant), n


def test_w4a4_input_amax_is_the_max_over_valid_tokens(qwen):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="nvfp4_w4a4"))
    ids, mask = _prompts()
    # oracle: hooks on the trainer's own linears, max |x| over the unpadded positions
    seen = {}

    def hook(name):
        def record(_m, inputs):
            x = inputs[0][mask.bool()]
            seen[name] = max(seen.get(name, 0.0), float(x.abs().max()))

        return record

    handles = [qwen.get_submodule(n).register_forward_pre_hook(hook(n)) for n in twin.quantized_module_names]
    with torch.no_grad():
        qwen(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
    for h in handles:
        h.remove()
    got = twin.calibrate_input_amax(ids, mask, model=qwen)  # trainer-side
    assert {n: float(a) for n, a in got.items()} == seen
    # engine-side: stale after a refit, then recalibrated on the next batch
    twin.sync_weights(qwen.state_dict())
    assert all(a is None for a in twin.input_amax.values())
    twin.score(ids, mask, ids[:, :3])
    engine = twin.input_amax
    assert all(a is not None and float(a) > 0 for a in engine.values())
    # the first layer's q/k/v input is the same normed embedding on both sides
    assert float(engine["model.layers.0.self_attn.q_proj"]) == seen["model.layers.0.self_attn.q_proj"]


def test_w4a4_moe_input_amax_ignores_padding():
    """A routed expert's input gathers rows of the whole batch, so the mask cannot drop its padding: a padded batch
    must calibrate as its prompts do alone. The pad token's one-hot embedding would give every layer-0 expert
    ``sqrt(hidden) = 11.3`` after the RMSNorm (what the batched forward recorded before the fix)."""
    moe = tiny_moe()
    with torch.no_grad():
        moe.model.embed_tokens.weight[0] = 0.0
        moe.model.embed_tokens.weight[0, 5] = 50.0
    ids, mask = _prompts()  # row 0: three pads (token 0)
    config = RolloutPrecisionConfig(format="nvfp4_w4a4")
    got = RolloutTwin(moe, config).calibrate_input_amax(ids, mask)
    alone: dict[str, float] = {}  # each prompt its own unpadded batch of one (no padding to leak)
    for row, valid in zip(ids, mask.bool(), strict=True):
        prompt = row[valid][None]
        for name, amax in RolloutTwin(moe, config).calibrate_input_amax(prompt, torch.ones_like(prompt)).items():
            alone[name] = max(alone.get(name, 0.0), float(amax))
    assert {n: float(a) for n, a in got.items()} == alone
    experts = [n for n in got if ".experts." in n]
    assert experts and all(alone[n] < 11.3 / 2 for n in experts if ".layers.0." in n)


# --------------------------------------------------------------------------------------
# KV cache and mismatch
# --------------------------------------------------------------------------------------


def test_nvfp4_kv_cache_stores_fake_quantized_states(qwen):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format="bf16", kv_cache="nvfp4"))
    ids, mask = _prompts()
    cache = twin._cache(ids, mask)
    assert isinstance(cache, QuantizedKVCache) and cache.kind == "nvfp4"
    k = torch.randn(2, 2, 5, 32, generator=_gen(4))
    v = torch.randn(2, 2, 5, 32, generator=_gen(5))
    k_out, v_out = cache.update(k, v, 1)
    k_amax = (twin.kv_scales.scale[1, 1] * 448).float()
    v_amax = (twin.kv_scales.scale[1, 2] * 448).float()
    assert torch.equal(k_out, fake_quantize_nvfp4(k, k_amax))
    assert torch.equal(v_out, fake_quantize_nvfp4(v, v_amax))
    assert not torch.equal(k_out, k) and torch.equal(cache.layers[1].keys, k_out)
    scored = twin.score(ids, mask, ids[:, :4])
    assert not torch.equal(scored, score_responses(qwen, ids, mask, ids[:, :4]))


@pytest.mark.parametrize("kv_cache", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_every_format_generates_with_a_bounded_mismatch(qwen, fmt, kv_cache):
    twin = RolloutTwin(qwen, RolloutPrecisionConfig(format=fmt, kv_cache=kv_cache))
    ids, mask = _prompts()
    out = twin.generate(ids, mask, max_new_tokens=8, generator=_gen(0))
    prev = score_responses(qwen, ids, mask, out.response_ids)
    s = logprob_mismatch(prev, out.logprobs, out.response_mask)
    # nonzero (really quantized) and far from broken: a random-init tiny model is near
    # uniform, so 4-bit noise moves log-probs by at most a few hundredths
    assert 1e-4 < s.mean_abs_delta < 0.3 and 1.0 < s.token_mult_prob_error < 1.5, s
    assert 0.0 < s.gen_kl_error < 0.05, s


def test_gen_kl_error_is_nemo_rls(qwen):
    from nemo_rl.algorithms.utils import calculate_kl, masked_mean

    g = _gen(2)
    prev, gen = -torch.rand(4, 9, generator=g) * 3, -torch.rand(4, 9, generator=g) * 3
    mask = (torch.rand(4, 9, generator=g) > 0.3).float()
    ours = logprob_mismatch(prev, gen, mask)
    kl = calculate_kl(gen, prev, kl_type="k3", input_clamp_value=None, output_clamp_value=None)
    upstream = float(masked_mean(kl, mask))
    assert ours.gen_kl_error == pytest.approx(upstream, rel=1e-6)
    mult = float(masked_mean(torch.exp((gen - prev).abs() * mask), mask))
    assert ours.token_mult_prob_error == pytest.approx(mult, rel=1e-6)


def test_fp8_twin_name_and_moe_in_nvfp4_w4a4():
    assert Fp8Twin is RolloutTwin
    model = tiny_moe()  # the MoE model of test_fp8_twin.py
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="nvfp4_w4a4", kv_cache="fp8"))
    experts = twin.model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantExperts)
    ids, mask = _prompts()
    out = twin.generate(ids, mask, max_new_tokens=4, generator=_gen(0))
    assert out.logprobs.isfinite().all()
    # every expert of a projection holds the projection's one input amax
    amax = {float(linear.input_amax) for linear in experts.gate_up_proj}
    assert len(amax) == 1 and amax.pop() > 0


def test_trainer_side_calibration_of_a_fused_experts_moe_names_the_layout():
    moe = tiny_moe(256)
    ids = torch.randint(4, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    twin = RolloutTwin(moe, RolloutPrecisionConfig(format="nvfp4_w4a4"))
    with pytest.raises(
        ValueError, match=r"mlp\.experts\..*: the observed model has no such module .* fused-experts MoE"
    ):
        twin.calibrate_input_amax(ids, torch.ones_like(ids), model=moe)


def test_scoring_refuses_token_ids_it_cannot_embed_and_mismatch_ignores_masked_inf():
    from nemo_ais.rollout.sampling import logprob_mismatch, score_responses

    model = tiny_lm(vocab_size=64)
    ids, mask = torch.randint(3, 64, (2, 5)), torch.ones(2, 5, dtype=torch.int64)
    resp = torch.randint(3, 64, (2, 4))
    with pytest.raises(ValueError, match=r"response_ids: got \[2, 4\] torch.float32, expected integer token ids"):
        score_responses(model, ids, mask, resp.float() + 0.7)  # was truncated to ids silently
    with pytest.raises(ValueError, match=r"token ids in \[\d+, 64\], expected \[0, 64\)"):
        score_responses(model, ids, mask, torch.cat([resp[:, :3], torch.full((2, 1), 64)], dim=1))
    logp = score_responses(model, ids, mask, resp)
    past_eos = logp.clone()
    past_eos[:, 2:] = -torch.inf  # a token outside top-k after EOS, processed mode: masked out
    rmask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])
    stats = logprob_mismatch(past_eos, past_eos, rmask)
    assert (stats.mean_abs_delta, stats.token_mult_prob_error, stats.gen_kl_error, stats.n_tok) == (0.0, 1.0, 0.0, 4)


def test_the_twin_names_an_out_of_vocabulary_prompt_before_its_calibration_forward():
    model = tiny_lm(vocab_size=64)
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="fp8", kv_cache="fp8"))  # calibrates on the prompts
    ids, mask = torch.randint(3, 64, (2, 5)), torch.ones(2, 5, dtype=torch.int64)
    ids[1, 2] = 64
    for call in (lambda: twin.score(ids, mask, ids[:, :2]), lambda: twin.generate(ids, mask, max_new_tokens=2)):
        with pytest.raises(ValueError, match=r"input_ids: got token ids in \[\d+, 64\], expected \[0, 64\)"):
            call()
