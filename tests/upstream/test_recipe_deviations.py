# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Each full config matches its NeMo-RL v0.7.0 recipe except for listed, documented deviations.

Both sides are resolved by upstream's own ``nemo_rl.utils.config.load_config`` (the vendored
v0.7.0 source) and compared key by key. The configs follow v0.7.0's recipes; this file is
not marked ``nemo_rl`` and runs only in the v0.7.0 session (main's recipes moved on: the
configs follow them where main's ``MasterConfig`` requires it, :data:`_MAIN_REQUIRED`). A key that differs must be in the config's
deviation list below (or the list shared by every config), and every listed key must be
named in docs/cluster.md ("Deviations from upstream's recipes"), where the reason is given.
A listed key that no longer differs fails too, so the list cannot go stale.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from shipped_configs import CONFIG_DIR, flat

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "cluster.md"

# Ours -> the upstream recipe it follows (relative to NeMo-RL's examples/configs/).
UPSTREAM = {
    "grpo_ais_base.yaml": "grpo_math_1B_megatron.yaml",
    "smoke_qwen3_0.6b_1n.yaml": "grpo_math_1B_megatron.yaml",
    "qwen3_8b_2n8g_fp8.yaml": "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml",
    "qwen3_30b_a3b_2n8g_fp8_ep8.yaml": "grpo_math_qwen30ba3b_megatron.yaml",
    "llama3.1_8b_2n8g_fp8_pp2.yaml": ("recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e.yaml"),
}

# Deviations every config shares (set in grpo_ais_base.yaml).
COMMON = {
    "loss_fn.reference_policy_kl_penalty",
    "loss_fn.use_importance_sampling_correction",
    "checkpointing.enabled",
    "checkpointing.keep_top_k",
    "checkpointing.save_period",
    "checkpointing.model_save_format",
    "grpo.max_num_steps",
    "grpo.val_period",
    "grpo.val_at_end",
    "policy.tokenizer.chat_template_kwargs",
    "policy.tokenizer.chat_template_kwargs.enable_thinking",
    "policy.generation.vllm_cfg.use_tqdm",
}
_FP8_ROLLOUT = {
    "policy.generation.vllm_cfg.precision",
    "policy.generation.vllm_cfg.kv_cache_dtype",
    "policy.generation.vllm_cfg.use_deep_gemm",
}
_SMALL_RUN = {
    "policy.model_name",
    "policy.tokenizer.name",
    "grpo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "policy.train_global_batch_size",
    "policy.megatron_cfg.optimizer.lr",
    "policy.megatron_cfg.optimizer.min_lr",
    "policy.megatron_cfg.scheduler.lr_warmup_iters",
    "policy.megatron_cfg.scheduler.lr_warmup_init",
    "policy.generation.vllm_cfg.gpu_memory_utilization",
}
# The sequence-length budget and every key derived from it (the task's 4096 / the smoke's
# shorter budget, against the recipe's).
_SEQ_LEN = {
    "policy.max_total_sequence_length",
    "data.max_input_seq_length",
    "grpo.reward_shaping.max_response_length",
    "policy.generation.max_new_tokens",
    "policy.generation.vllm_cfg.max_model_len",
    "policy.sequence_packing.train_mb_tokens",
    "policy.sequence_packing.logprob_mb_tokens",
}
# Per config: the keys allowed (and required) to differ from its upstream recipe.
DEVIATIONS = {
    "grpo_ais_base.yaml": _FP8_ROLLOUT | _SMALL_RUN | _SEQ_LEN,
    "smoke_qwen3_0.6b_1n.yaml": _FP8_ROLLOUT | _SMALL_RUN | {"grpo.max_val_samples", "grpo.val_batch_size"},
    "qwen3_8b_2n8g_fp8.yaml": {
        "cluster.num_nodes",
        "policy.megatron_cfg.tensor_model_parallel_size",
        "policy.megatron_cfg.sequence_parallel",
        "policy.make_sequence_length_divisible_by",
        "policy.model_name",
        "policy.tokenizer.name",
        "data.train.dataset_name",
        "data.validation",
        "data.validation.dataset_name",
        "data.default.prompt_file",
        "env.math.math_verify_impl",
        "env.math.num_workers",
        "env.dapo.num_workers",
        "grpo.num_prompts_per_step",
        "grpo.num_generations_per_prompt",
    }
    | _SEQ_LEN,
    "qwen3_30b_a3b_2n8g_fp8_ep8.yaml": _FP8_ROLLOUT
    | {"cluster.num_nodes", "policy.generation.vllm_cfg.tensor_parallel_size", "grpo.num_generations_per_prompt"},
    "llama3.1_8b_2n8g_fp8_pp2.yaml": {
        "policy.megatron_cfg.fp8_cfg.enabled",
        "policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
        "policy.megatron_cfg.env_vars",
        "policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
        "grpo.num_generations_per_prompt",
    },
}
# The low-precision rollout-format arms (arms/nvfp4_w4a16, nvfp4_w4a4, mxfp8): NeMo-RL's
# own switches for the format, a BF16 KV cache, no DeepGEMM (docs/cluster.md).
_NVFP4_ROLLOUT = _FP8_ROLLOUT | {
    "policy.generation.quant_cfg",
    "policy.generation.real_quant",
    "policy.generation.real_quant_export_cpu_offload",
    "policy.generation.real_quant_ignore",
}
_QARL = _NVFP4_ROLLOUT | {"policy.quant_cfg", "loss_fn.token_level_loss"}  # TBPO: a mean over sequences
_MXFP8_ROLLOUT = {
    "policy.generation.vllm_cfg.is_mx",
    "policy.generation.vllm_cfg.kv_cache_dtype",
    "policy.generation.vllm_cfg.use_deep_gemm",
    "policy.generation.vllm_cfg.pow2_weight_scaling_factors",
    "policy.generation.vllm_cfg.pow2_activation_scaling_factors",
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
}
# The comparison arms: their model config's deviations; the BF16 arm also the rollout's.
EXPERIMENTS = {
    f"experiments/{model}_{arm}.yaml": (base, _FP8_ROLLOUT if arm == "bf16" else set())
    for model, base in (("qwen3_8b", "qwen3_8b_2n8g_fp8.yaml"), ("smoke", "smoke_qwen3_0.6b_1n.yaml"))
    for arm in ("bf16", "fp8_none", "fp8_tis", "fp8_ais")
}
EXPERIMENTS |= {
    "experiments/qwen3_8b_nvfp4_w4a16_ais.yaml": ("qwen3_8b_2n8g_fp8.yaml", _NVFP4_ROLLOUT),
    "experiments/qwen3_8b_nvfp4_w4a4_ais.yaml": ("qwen3_8b_2n8g_fp8.yaml", _NVFP4_ROLLOUT),
    "experiments/qwen3_8b_mxfp8_ais.yaml": ("qwen3_8b_2n8g_fp8.yaml", _MXFP8_ROLLOUT),
    # QARL (arms/qarl_tbpo): NeMo-RL's ModelOpt QAT trainer on the W4A16 rollout's recipe
    "experiments/qwen3_8b_nvfp4_qarl_tbpo.yaml": ("qwen3_8b_2n8g_fp8.yaml", _QARL),
}

# Sections that do nothing in these configs (their feature is off or not ours).
_INERT_PREFIXES = (
    "logger.",  # names and output paths only
    "checkpointing.checkpoint_dir",
    "loss_fn.ais.",  # ours; upstream has no such section
    "loss_fn.ais_alarms.",  # ours (the refit guard; logs metrics, fail_on_alarm off)
    "ais_fp8_refit.",  # ours (the FP8 refit through nemo_ais's quantizer)
    "ais_nvfp4_refit.",  # ours (the NVFP4 refit of a BF16 trainer's weights)
    "policy.dtensor_cfg.",  # DTensor backend off on both sides (enabled is compared)
    "policy.optimizer",  # DTensor optimizer / scheduler: null with Megatron
    "policy.scheduler",
    "policy.generation.mcore_generation_config.",  # Megatron generation backend unused
    "policy.generation_batch_size",  # read only by the Megatron generation backend
    "policy.megatron_cfg.peft.",  # PEFT off on both sides (enabled is compared)
    "policy.dynamic_batching.",  # off on both sides (enabled is compared)
    "policy.router_replay.",  # absent == disabled (router_replay_enabled() reads it guarded)
    "data_plane.",  # absent == upstream's default, disabled
    "on_policy_distillation",
)
# Keys ours sets to the value upstream's code uses when the key is absent.
_ABSENT_DEFAULTS = {
    "policy.generation.vllm_cfg.pow2_weight_scaling_factors": False,  # fp8.py .get(.., False)
    "policy.generation.vllm_cfg.pow2_activation_scaling_factors": False,
}
_ABSENT = "<absent>"
# Keys NeMo-RL main's MasterConfig requires and v0.7.0's recipes lack (v0.7.0 never reads
# them): ours -> the training key main's recipes interpolate it from (``${.temperature}``).
_MAIN_REQUIRED = {
    "policy.generation.val_temperature": "policy.generation.temperature",
    "policy.generation.val_top_p": "policy.generation.top_p",
    "policy.generation.val_top_k": "policy.generation.top_k",
}
MAIN_RECIPE = REPO.parent / "shared" / "vendor" / "nemo-rl-main-7ea279a" / "examples" / "configs"


@functools.cache
def _resolved(path: str) -> dict[str, object]:
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers

    register_omegaconf_resolvers()
    return flat(OmegaConf.to_container(load_config(path), resolve=True))


def _upstream_path(recipe: str) -> str:
    import nemo_rl

    return str(Path(nemo_rl.__file__).resolve().parents[1] / "examples" / "configs" / recipe)


def _differing(ours: str, recipe: str) -> dict[str, tuple[object, object]]:
    a, b = _resolved(str(CONFIG_DIR / ours)), _resolved(_upstream_path(recipe))
    out = {}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if va == vb or key.startswith(_INERT_PREFIXES):
            continue
        if vb == _ABSENT and key in _ABSENT_DEFAULTS and va == _ABSENT_DEFAULTS[key]:
            continue
        if vb == _ABSENT and key in _MAIN_REQUIRED and va == a[_MAIN_REQUIRED[key]]:
            continue
        out[key] = (va, vb)
    return out


def _unlisted(diff: dict[str, tuple[object, object]], allowed: set[str]) -> list[str]:
    return [f"{k}: ours={v[0]!r} upstream={v[1]!r}" for k, v in diff.items() if k not in allowed]


@pytest.mark.parametrize("config", sorted(UPSTREAM))
def test_config_matches_its_upstream_recipe_except_listed_deviations(config):
    diff = _differing(config, UPSTREAM[config])
    unlisted = _unlisted(diff, COMMON | DEVIATIONS[config])
    assert not unlisted, (
        f"{config} deviates from {UPSTREAM[config]} in keys that are neither listed nor "
        "justified (match upstream, or list the key here and justify it in docs/cluster.md "
        "and the config's header):\n  " + "\n  ".join(unlisted)
    )
    stale = sorted(DEVIATIONS[config] - set(diff))
    assert not stale, f"{config}: listed deviations that now match upstream: {stale}"


@pytest.mark.parametrize("config", sorted(EXPERIMENTS))
def test_arm_configs_deviate_only_where_their_model_config_and_arm_do(config):
    base, arm_keys = EXPERIMENTS[config]
    diff = _differing(config, UPSTREAM[base])
    unlisted = _unlisted(diff, COMMON | DEVIATIONS[base] | arm_keys)
    assert not unlisted, f"{config}:\n  " + "\n  ".join(unlisted)


def test_the_keys_main_requires_are_what_mains_recipes_set():
    # main's grpo_math_1B.yaml: ``val_temperature: ${.temperature}`` etc. (its generation block)
    text = (MAIN_RECIPE / "grpo_math_1B.yaml").read_text()
    for key, train_key in _MAIN_REQUIRED.items():
        leaf, train_leaf = key.rsplit(".", 1)[1], train_key.rsplit(".", 1)[1]
        assert f"{leaf}: ${{.{train_leaf}}}" in text, leaf
    base = _resolved(str(CONFIG_DIR / "grpo_ais_base.yaml"))
    assert {k: base[k] for k in _MAIN_REQUIRED} == {k: base[v] for k, v in _MAIN_REQUIRED.items()}


def test_every_full_config_is_compared():
    from nemo_ais import preflight as cc

    full = {str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml") if not cc.is_mixin(cc.load_config(p))}
    assert full == set(UPSTREAM) | set(EXPERIMENTS)


def test_every_deviation_is_justified_in_the_docs():
    text = DOCS.read_text()
    section = text[text.index("## Deviations from upstream's recipes") :]
    named = COMMON.union(*DEVIATIONS.values(), _NVFP4_ROLLOUT, _QARL, _MXFP8_ROLLOUT)
    missing = sorted(k for k in named if f"`{k}`" not in section)
    assert not missing, f"docs/cluster.md does not name (and justify) these deviations: {missing}"
    for recipe in set(UPSTREAM.values()):
        assert recipe in section, recipe
