# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The offline check keeps in BF16 exactly the linears NeMo-RL's engines do.

Upstream's real ``init_fp8`` (``nemo_rl.models.generation.vllm.quantization.fp8``, v0.7.0's
and main's) builds vLLM's ``ignored_layers`` from ``num_first_layers_in_bf16``,
``num_last_layers_in_bf16`` and ``quantization_ignored_layer_kws``, for block FP8 and MXFP8
alike; :func:`nemo_ais.preflight.checks.formats.kept_in_bf16` (the shard checks and the memory
budget) must name the same linears. Stubbed: vLLM's names (``_vllm_boundary``) and the engine
patch ``monkey_patch_vllm_ray_executor`` (GPU work), which records the config it gets. The
AIS FP8 refit's rule (``refit.configure``) is held to the same lists, and the NVFP4 rule (the
offline check's copy of ``DEFAULT_NVFP4_IGNORE``) to upstream's ``matches_quant_ignore_pattern``.
"""

from __future__ import annotations

import importlib

import pytest
from _vllm_boundary import import_upstream_fp8
from nemo_rl_version import per_version
from transformers import Qwen3Config

from nemo_ais.nemo_rl import refit
from nemo_ais.preflight.checks.formats import NVFP4_DEFAULT_IGNORE, kept_in_bf16

pytestmark = pytest.mark.nemo_rl

N_LAYERS = 4


@pytest.fixture
def upstream_fp8(monkeypatch):
    yield from import_upstream_fp8(monkeypatch)


@pytest.fixture
def model_dir(tmp_path):
    Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    ).save_pretrained(tmp_path)
    return tmp_path


def _linears() -> list[str]:
    leaves = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return [
        f"model.layers.{i}.{'self_attn' if leaf.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{leaf}"
        for i in range(N_LAYERS)
        for leaf in leaves
    ]


EXCLUSIONS = [
    {},
    {"num_first_layers_in_bf16": 1, "num_last_layers_in_bf16": 1},
    {"num_first_layers_in_bf16": 1},
    {"num_last_layers_in_bf16": 2},
    {"quantization_ignored_layer_kws": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    {"num_first_layers_in_bf16": 1, "quantization_ignored_layer_kws": ["down_proj"]},
]


def _upstream_bf16(upstream_fp8, model_dir, monkeypatch, vllm_cfg) -> set[str]:
    """The linears upstream's init_fp8 tells vLLM to keep unquantized (its ignored_layers)."""
    patched = []
    monkeypatch.setattr(upstream_fp8, "monkey_patch_vllm_ray_executor", patched.append)
    kwargs = upstream_fp8.init_fp8(vllm_cfg, str(model_dir), 1)
    assert len(patched) == 1 and getattr(patched[0], "is_mx", False) is vllm_cfg["is_mx"]
    ignored = kwargs["hf_overrides"]["quantization_config"].get("ignored_layers", [])
    nested = [n for n in ignored if isinstance(n, list)]
    # v0.7.0 appends the first / last layers' list as one element (main extends): a nested
    # list vLLM's ignored_layers membership test does not look into. Compared here is what
    # upstream means; the refit's engine_pairs stops the first refit if vLLM quantized them.
    counts = [vllm_cfg.get(f"num_{end}_layers_in_bf16", 0) for end in ("first", "last")]
    assert len(nested) == per_version(v0_7_0=sum(c > 0 for c in counts), main=0)
    names = {n for n in ignored if isinstance(n, str)} | {n for group in nested for n in group}
    return {m for m in _linears() if m in names}


def _vllm_cfg(is_mx: bool, exclusions: dict) -> dict:
    return {"precision": "fp8", "kv_cache_dtype": "auto", "async_engine": False, "is_mx": is_mx, **exclusions}


@pytest.mark.parametrize("is_mx", per_version(v0_7_0=[False], main=[False, True]))  # MXFP8: main
@pytest.mark.parametrize("exclusions", EXCLUSIONS)
def test_offline_bf16_linears_are_upstreams_ignored_layers(upstream_fp8, model_dir, monkeypatch, is_mx, exclusions):
    vllm_cfg = _vllm_cfg(is_mx, exclusions)
    want = _upstream_bf16(upstream_fp8, model_dir, monkeypatch, vllm_cfg)
    bf16 = kept_in_bf16({"policy": {"generation": {"vllm_cfg": vllm_cfg}}}, N_LAYERS)
    assert {m for m in _linears() if bf16(m)} == want


@pytest.mark.parametrize("exclusions", EXCLUSIONS)
def test_the_fp8_refit_keeps_in_bf16_what_upstreams_engine_does(upstream_fp8, model_dir, monkeypatch, exclusions):
    # configure() takes the exclusions from vllm_cfg: the refit stream and the launcher's
    # after-first-refit layer check (engine_keep_rule) use this rule
    vllm_cfg = _vllm_cfg(False, exclusions)
    want = _upstream_bf16(upstream_fp8, model_dir, monkeypatch, vllm_cfg)
    run = {"policy": {"generation": {"vllm_cfg": vllm_cfg}}, "ais_fp8_refit": {"enabled": True, "num_layers": N_LAYERS}}
    refit_cfg = refit.configure(run, {}, section="ais_fp8_refit")
    assert {m for m in _linears() if refit_cfg.keep_rule().keeps(m)} == want


@pytest.mark.parametrize("ignore", [None, ["lm_head", "*self_attn*"]])
def test_offline_nvfp4_bf16_linears_are_upstreams_ignore_list(ignore):
    # the torch-free offline check keeps its own copy of NeMo-RL's default list
    utils = importlib.import_module("nemo_rl.modelopt.utils")
    assert NVFP4_DEFAULT_IGNORE == tuple(utils.DEFAULT_NVFP4_IGNORE)
    generation = {"real_quant": True, "vllm_cfg": {"precision": "bfloat16"}}
    if ignore is not None:
        generation["real_quant_ignore"] = ignore
    patterns = ignore if ignore is not None else list(utils.DEFAULT_NVFP4_IGNORE)
    bf16 = kept_in_bf16({"policy": {"generation": generation}}, N_LAYERS)
    # (MoE routers stay BF16 whatever the list says: vLLM builds them unquantized; rule 1 of
    # nemo_ais.rules.keep_bf16, tested in tests/unit/test_keep_bf16_agree.py)
    for name in [*_linears(), "lm_head"]:
        want = utils.matches_quant_ignore_pattern(name, patterns)
        assert bf16(name) == want, name


@pytest.mark.parametrize("armed", [False, True], ids=["nemo_rl_refit", "ais_fp8_refit"])
def test_the_launchers_first_refit_check_expects_upstreams_bf16_linears(upstream_fp8, model_dir, monkeypatch, armed):
    # launchers/run_grpo_ais.py engine_keep_rule: what every engine must hold after the first
    # refit (the AIS refit's rule when armed, else the offline one over the model's shapes)
    from shipped_configs import launcher

    exclusions = {"num_first_layers_in_bf16": 1, "quantization_ignored_layer_kws": ["o_proj"]}
    vllm_cfg = _vllm_cfg(False, exclusions)
    want = _upstream_bf16(upstream_fp8, model_dir, monkeypatch, vllm_cfg)
    raw = {"policy": {"model_name": str(model_dir), "generation": {"vllm_cfg": vllm_cfg}}}
    refit_cfg = None
    if armed:
        raw["ais_fp8_refit"] = {"enabled": True, "num_layers": N_LAYERS}
        refit_cfg = refit.configure(raw, {}, section="ais_fp8_refit")
    keeps = launcher().engine_keep_rule(raw, refit_cfg)
    assert {m for m in _linears() if keeps(m)} == want
    assert len(want) == 7 + (N_LAYERS - 1)  # layer 0 whole, o_proj of the other layers
