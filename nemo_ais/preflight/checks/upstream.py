# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What NeMo-RL's entry point and driver read unguarded, and its checkpoint rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_ais.preflight.checks.loss import NO_CORRECTION_HINT, setup_sees_importance_sampling
from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.loader import has

MASTER_CONFIG_SECTIONS = ("policy", "loss_fn", "env", "data", "grpo", "logger", "cluster", "checkpointing")
"""The sections NeMo-RL's GRPO ``MasterConfig`` requires (v0.7.0 and main)."""


def missing_sections(cfg: Mapping[str, Any]) -> list[str]:
    """The :data:`MASTER_CONFIG_SECTIONS` a full config lacks, in that order."""
    return [section for section in MASTER_CONFIG_SECTIONS if section not in cfg]


# Keys NeMo-RL v0.7.0 reads unguarded (``cfg["key"]``) between its entry point and the first checkpoint: (dotted key,
# who reads it, the flag that makes it read; None = always). A missing one is a KeyError after Ray has started
# (examples/run_grpo.py: policy.draft).
ENTRY_POINT_KEYS: tuple[tuple[str, str, str | None], ...] = (
    ("policy.draft.enabled", "examples/run_grpo.py main()", None),
    ("policy.tokenizer.name", "algorithms/utils.py get_tokenizer()", None),
    ("policy.generation.backend", "models/generation configure_generation_config()", None),
    ("policy.generation.stop_token_ids", "configure_generation_config()", None),
    ("policy.generation.stop_strings", "configure_generation_config()", None),
    ("policy.generation.colocated.enabled", "algorithms/grpo.py setup()", None),
    ("policy.generation.vllm_cfg.precision", "grpo.py setup()", None),
    ("policy.generation.vllm_cfg.kv_cache_dtype", "grpo.py setup()", None),
    ("policy.dtensor_cfg.enabled", "grpo.py setup() (FP8 KV cache)", None),
    ("policy.dynamic_batching.enabled", "models/policy/lm_policy.py Policy", None),
    ("policy.train_global_batch_size", "grpo.py setup()", None),
    ("grpo.seed", "grpo.py setup()", None),
    ("grpo.batch_multiplier", "grpo.py setup()", None),
    ("grpo.use_dynamic_sampling", "grpo.py setup()", None),
    ("grpo.val_period", "grpo.py setup()", None),
    ("grpo.val_batch_size", "grpo.py setup()", None),
    ("data.use_multiple_dataloader", "grpo.py setup(), examples/run_grpo.py main()", None),
    ("data.shuffle", "grpo.py setup()", None),
    ("data.num_workers", "grpo.py setup()", None),
    ("checkpointing.enabled", "examples/run_grpo.py main()", None),
    ("checkpointing.checkpoint_dir", "utils/checkpoint.py CheckpointManager", None),
    ("checkpointing.metric_name", "CheckpointManager", None),
    ("checkpointing.higher_is_better", "CheckpointManager", None),
    ("checkpointing.keep_top_k", "CheckpointManager", None),
    ("checkpointing.save_optimizer", "CheckpointManager", None),
    ("checkpointing.checkpoint_must_save_by", "grpo.py grpo_train()", None),
    ("logger.log_dir", "examples/run_grpo.py main()", None),
    ("logger.wandb", "utils/logger.py Logger", "logger.wandb_enabled"),
    ("logger.swanlab", "Logger", "logger.swanlab_enabled"),
    ("logger.tensorboard", "Logger", "logger.tensorboard_enabled"),
    ("logger.mlflow", "Logger", "logger.mlflow_enabled"),
    ("logger.gpu_monitoring.collection_interval", "Logger", "logger.monitor_gpus"),
    ("grpo.async_grpo.max_trajectory_age_steps", "examples/run_grpo.py main()", "grpo.async_grpo.enabled"),
    ("policy.dynamic_batching.train_mb_tokens", "Policy", "policy.dynamic_batching.enabled"),
    ("policy.dynamic_batching.sequence_length_round", "Policy", "policy.dynamic_batching.enabled"),
    ("policy.sequence_packing.train_mb_tokens", "Policy", "policy.sequence_packing.enabled"),
    ("policy.draft.loss_weight", "models/megatron/train.py", "policy.draft.enabled"),
)


@check("entry_point_keys")
def check_entry_point_keys(ctx: Context) -> Verdict:
    """Every key of :data:`ENTRY_POINT_KEYS` whose flag is on is present; no data plane."""
    problems = [
        f"{key} is missing: NeMo-RL v0.7.0 reads it unguarded ({reader}{f', with {flag}=true' if flag else ''}) and "
        f"stops with KeyError '{key.rsplit('.', 1)[-1]}' (add it; configs/nemo_rl/grpo_ais_base.yaml has every one)"
        for key, reader, flag in ENTRY_POINT_KEYS
        if (flag is None or ctx.get(flag, False)) and not has(ctx.cfg, key)
    ]
    if ctx.get("data_plane.enabled", False):
        problems.append(
            "data_plane.enabled=true (TransferQueue: TQPolicy + grpo_train_sync) is not supported by "
            "launchers/run_grpo_ais.py (every arm trains on the AIS worker); set data_plane.enabled=false"
        )
    return Verdict(problems, f"all {len(ENTRY_POINT_KEYS)} upstream lookups present")


@check("checkpointing")
def check_checkpointing(ctx: Context) -> Verdict:
    """A ``model_save_format`` only with DTensor v2 (else the first save raises)."""
    fmt = ctx.get("checkpointing.model_save_format")
    problems = []
    v2 = ctx.get("policy.dtensor_cfg._v2", False)
    if ctx.get("checkpointing.enabled", False) and fmt is not None and not v2:
        problems.append(
            f"checkpointing.model_save_format={fmt!r} is invalid without policy.dtensor_cfg._v2=true: expected null "
            "(NeMo-RL v0.7.0's Policy.save_checkpoint raises at the first save; the Megatron and DTensor v1 workers "
            "take no format, torch_save | safetensors are for DTensor v2)"
        )
    return Verdict(problems, f"model_save_format={fmt!r}")


# Options upstream's entry point (and ours) refuses with async GRPO: NotImplementedError after Ray started.
_ASYNC_UNSUPPORTED = (
    "grpo.use_dynamic_sampling",
    "grpo.reward_scaling.enabled",
    "grpo.reward_shaping.enabled",
    "data.use_multiple_dataloader",
)


@check("async_grpo")
def check_async_grpo(ctx: Context) -> Verdict | None:
    """Async GRPO: an async vLLM engine, a correction, none of the unsupported options."""
    if not ctx.get("grpo.async_grpo.enabled", False):
        return None
    backend = ctx.get("policy.generation.backend", "vllm")
    problems = []
    # async_grpo_train (v0.7.0, main) asserts an async engine: vLLM's `async_engine`; Megatron's differs by version.
    if backend == "vllm" and not ctx.get("policy.generation.vllm_cfg.async_engine", False):
        problems.append(
            "grpo.async_grpo.enabled=true needs policy.generation.vllm_cfg.async_engine=true (NeMo-RL's "
            "async_grpo_train asserts 'Async GRPO requires an async vLLM ... generation engine')"
        )
    elif backend not in ("vllm", "megatron"):
        problems.append(
            f"grpo.async_grpo.enabled=true with policy.generation.backend={backend!r}: "
            "expected vllm (NeMo-RL's async GRPO replay path does not take these rollouts)"
        )
    if not setup_sees_importance_sampling(ctx.cfg):
        problems.append(
            f"grpo.async_grpo.enabled=true needs an importance-sampling correction: {NO_CORRECTION_HINT} (NeMo-RL's "
            "async_grpo_train asserts 'Importance sampling correction must be enabled for async GRPO')"
        )
    problems += [
        f"{key}=true is not supported with grpo.async_grpo.enabled=true (NeMo-RL's entry "
        "point raises NotImplementedError after Ray started)"
        for key in _ASYNC_UNSUPPORTED
        if ctx.get(key, False) is True
    ]
    age = ctx.get("grpo.async_grpo.max_trajectory_age_steps")
    return Verdict(problems, f"backend={backend}, async engine, max_trajectory_age_steps={age}")
