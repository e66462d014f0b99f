# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""FP8 KV-cache scale calibration: both rules, hooks, names, saturation and the loaded-scale check.

The default rule (``percentile_of_amax``) is checked against NeMo-RL's own
``calibrate_qkv_fp8_scales`` in ``tests/upstream/test_refit_kv_scales.py``; here
against hand-worked cases.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from tiny_models import tiny_lm
from torch import nn

from nemo_ais.refit.kv_scales import (
    FP32_MIN_SENTINEL,
    KVSaturationCounter,
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
    collect_engine_kv_scales,
    engine_name,
    kv_saturation_metrics,
    kv_scale_names,
    nearest_rank_percentile,
    percentile_amax,
    require_calibrated_kv_scales,
    verify_kv_scales,
)

E4M3_MAX = 448.0
ELEMENT = KVScaleConfig(reduction="element_percentile")


@pytest.mark.parametrize(
    ("n", "p", "expected"),
    [
        # |arange(1001)| at 99.9 %: position 0.999 * 1000 = 999 -> 999 (up to the fp64
        # rounding of 0.999 * 1000, which numpy shares)
        (1001, 99.9, 999.0),
        (11, 95.0, 9.5),  # position 9.5 -> halfway between 9 and 10
        (1000, 99.9, 998.001),  # position 998.001 -> 998 + 0.001
        (7, 100.0, 6.0),  # 100 % = max
        (1, 50.0, 0.0),
    ],
)
def test_percentile_on_arange(n, p, expected):
    x = -torch.arange(n, dtype=torch.float32)  # the sign is dropped: |x|
    got = percentile_amax(x, p).item()
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert got == np.percentile(np.arange(n, dtype=np.float64), p)


def test_percentile_matches_numpy_on_random_data():
    x = torch.randn(3, 70, 33)
    for p in (50.0, 99.0, 99.9, 99.99, 100.0):
        want = np.percentile(np.abs(x.numpy().astype(np.float64)), p)
        assert percentile_amax(x, p).item() == pytest.approx(want, rel=1e-12)


def test_default_rule_is_upstreams():
    assert KVScaleConfig().reduction == "percentile_of_amax"
    assert KVScaleConfig().percentile == 99.9 and KVScaleConfig().margin == 1.05


@pytest.mark.parametrize(
    ("n", "p", "index"),
    [
        (500, 99.9, 499),  # round(0.999 * 499) = round(498.501) = 499: the max
        (501, 99.9, 500),  # round(499.5) = 500 (half to even: 500 is even): the max
        (502, 99.9, 500),  # round(500.499) = 500: one below the max
        (1001, 99.9, 999),  # round(999.0) = 999: one below the max
        (4, 50.0, 2),  # round(1.5) = 2
        (6, 50.0, 2),  # round(2.5) = 2 (half to even, Python's round as upstream)
        (1, 99.9, 0),
    ],
)
def test_nearest_rank_is_upstreams_index(n, p, index):
    values = torch.randperm(n).double()  # order does not matter: sorted first
    assert nearest_rank_percentile(values, p).item() == index


def test_a_calibrated_scale_of_exactly_one_is_not_taken_for_the_default():
    # margin 2, amax 224 (a bf16 value): 224 * 2 / 448 = 1.0, which the refit guard reads as "never calibrated"
    cal = KVScaleCalibrator(1, KVScaleConfig(margin=2.0))
    for kind in ("q", "k", "v"):
        cal.observe(0, kind, torch.tensor([224.0, -3.0]))
    layers = cal.compute_scales().to_vllm()
    assert set(layers.values()) == {1.0 + 2.0**-23}  # one fp32 ulp above the placeholder
    require_calibrated_kv_scales(layers, 1)  # no "left at the default 1.0"


def test_default_rule_takes_max_abs_per_observation_then_nearest_rank():
    cal = KVScaleCalibrator(1)
    cal.observe(0, "k", torch.arange(1001.0).view(7, 11, 13))  # max |x| = 1000, no clipping
    cal.observe(0, "k", -3 * torch.arange(501.0))  # max |x| = 1500
    cal.observe(0, "k", torch.full((10,), 2.0))
    for kind in "qv":
        cal.observe(0, kind, torch.ones(5))
    scales = cal.compute_scales()
    # 3 observations: round(0.999 * 2) = 2 -> the largest, 1500
    assert scales.amax[0, 1].item() == 1500.0
    assert scales.scale[0, 1].item() == 1500.0 * 1.05 / E4M3_MAX  # upstream's arithmetic
    assert scales.peak[0, 1].item() == 1500.0
    assert scales.peak_over_range()[0, 1].item() == pytest.approx(1 / 1.05, rel=1e-15)
    # 1001 observations with amax 0..1000: rank 999 -> 999; the peak stays 1000
    many = KVScaleCalibrator(1, KVScaleConfig(include_q=False))
    for i in torch.randperm(1001).tolist():
        many.observe(0, "k", torch.tensor([float(i), -0.5]))
        many.observe(0, "v", torch.tensor([1.0]))
    scales = many.compute_scales()
    assert scales.amax[0, 1].item() == 999.0 and scales.peak[0, 1].item() == 1000.0
    metrics = kv_saturation_metrics(scales)
    assert list(metrics) == ["kv_cache/peak_over_range_k", "kv_cache/peak_over_range_v"]
    assert metrics["kv_cache/peak_over_range_k"] == pytest.approx(1000 / (999 * 1.05), rel=1e-15)


def test_element_rule_clips_what_the_default_keeps():
    x = torch.cat([torch.ones(9990), torch.full((10,), 50.0)])  # 0.1 % outliers (sink tokens)
    scales = {}
    for rule in ("percentile_of_amax", "element_percentile"):
        cal = KVScaleCalibrator(1, KVScaleConfig(reduction=rule, include_q=False))
        for kind in "kv":
            cal.observe(0, kind, x)
        scales[rule] = cal.compute_scales()
    assert scales["percentile_of_amax"].amax[0, 1].item() == 50.0
    # P99.9 at position 0.999 * 9999 = 9989.001: between the last 1 and the first 50
    assert scales["element_percentile"].amax[0, 1].item() == pytest.approx(1.049, rel=1e-9)
    assert kv_saturation_metrics(scales["percentile_of_amax"])["kv_cache/peak_over_range_k"] == pytest.approx(1 / 1.05)
    counter = KVSaturationCounter(scales["element_percentile"])
    counter.observe(0, "k", x)
    assert counter.fractions() == {"k": 10 / 10000}  # every outlier saturates
    counter = KVSaturationCounter(scales["percentile_of_amax"])
    counter.observe(0, "k", x)
    counter.observe(0, "v", x[:100])
    assert counter.metrics() == {"kv_cache/saturated_frac_k": 0.0, "kv_cache/saturated_frac_v": 0.0}


def test_peak_over_range_needs_a_calibration():
    scale = torch.ones(1, 3)
    with pytest.raises(ValueError, match="peak is None"):
        KVScales(scale * E4M3_MAX, scale, True).peak_over_range()


def test_element_rule_max_over_observations_and_scale_formula():
    cal = KVScaleCalibrator(2, ELEMENT)
    cal.observe(0, "k", torch.arange(1001.0).view(7, 11, 13))  # 99.9 % -> 999
    cal.observe(0, "k", 3 * torch.arange(501.0))  # position 499.5 -> (1497 + 1500) / 2
    cal.observe(0, "k", torch.full((10,), 2.0))  # smaller: the max keeps 1498.5
    for layer in range(2):
        for kind in "qv":
            cal.observe(layer, kind, torch.ones(5))
    cal.observe(1, "k", torch.zeros(4, 8))  # all-zero: amax floored at 1e-4
    scales = cal.compute_scales()
    # 0.999 * 500 rounds to 499.50000000000006 in fp64 (numpy gets the same): rel 1e-12
    assert scales.amax[0, 1].item() == pytest.approx(1498.5, rel=1e-12)
    assert scales.scale[0, 1].item() == pytest.approx(1498.5 * 1.05 / E4M3_MAX, rel=1e-12)
    assert scales.scale[1, 1].item() == pytest.approx(1e-4 * 1.05 / E4M3_MAX, rel=1e-15)
    assert scales.scale[0, 0].item() == pytest.approx(1.05 / E4M3_MAX, rel=1e-15)
    out = scales.to_vllm()
    assert out == {
        "model.layers.0.self_attn.attn.q_scale": pytest.approx(1.05 / 448),
        "model.layers.0.self_attn.k_scale": pytest.approx(1498.5 * 1.05 / 448),
        "model.layers.0.self_attn.v_scale": pytest.approx(1.05 / 448),
        "model.layers.1.self_attn.attn.q_scale": pytest.approx(1.05 / 448),
        "model.layers.1.self_attn.k_scale": pytest.approx(1e-4 * 1.05 / 448),
        "model.layers.1.self_attn.v_scale": pytest.approx(1.05 / 448),
    }
    named = dict(scales.named_tensors())
    assert named["model.layers.0.self_attn.k_scale"].dtype == torch.float32
    assert named["model.layers.0.self_attn.k_scale"].shape == ()


def test_custom_percentile_margin_and_kv_only():
    cfg = KVScaleConfig(reduction="element_percentile", percentile=50.0, margin=2.0, include_q=False)
    cal = KVScaleCalibrator(1, cfg)
    cal.observe(0, "k", torch.arange(11.0))  # median 5
    cal.observe(0, "v", torch.arange(5.0))  # median 2
    scales = cal.compute_scales()  # q never observed: fine when include_q=False
    assert scales.to_vllm() == {
        "model.layers.0.self_attn.k_scale": pytest.approx(5 * 2 / 448, rel=1e-15),
        "model.layers.0.self_attn.v_scale": pytest.approx(2 * 2 / 448, rel=1e-15),
    }


def test_missing_and_nonfinite_observations_raise():
    cal = KVScaleCalibrator(2)
    cal.observe(0, "k", torch.ones(3))
    with pytest.raises(
        ValueError, match=r"no activations observed for 5 layer/kind pair\(s\) \(layer 0 q, layer 0 v, layer 1 q"
    ):
        cal.compute_scales()
    for config in (KVScaleConfig(), ELEMENT):
        cal = KVScaleCalibrator(1, config)
        for kind in "qkv":
            cal.observe(0, kind, torch.ones(3))
        cal.observe(0, "v", torch.tensor([1.0, float("nan")]))
        cal.observe(0, "k", torch.tensor([float("-inf")]))
        with pytest.raises(
            ValueError, match=r"non-finite activations in 2 layer/kind pair\(s\) \(layer 0 k, layer 0 v\)"
        ):
            cal.compute_scales()
    for config in (KVScaleConfig(), ELEMENT):  # finite in float64, inf as a float32 scale
        cal = KVScaleCalibrator(1, config)
        for kind in "qkv":
            cal.observe(0, kind, torch.tensor([1.0, 1e300 if kind == "k" else 2.0], dtype=torch.float64))
        with pytest.raises(ValueError, match=r"non-finite activations in 1 .*\(layer 0 k\)"):
            cal.compute_scales()
    with pytest.raises(ValueError, match=r"layer=2 kind='k' is invalid"):
        cal.observe(2, "k", torch.ones(1))
    with pytest.raises(ValueError, match=r"kind='o' is invalid"):
        cal.observe(0, "o", torch.ones(1))


class _Attn(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d), nn.Linear(d, d // 2), nn.Linear(d, d // 2))
        self.o_proj = nn.Linear(d, d)

    def forward(self, h):
        return h + self.o_proj(self.q_proj(h)) + 0 * (self.k_proj(h).sum() + self.v_proj(h).sum())


class _Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.self_attn = _Attn(d)

    def forward(self, h):
        return self.self_attn(h)


class _Body(nn.Module):
    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(d) for _ in range(n))

    def forward(self, h):
        for layer in self.layers:
            h = layer(h)
        return h


class _TinyHF(nn.Module):
    """The HF module layout (model.layers.N.self_attn.{q,k,v}_proj), without transformers."""

    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.model = _Body(d, n)

    def forward(self, h):
        return self.model(h)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_hooks_record_k_and_v_as_cached_and_q_at_q_proj_with_token_mask(kind):
    """K and V as the forward's HF cache holds them (after Qwen3's k_norm and RoPE: what vLLM's FP8 cache stores), Q
    at the q_proj output; padded rows ignored. A k_proj hook saw neither k_norm nor RoPE."""
    model = tiny_lm(kind, seed=0)
    ids = torch.randint(3, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}
    q_out = {}
    q_hooks = [
        layer.self_attn.q_proj.register_forward_hook(lambda _m, _i, out, i=i: q_out.__setitem__(i, out))
        for i, layer in enumerate(model.model.layers)
    ]
    cal = KVScaleCalibrator(2, KVScaleConfig(reduction="element_percentile", percentile=99.0))
    default, no_cache = KVScaleCalibrator(2), KVScaleCalibrator(2)
    with torch.no_grad(), cal.install_hooks(model), default.install_hooks(model):
        cal.token_mask = default.token_mask = mask
        cache = model(**kwargs, use_cache=True).past_key_values
    with torch.no_grad(), no_cache.install_hooks(model):  # no cache: a pass-through one while hooked
        no_cache.token_mask = mask
        model(**kwargs, use_cache=False)
    for h in q_hooks:
        h.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # removed on exit
    for i, layer in enumerate(cache.layers):
        observed = (q_out[i], *(x.transpose(1, 2).flatten(2) for x in (layer.keys, layer.values)))
        for j, x in enumerate(observed):
            valid = x[mask.bool()].abs().double().numpy()
            assert cal.local_amax()[i, j].item() == pytest.approx(np.percentile(valid, 99.0), rel=1e-6)
            assert default.local_amax()[i, j].item() == pytest.approx(valid.max(), rel=1e-6)
    assert torch.equal(no_cache.local_amax(), default.local_amax())
    assert len(cal.compute_scales().to_vllm()) == 6
    with pytest.raises(ValueError, match="found no"):
        cal.install_hooks(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="layer 1 >= num_layers=1"):
        KVScaleCalibrator(1).install_hooks(model)
    with pytest.raises(ValueError, match="its forward takes no past_key_values"):
        KVScaleCalibrator(3).install_hooks(_TinyHF())  # the HF names without HF's attention


def test_names_and_engine_remap():
    names = kv_scale_names(7)
    assert names == {
        "q": "model.layers.7.self_attn.attn.q_scale",
        "k": "model.layers.7.self_attn.k_scale",
        "v": "model.layers.7.self_attn.v_scale",
    }
    assert engine_name(names["k"]) == "model.layers.7.self_attn.attn.k_scale"
    assert engine_name(names["q"]) == names["q"]


class _Engine(nn.Module):
    """Engine-side attention holding vLLM-style scale parameters (sentinel-initialised)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList()
        for _ in range(n):
            layer = nn.Module()
            layer.self_attn = nn.Module()
            layer.self_attn.attn = nn.Module()
            for kind in "qkv":
                p = nn.Parameter(torch.tensor(FP32_MIN_SENTINEL), requires_grad=False)
                layer.self_attn.attn.register_parameter(f"{kind}_scale", p)
            self.model.layers.append(layer)

    def load(self, named):
        params = dict(self.named_parameters())
        for name, value in named:
            params[engine_name(name)].data.copy_(value)


def test_verify_detects_default_sentinel_and_mismatch():
    cal = KVScaleCalibrator(2)
    for layer in range(2):
        for kind in "qkv":
            cal.observe(layer, kind, torch.arange(100.0) * (layer + 1))
    scales = cal.compute_scales()
    sent = scales.to_vllm()
    engine = _Engine(2)
    with pytest.raises(ValueError, match=r"\(6 of 6\):\n.*never loaded"):
        verify_kv_scales(collect_engine_kv_scales(engine), sent)
    engine.load(scales.named_tensors())
    verify_kv_scales(collect_engine_kv_scales(engine), sent)  # all loaded: passes
    engine.model.layers[1].self_attn.attn.v_scale.data.fill_(1.0)  # fell back to 1.0
    engine.model.layers[0].self_attn.attn.k_scale.data.mul_(1.01)
    with pytest.raises(ValueError, match=r"\(2 of 6\)") as info:
        verify_kv_scales(collect_engine_kv_scales(engine), sent)
    msg = str(info.value)
    assert "model.layers.1.self_attn.v_scale: left at its default 1.0" in msg
    assert "model.layers.0.self_attn.k_scale: engine holds" in msg
    with pytest.raises(ValueError, match="not found in the engine"):
        verify_kv_scales({}, {"model.layers.0.self_attn.k_scale": 0.5})
    with pytest.raises(ValueError, match=r"invalid value -0\.5"):
        verify_kv_scales({"model.layers.0.self_attn.attn.k_scale": -0.5}, {"model.layers.0.self_attn.k_scale": 0.5})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"percentile": 0.0}, "percentile"),
        ({"percentile": 100.5}, "percentile"),
        ({"margin": 0.9}, "margin"),
        ({"amax_floor": 0.0}, "amax_floor"),
        ({"pct": 99.0}, "pct"),
        ({"reduction": "max"}, "reduction"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        KVScaleConfig(**kwargs)
    with pytest.raises(ValueError, match="num_layers=0"):
        KVScaleCalibrator(0)


def test_the_pass_through_cache_is_an_empty_hf_cache_and_copies():
    """Without a cache the hooked attention gets a fresh DynamicCache for the call: an attention that asks its length
    first (Llama4's NoPE layers) reads 0 as without hooks; a copy does not recurse into ``__getattr__``."""
    from nemo_ais.refit.kv_scales import _ObservedCache

    cache = _ObservedCache(None, 0, KVScaleCalibrator(1))
    assert cache.get_seq_length() == 0
    k = torch.randn(1, 2, 3, 4)
    assert torch.equal(cache.update(k, k + 1, 0)[0], k) and cache.get_seq_length() == 3
    assert copy.deepcopy(cache).get_seq_length() == 3
