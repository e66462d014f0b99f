# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The sections of the embedded recipe's YAML (``nemo-ais run``), one pydantic model each.

Every model forbids unknown keys; :mod:`nemo_ais.embedded.config` validates a config with them (``loss_fn`` is
:class:`~nemo_ais.config.PGLossConfig` plus ``ais:`` :class:`~nemo_ais.config.CorrectionConfig`). The defaults are those
of ``default.yaml`` (tests/unit/test_embedded_config.py).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_ais.refit.config import RENAMED_KEYS
from nemo_ais.rollout.config import MIN_TEMPERATURE, KVCacheFormat, RolloutFormat, RolloutPrecisionConfig
from nemo_ais.sections import validate_section

DEFAULT_QUANTIZER: dict[str, Any] = {"block": [128, 128], "activation_group": 128, "ue8m0": False}
DEFAULT_ARMS: dict[str, dict[str, Any]] = {
    "bf16": {"rollout": {"format": "bf16", "kv_cache": "bf16"}, "loss_fn": {"ais": {"mode": "none"}}},
    "fp8-none": {"loss_fn": {"ais": {"mode": "none"}}},
    "fp8-tis": {"loss_fn": {"ais": {"mode": "tis"}}},
    "fp8-ais": {"loss_fn": {"ais": {"mode": "ais"}}},
}
# rollout.<key> that RolloutPrecisionConfig takes as is (the rest comes from rollout.quantizer)
PRECISION_KEYS = (
    "format",
    "kv_cache",
    "num_first_layers_in_bf16",
    "num_last_layers_in_bf16",
    "attention_in_bf16",
    "keep_patterns",
    "error_scale",
)
_PRECISION = RolloutPrecisionConfig.model_fields


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class GRPOSection(_Section):
    """``grpo``: one step = ``num_prompts_per_step`` prompts x ``num_generations_per_prompt``."""

    num_prompts_per_step: int = Field(8, ge=1, description="Prompts per step (NeMo-RL key).")
    num_generations_per_prompt: int = Field(
        8, ge=2, description="G samples per prompt; the group baseline needs G >= 2."
    )
    max_num_steps: int = Field(60, ge=1, description="GRPO steps per (arm, seed) run.")
    normalize_rewards: bool = Field(True, description="Divide group-centred rewards by the group std (NeMo-RL key).")
    use_leave_one_out_baseline: bool = Field(
        False, description="Baseline and std of the OTHER G-1 rewards (NeMo-RL key)."
    )
    advantage_std_eps: float = Field(
        1e-6, gt=0.0, description="A = (r - b) / (std + eps); A = r - b where std = 0 (equal rewards: 0)."
    )
    val_period: int = Field(10, ge=0, description="Held-out evaluation every N steps (0: only at start and end).")


class ModelSection(_Section):
    """``policy.model``: the tiny ``Qwen2Config`` (random init, fp32)."""

    hidden_size: int = Field(256, ge=8, description="Multiple of 128 keeps FP8 blocks real.")
    intermediate_size: int = Field(512, ge=8, description="MLP width.")
    num_hidden_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(4, ge=1, description="KV heads (GQA if fewer).")
    init_seed: int = Field(0, ge=0, description="Seed of the random initialisation.")

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSection:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_attention_heads={self.num_attention_heads}"
            )
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim % 2:  # rotary embeddings rotate pairs of channels
            raise ValueError(
                f"hidden_size={self.hidden_size} / num_attention_heads={self.num_attention_heads} = {head_dim} is "
                "invalid: expected an even head dim (rotary embeddings)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        return self


class OptimizerSection(_Section):
    """``policy.optimizer``: AdamW."""

    lr: float = Field(3e-5, gt=0.0, description="GRPO AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0.0, description="Adam epsilon.")

    @field_validator("betas")
    @classmethod
    def _check_betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError("expected two values in [0, 1)")
        return betas


class CurriculumSection(_Section):
    """``policy.warm_start.curriculum``: a first SFT stage on shorter chains."""

    chain_length: int = Field(..., ge=1, description="Values per chain of the first stage (< data.chain_length).")
    steps: int = Field(..., ge=1, description="SFT steps of the first stage.")


class WarmStartSection(_Section):
    """``policy.warm_start``: supervised fine-tuning before GRPO, cached by config hash."""

    steps: int = Field(1000, ge=0, description="SFT steps (0: GRPO starts from random init).")
    batch_size: int = Field(128, ge=1, description="SFT problems per step.")
    lr: float = Field(1e-3, gt=0.0, description="SFT AdamW peak learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear learning-rate warmup steps (then constant).")
    seed: int = Field(0, ge=0, description="Seed of the SFT problem stream.")
    num_threads: int = Field(
        2,
        ge=1,
        description="torch threads of the warm start (one process, before the DP ranks "
        "start); part of the cache key, since fp32 sums depend on the thread count.",
    )
    cache_dir: str = Field("runs/.cache", description="Where warmstart-<hash>.pt is cached (shared by runs).")
    curriculum: CurriculumSection | None = Field(
        None,
        description="task chain: first the warm start of the same config on chains of "
        "curriculum.chain_length values for curriculum.steps steps (cached as its own), then "
        "`steps` more on data.chain_length (the 33-value chain is not learned from scratch: "
        "docs/results.md); null: one stage from the untrained policy.",
    )


class PolicySection(_Section):
    """``policy``: model, optimizer and batch sizes (NeMo-RL key names)."""

    model: ModelSection = Field(default_factory=ModelSection, description="Model shape.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="AdamW.")
    warm_start: WarmStartSection = Field(default_factory=WarmStartSection, description="Supervised warm start.")
    train_global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step; must divide the rollout batch "
        "(None: the whole rollout batch, one optimizer step per GRPO step).",
    )
    train_micro_batch_size: int = Field(32, ge=1, description="Samples per forward/backward on one rank.")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm (None: no clipping).")
    rollout_aligned_quantization: bool = Field(
        False,
        description="QaRL [reconstruction]: the trainer's forward runs the rollout format's "
        "fake quantization (weights, activations, KV cache) with a straight-through backward, "
        "so pi_old and pi_theta come from the rollout's arithmetic (nemo_ais.embedded.aligned).",
    )


class RolloutSection(_Section):
    """``rollout``: the simulated rollout engine (the twin): sampling and precision."""

    temperature: float = Field(
        1.0, ge=MIN_TEMPERATURE, description=f"Sampling temperature (>= {MIN_TEMPERATURE:g}, vLLM's sampling epsilon)."
    )
    top_k: int = Field(0, ge=0, description="Top-k filter (0: off).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Top-p filter (1: off).")
    prompts_per_chunk: int = Field(
        4,
        ge=1,
        description="Prompts per generate() call; each chunk has its own RNG stream, so "
        "results do not depend on the DP world size.",
    )
    # format and the BF16 exclusions are RolloutPrecisionConfig's fields (its kv_cache: bf16)
    format: RolloutFormat = _PRECISION["format"]
    kv_cache: KVCacheFormat = Field("fp8", description="KV cache of the rollout engine: bf16, fp8 (E4M3) or nvfp4.")
    num_first_layers_in_bf16: int = _PRECISION["num_first_layers_in_bf16"]
    num_last_layers_in_bf16: int = _PRECISION["num_last_layers_in_bf16"]
    attention_in_bf16: bool = _PRECISION["attention_in_bf16"]
    keep_patterns: tuple[str, ...] = _PRECISION["keep_patterns"]
    error_scale: float = _PRECISION["error_scale"]
    quantizer: dict[str, Any] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_QUANTIZER),
        description="The format's other knobs: RolloutPrecisionConfig fields (block, "
        "activation_group, ue8m0, KV calibration, ...), validated there.",
    )


class DataSection(_Section):
    """``data``: the verifiable arithmetic task (:mod:`nemo_ais.embedded.task`)."""

    task: Literal["chain", "addition"] = Field(
        "chain",
        description="chain: running sums mod 10^num_digits, chain_length values written "
        "(long responses); addition: a+b (3-4 response tokens).",
    )
    num_digits: int = Field(2, ge=1, le=6, description="Digits per operand.")
    chain_length: int = Field(
        11,
        ge=1,
        le=64,
        description="task=chain: values in the written chain; the response-length knob: a "
        "correct response is chain_length * (num_digits + 1) tokens, <eos> included "
        "(11 -> 33, 33 -> 99).",
    )
    sft_alt_fraction: float = Field(
        0.7,
        ge=0.0,
        lt=1.0,
        description="task=chain: share of warm-start demonstrations that close the chain "
        "with a stray '=' (a form the verifier rejects); GRPO has to unlearn it.",
    )
    reverse_answer: bool = Field(True, description="Write the sum least-significant digit first (easier to learn).")
    reward: Literal["steps", "prefix", "digits", "exact"] = Field(
        "exact",
        description="steps (task=chain): share of values computed right from the value "
        "written before them; prefix: share of steps right before the first mistake; "
        "digits: per-position credit; exact: exact match. All are 1 iff exact.",
    )
    eval_size: int = Field(256, ge=1, description="Held-out evaluation problems.")
    eval_seed: int = Field(1234, ge=0, description="Seed of the held-out set.")

    @model_validator(mode="after")
    def _check_task_keys(self) -> DataSection:
        if self.task != "chain" and self.sft_alt_fraction > 0:
            raise ValueError(
                f"sft_alt_fraction={self.sft_alt_fraction} applies to task=chain only: expected 0 for task={self.task}"
            )
        if self.task != "chain" and self.reward == "steps":
            raise ValueError(
                f"reward='steps' applies to task=chain only: expected 'prefix', 'digits' or "
                f"'exact' for task={self.task}"
            )
        return self


class LoggerSection(_Section):
    """``logger``: where outputs go."""

    run_dir: str = Field("runs", description="Parent directory of runs.")
    name: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Run name: outputs go to run_dir/name (letters, digits, _ . -; not . or ..).",
    )
    progress_bar: bool = Field(True, description="Show tqdm progress bars.")
    plots: bool = Field(True, description="Write PNG plots and summary.md at the end.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name in (".", ".."):  # --overwrite clears run_dir/name: never the directory itself or its parent
            raise ValueError("expected a directory name, not . or ..")
        return name


class CheckpointingSection(_Section):
    """``checkpointing``: atomic per-(arm, seed) checkpoints for resume."""

    enabled: bool = Field(True, description="Write checkpoints (needed to resume).")
    save_period: int = Field(10, ge=1, description="Checkpoint every N steps (and at the end).")


class ClusterSection(_Section):
    """``cluster``: the data-parallel trainer processes (gloo on 127.0.0.1)."""

    dp_size: int = Field(2, ge=1, description="Trainer processes (1: run in this process).")
    num_threads_per_rank: int = Field(1, ge=1, description="torch intra-op threads per rank.")
    timeout_s: float = Field(600.0, gt=0.0, le=1e6, description="gloo collective timeout (at most 1e6 s).")


_SHARED_BY_ARMS = (
    *(f"data.{key}" for key in DataSection.model_fields if key != "reward"),
    "policy.model",
    "policy.warm_start",
    "cluster",
    "logger",
)
"""What one run trains every arm with (one task and held-out set, one warm start, one launch): an arm may not set it.

An arm's own ``data.reward`` is allowed: it only scores that arm's rollouts."""


def _overridden(override: dict[str, Any], key: str, prefix: str = "") -> str | None:
    """The path at which ``override`` sets ``key`` (a section it replaces by a non-mapping, e.g. ``data: null``)."""
    head, _, rest = key.partition(".")
    if head not in override:
        return None
    path = prefix + head
    if not rest or not isinstance(override[head], dict):
        return path
    return _overridden(override[head], rest, path + ".")


class ExperimentSection(_Section):
    """``experiment``: every arm runs with every seed; an arm is a config override."""

    seeds: list[int] = Field([0, 1], min_length=1, description="Seeds of the runs.")
    arms: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_ARMS),
        description="Arm name -> nested override of this config (default: the four arms of default.yaml).",
    )
    include: list[str] | None = Field(None, description="Arms to run (None: all, in order).")
    reference_arm: str = Field("bf16", description="Arm the others are compared with, seed by seed, in summary.md.")

    @model_validator(mode="after")
    def _check_arms(self) -> ExperimentSection:
        if not self.arms:
            raise ValueError("arms is empty: expected at least one arm (e.g. bf16: {})")
        for name, override in self.arms.items():
            if "experiment" in (override or {}):
                raise ValueError(f"arms.{name} must not override the experiment section")
            shared = [path for key in _SHARED_BY_ARMS if (path := _overridden(override or {}, key))]
            if shared:
                raise ValueError(
                    f"arms.{name}.{shared[0]} is invalid: every arm shares the task and held-out set, the model, "
                    "its warm start, the ranks and the run directory (data.* but data.reward, policy.model, "
                    "policy.warm_start, cluster, logger); expected it at the top level of the config"
                )
        unknown = [a for a in self.include or [] if a not in self.arms]
        if unknown:
            raise ValueError(f"include={unknown} names unknown arms (known: {list(self.arms)})")
        if self.reference_arm not in self.arms:
            raise ValueError(f"reference_arm={self.reference_arm!r} is not an arm (known: {list(self.arms)})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} has duplicates")
        return self

    @property
    def arm_names(self) -> list[str]:
        """Arms to run, in order."""
        return list(self.include) if self.include is not None else list(self.arms)


SECTION_MODELS: dict[str, type[BaseModel]] = {
    "grpo": GRPOSection,
    "policy": PolicySection,
    "rollout": RolloutSection,
    "data": DataSection,
    "logger": LoggerSection,
    "checkpointing": CheckpointingSection,
    "cluster": ClusterSection,
    "experiment": ExperimentSection,
}
NESTED_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("policy", "model"): ModelSection,
    ("policy", "optimizer"): OptimizerSection,
    ("policy", "warm_start"): WarmStartSection,
}


def rollout_precision(rollout: RolloutSection) -> RolloutPrecisionConfig:
    """The twin's :class:`RolloutPrecisionConfig` of a validated ``rollout`` section.

    ``ValueError`` (named by its path) for an unknown, misplaced, renamed or invalid key.
    """
    knobs = tuple(k for k in RolloutPrecisionConfig.model_fields if k not in PRECISION_KEYS)
    for key in rollout.quantizer:
        if key in PRECISION_KEYS:
            raise ValueError(
                f"rollout.quantizer.{key} is invalid: {key} is set at rollout.{key}, not in rollout.quantizer"
            )
        if key not in knobs and key not in RENAMED_KEYS:  # renamed: refused by the config
            raise ValueError(f"rollout.quantizer.{key} is not a known field (allowed: {', '.join(knobs)})")
    validate_section(RolloutPrecisionConfig, rollout.quantizer, "rollout.quantizer")
    return validate_section(
        RolloutPrecisionConfig, {**rollout.quantizer, **rollout.model_dump(include=set(PRECISION_KEYS))}, "rollout"
    )
