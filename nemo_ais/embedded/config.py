# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Validated configuration of the embedded recipe (``nemo-ais run``).

The YAML (a shipped preset ``nemo_ais/embedded/presets/*.yaml``, package data, or a user
file) uses NeMo-RL-style sections; each is validated by a pydantic model with
``extra="forbid"``, so an unknown or malformed key fails with a ``ValueError`` naming its full path (``grpo.num_prompts_per_step=0 is invalid: ...``):

============== ============================================================================
section        model
============== ============================================================================
grpo           :class:`GRPOSection` (prompts x generations per step, steps, advantages)
loss_fn        :class:`~nemo_ais.config.PGLossConfig` (clipped surrogate) plus ``ais:``
               validated by :class:`~nemo_ais.config.CorrectionConfig`
policy         :class:`PolicySection` (tiny Qwen2, optimizer, batch sizes, warm start)
rollout        :class:`RolloutSection` (sampling; the rollout ``format``, ``kv_cache`` and
               BF16 exclusions; ``quantizer:`` the format's other knobs), mapped onto
               :class:`~nemo_ais.rollout.config.RolloutPrecisionConfig`
data           :class:`DataSection` (the arithmetic task)
logger         :class:`LoggerSection` (run directory, progress bar, plots)
checkpointing  :class:`CheckpointingSection`
cluster        :class:`ClusterSection` (data-parallel world size, threads)
experiment     :class:`ExperimentSection` (seeds and arms; an arm is a config override)
============== ============================================================================

:func:`load_config` reads a YAML file (``defaults:`` inheritance), applies dotted
``key=value`` overrides (OmegaConf) and returns the plain dict; :func:`resolve_arm` merges
one arm's override and validates the result into a :class:`RecipeConfig`.

The former ``rollout.fp8:`` block (``enabled``, ``kv_cache_fp8`` and the
``Fp8RolloutConfig`` knobs) is deprecated and still read, with a ``FutureWarning``: it is
folded into the current keys before validation (:func:`migrate_rollout`), so an old
config or an old run directory's pinned ``config.yaml`` means what it meant:

* ``enabled: false`` -> ``format: bf16``, ``kv_cache: bf16`` (``compute_dtype`` dropped:
  the exact BF16 arm); ``enabled: true`` changes nothing (the format already quantizes);
* ``kv_cache_fp8: true`` / ``false`` -> ``kv_cache: fp8`` / ``bf16``, on an arm whose
  format quantizes (it never applied with ``enabled: false``);
* ``format``, ``kv_cache`` and the exclusion keys -> ``rollout.<key>``; every other key
  -> ``rollout.quantizer.<key>``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_ais.config import (
    CorrectionConfig,
    PGLossConfig,
    surrogate_conflicts,
    validate_section,
)
from nemo_ais.rollout.config import KVCacheFormat, RolloutFormat, RolloutPrecisionConfig

__all__ = [
    "CONFIG_DIR",
    "RecipeConfig",
    "config_hash",
    "load_config",
    "migrate_config",
    "migrate_rollout",
    "resolve_arm",
    "validate_config",
]

# The shipped presets are package data (pyproject.toml), so a wheel install finds them.
CONFIG_DIR = Path(str(resources.files("nemo_ais.embedded") / "presets"))
SECTIONS = (
    "grpo",
    "loss_fn",
    "policy",
    "rollout",
    "data",
    "logger",
    "checkpointing",
    "cluster",
    "experiment",
)


# The defaults below are those of default.yaml, the file `nemo-ais run` runs: a config that
# leaves a key out gets what default.yaml states (tests/unit/test_embedded_config.py).
DEFAULT_QUANTIZER: dict[str, Any] = {
    "weight_block": [128, 128],
    "activation_group": 128,
    "ue8m0": False,
}
DEFAULT_ARMS: dict[str, dict[str, Any]] = {
    "bf16": {
        "rollout": {"format": "bf16", "kv_cache": "bf16"},
        "loss_fn": {"ais": {"mode": "none"}},
    },
    "fp8-none": {"loss_fn": {"ais": {"mode": "none"}}},
    "fp8-tis": {"loss_fn": {"ais": {"mode": "tis"}}},
    "fp8-ais": {"loss_fn": {"ais": {"mode": "ais"}}},
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class GRPOSection(_Section):
    """``grpo``: one step = ``num_prompts_per_step`` prompts x ``num_generations_per_prompt``."""

    num_prompts_per_step: int = Field(8, ge=1, description="Prompts per step (NeMo-RL key).")
    num_generations_per_prompt: int = Field(
        8, ge=2, description="G samples per prompt; the group baseline needs G >= 2."
    )
    max_num_steps: int = Field(60, ge=1, description="GRPO steps per (arm, seed) run.")
    normalize_rewards: bool = Field(
        True, description="Divide group-centred rewards by the group std (NeMo-RL key)."
    )
    use_leave_one_out_baseline: bool = Field(
        False, description="Baseline = mean of the OTHER G-1 rewards (NeMo-RL key)."
    )
    advantage_std_eps: float = Field(
        1e-6, gt=0.0, description="A = (r - mean) / (std + eps); a zero-std group gets A = 0."
    )
    val_period: int = Field(
        10, ge=0, description="Held-out evaluation every N steps (0: only at start and end)."
    )


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
                f"hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        return self


class OptimizerSection(_Section):
    """``policy.optimizer``: AdamW."""

    lr: float = Field(1e-4, gt=0.0, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    eps: float = Field(1e-8, gt=0.0, description="Adam epsilon.")


class WarmStartSection(_Section):
    """``policy.warm_start``: supervised fine-tuning before GRPO, cached by config hash."""

    steps: int = Field(550, ge=0, description="SFT steps (0: GRPO starts from random init).")
    batch_size: int = Field(128, ge=1, description="SFT problems per step.")
    lr: float = Field(1e-3, gt=0.0, description="SFT AdamW peak learning rate.")
    warmup_steps: int = Field(
        20, ge=0, description="Linear learning-rate warmup steps (then constant)."
    )
    seed: int = Field(0, ge=0, description="Seed of the SFT problem stream.")
    num_threads: int = Field(
        2,
        ge=1,
        description="torch threads of the warm start (one process, before the DP ranks "
        "start); part of the cache key, since fp32 sums depend on the thread count.",
    )
    cache_dir: str = Field(
        "runs/.cache", description="Where warmstart-<hash>.pt is cached (shared by runs)."
    )


class PolicySection(_Section):
    """``policy``: model, optimizer and batch sizes (NeMo-RL key names)."""

    model: ModelSection = Field(default_factory=ModelSection, description="Model shape.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="AdamW.")
    warm_start: WarmStartSection = Field(
        default_factory=WarmStartSection, description="Supervised warm start."
    )
    train_global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step; must divide the rollout batch "
        "(None: the whole rollout batch, one optimizer step per GRPO step).",
    )
    train_micro_batch_size: int = Field(
        32, ge=1, description="Samples per forward/backward on one rank."
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0.0, description="Clip the global gradient norm (None: no clipping)."
    )
    rollout_aligned_quantization: bool = Field(
        False,
        description="QaRL [reconstruction]: the trainer's forward runs the rollout format's "
        "fake quantization (weights, activations, KV cache) with a straight-through backward, "
        "so pi_old and pi_theta come from the rollout's arithmetic (nemo_ais.embedded.aligned).",
    )


class RolloutSection(_Section):
    """``rollout``: the simulated rollout engine (the twin): sampling and precision."""

    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_k: int = Field(0, ge=0, description="Top-k filter (0: off).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Top-p filter (1: off).")
    prompts_per_chunk: int = Field(
        4,
        ge=1,
        description="Prompts per generate() call; each chunk has its own RNG stream, so "
        "results do not depend on the DP world size.",
    )
    format: RolloutFormat = Field(
        "fp8",
        description="Linear layers of the rollout engine: bf16 (no quantization), fp8 (W8A8 "
        "blockwise), mxfp8, nvfp4_w4a16 (NVFP4 weights) or nvfp4_w4a4 (+ NVFP4 activations).",
    )
    kv_cache: KVCacheFormat = Field(
        "fp8", description="KV cache of the rollout engine: bf16, fp8 (E4M3) or nvfp4."
    )
    num_first_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the first N decoder layers unquantized (NeMo-RL key)."
    )
    num_last_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the last N decoder layers unquantized (NeMo-RL key)."
    )
    attention_in_bf16: bool = Field(
        False, description="Keep q/k/v/o_proj unquantized (the KV cache format still applies)."
    )
    keep_patterns: tuple[str, ...] = Field(
        (), description="Regexes of further linears kept unquantized (re.search on the name)."
    )
    quantizer: dict[str, Any] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_QUANTIZER),
        description="The format's other knobs: RolloutPrecisionConfig fields (weight_block, "
        "activation_group, ue8m0, KV calibration, ...), validated there.",
    )


# rollout.<key> that RolloutPrecisionConfig takes as is (the rest comes from rollout.quantizer)
_PRECISION_KEYS = (
    "format",
    "kv_cache",
    "num_first_layers_in_bf16",
    "num_last_layers_in_bf16",
    "attention_in_bf16",
    "keep_patterns",
)
_FORMER_FP8_KEYS = ("enabled", "kv_cache_fp8")
_FP8_BLOCK_DEPRECATED = (
    "rollout.fp8 (the former FP8 rollout block) is deprecated and will be removed: write "
    "rollout.format (enabled: false -> format: bf16 with kv_cache: bf16), rollout.kv_cache "
    "(kv_cache_fp8: true -> fp8), the exclusion keys under rollout, and the format's knobs "
    "under rollout.quantizer (docs/embedded.md)"
)


def migrate_rollout(rollout: dict[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """``rollout`` with its deprecated ``fp8:`` block folded into the current keys (module doc).

    Args:
        rollout: a raw ``rollout`` section (an arm's merged one); not modified.
        warn: emit the ``FutureWarning`` when there is a block to fold.

    Returns:
        A new dict without ``fp8`` (``rollout`` itself, copied, if it has none).

    Raises:
        ValueError: the block is not a mapping, has an unknown key, a former key that is
            not a bool, or mixes a former key with ``format`` / ``kv_cache`` (named).
    """
    out = copy.deepcopy(rollout)
    block = out.pop("fp8", None)
    if block is None:
        return out
    if not isinstance(block, dict):
        raise ValueError(f"rollout.fp8: expected a mapping, got {type(block).__name__}")
    allowed = (*_FORMER_FP8_KEYS, *RolloutPrecisionConfig.model_fields)
    unknown = [k for k in block if k not in allowed]
    if unknown:
        raise ValueError(
            f"rollout.fp8.{unknown[0]} is not a known field (allowed: {', '.join(allowed)})"
        )
    former = {k: block[k] for k in _FORMER_FP8_KEYS if k in block}
    for key, value in former.items():
        if not isinstance(value, bool):
            raise ValueError(f"rollout.fp8.{key}={value!r} is invalid: expected true or false")
    mixed = sorted({"format", "kv_cache"} & block.keys())
    if former and mixed:
        raise ValueError(
            f"rollout.fp8.{' and '.join(sorted(former))} (former keys) cannot be combined with "
            f"rollout.fp8.{' and '.join(mixed)}: write rollout.format / rollout.kv_cache alone"
        )
    if warn:
        warnings.warn(_FP8_BLOCK_DEPRECATED, FutureWarning, stacklevel=3)
    # keys left unset mean what they meant under the block: Fp8RolloutConfig's defaults
    quantizer = {**copy.deepcopy(DEFAULT_QUANTIZER), **(out.get("quantizer") or {})}
    for key, field in RolloutSection.model_fields.items():
        if key in _PRECISION_KEYS and key not in out:
            former_default = {"format": "fp8", "kv_cache": "bf16", "keep_patterns": []}
            out[key] = former_default.get(key, field.get_default())
    for key, value in block.items():
        if key in _PRECISION_KEYS:
            out[key] = value
        elif key not in _FORMER_FP8_KEYS:
            quantizer[key] = value
    if former.get("enabled") is False:
        out.update(format="bf16", kv_cache="bf16")
        if "compute_dtype" in quantizer:
            quantizer["compute_dtype"] = None
    elif "kv_cache_fp8" in former and out["format"] != "bf16":
        out["kv_cache"] = "fp8" if former["kv_cache_fp8"] else "bf16"
    out["quantizer"] = quantizer
    return out


def _has_fp8_block(section: Any) -> bool:
    return isinstance(section, dict) and "fp8" in section


def migrate_config(data: dict[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """``data`` with every deprecated ``rollout.fp8`` block folded in: top level and arms.

    An arm's ``rollout.fp8`` override becomes the current keys in which the arm's migrated
    ``rollout`` differs from the migrated top level, so :func:`resolve_arm` gives the same
    validated config for ``data`` and for the result (tested). Used by :func:`load_config`
    and to compare an old run directory's pinned config with a new one.

    Args:
        data: a raw config (not modified).
        warn: emit the ``FutureWarning`` (once) when there is a block to fold.

    Raises:
        ValueError: as :func:`migrate_rollout`, for the first offending block.
    """
    base = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    arms = (
        data.get("experiment", {}).get("arms") if isinstance(data.get("experiment"), dict) else None
    )
    arms = arms if isinstance(arms, dict) else {}
    legacy = [
        a for a, o in arms.items() if isinstance(o, dict) and _has_fp8_block(o.get("rollout"))
    ]
    if not _has_fp8_block(base) and not legacy:
        return data
    if warn:
        warnings.warn(_FP8_BLOCK_DEPRECATED, FutureWarning, stacklevel=2)
    out = copy.deepcopy(data)
    new_base = migrate_rollout(base, warn=False)
    if "rollout" in out:
        out["rollout"] = new_base
    for arm in legacy:
        merged = migrate_rollout(_merge(base, arms[arm]["rollout"]), warn=False)
        out["experiment"]["arms"][arm]["rollout"] = {
            k: v for k, v in merged.items() if new_base.get(k) != v
        }
    return out


def rollout_precision(rollout: RolloutSection) -> RolloutPrecisionConfig:
    """The twin's :class:`RolloutPrecisionConfig` of a validated ``rollout`` section.

    Raises:
        ValueError: ``rollout.quantizer`` has an unknown key, a key that lives at
            ``rollout.<key>``, or an invalid value (named by its path).
    """
    knobs = tuple(k for k in RolloutPrecisionConfig.model_fields if k not in _PRECISION_KEYS)
    for key in rollout.quantizer:
        if key in _PRECISION_KEYS:
            raise ValueError(
                f"rollout.quantizer.{key} is invalid: {key} is set at rollout.{key}, not in "
                "rollout.quantizer"
            )
        if key not in knobs:
            raise ValueError(
                f"rollout.quantizer.{key} is not a known field (allowed: {', '.join(knobs)})"
            )
    validate_section(RolloutPrecisionConfig, rollout.quantizer, "rollout.quantizer")
    return validate_section(
        RolloutPrecisionConfig,
        {**rollout.quantizer, **rollout.model_dump(include=set(_PRECISION_KEYS))},
        "rollout",
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
    reverse_answer: bool = Field(
        True, description="Write the sum least-significant digit first (easier to learn)."
    )
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
                f"sft_alt_fraction={self.sft_alt_fraction} applies to task=chain only: "
                f"expected 0 for task={self.task}"
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
        "default", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name: outputs go to run_dir/name."
    )
    progress_bar: bool = Field(True, description="Show tqdm progress bars.")
    plots: bool = Field(True, description="Write PNG plots and summary.md at the end.")


class CheckpointingSection(_Section):
    """``checkpointing``: atomic per-(arm, seed) checkpoints for resume."""

    enabled: bool = Field(True, description="Write checkpoints (needed to resume).")
    save_period: int = Field(10, ge=1, description="Checkpoint every N steps (and at the end).")


class ClusterSection(_Section):
    """``cluster``: the data-parallel trainer processes (gloo on 127.0.0.1)."""

    dp_size: int = Field(2, ge=1, description="Trainer processes (1: run in this process).")
    num_threads_per_rank: int = Field(1, ge=1, description="torch intra-op threads per rank.")
    timeout_s: float = Field(600.0, gt=0.0, description="gloo collective timeout.")


class ExperimentSection(_Section):
    """``experiment``: every arm runs with every seed; an arm is a config override."""

    seeds: list[int] = Field([0, 1], min_length=1, description="Seeds of the runs.")
    arms: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_ARMS),
        description="Arm name -> nested override of this config (default: the four arms of "
        "default.yaml).",
    )
    include: list[str] | None = Field(None, description="Arms to run (None: all, in order).")
    reference_arm: str = Field(
        "bf16", description="Arm the others are compared with, seed by seed, in summary.md."
    )

    @model_validator(mode="after")
    def _check_arms(self) -> ExperimentSection:
        if not self.arms:
            raise ValueError("arms is empty: expected at least one arm (e.g. bf16: {})")
        for name, override in self.arms.items():
            if "experiment" in (override or {}):
                raise ValueError(f"arms.{name} must not override the experiment section")
        unknown = [a for a in self.include or [] if a not in self.arms]
        if unknown:
            raise ValueError(f"include={unknown} names unknown arms (known: {list(self.arms)})")
        if self.reference_arm not in self.arms:
            raise ValueError(
                f"reference_arm={self.reference_arm!r} is not an arm (known: {list(self.arms)})"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} has duplicates")
        return self

    @property
    def arm_names(self) -> list[str]:
        """Arms to run, in order."""
        return list(self.include) if self.include is not None else list(self.arms)


_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "grpo": GRPOSection,
    "policy": PolicySection,
    "rollout": RolloutSection,
    "data": DataSection,
    "logger": LoggerSection,
    "checkpointing": CheckpointingSection,
    "cluster": ClusterSection,
    "experiment": ExperimentSection,
}


_NESTED_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("policy", "model"): ModelSection,
    ("policy", "optimizer"): OptimizerSection,
    ("policy", "warm_start"): WarmStartSection,
}


@dataclass(frozen=True)
class RecipeConfig:
    """One validated configuration (an arm's override already applied)."""

    grpo: GRPOSection
    pg: PGLossConfig
    correction: CorrectionConfig
    policy: PolicySection
    rollout: RolloutSection
    precision: RolloutPrecisionConfig
    data: DataSection
    logger: LoggerSection
    checkpointing: CheckpointingSection
    cluster: ClusterSection
    experiment: ExperimentSection
    raw: dict[str, Any]

    @property
    def fp8(self) -> RolloutPrecisionConfig:
        """:attr:`precision` (the former name, from when the twin was FP8-only)."""
        return self.precision

    @property
    def rollout_batch_size(self) -> int:
        """Samples per GRPO step: prompts x generations."""
        return self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt

    @property
    def train_global_batch_size(self) -> int:
        """Samples per optimizer step."""
        return self.policy.train_global_batch_size or self.rollout_batch_size


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read ``path`` and resolve its ``defaults:`` (file names relative to it)."""
    if path in seen:
        raise ValueError(f"{path}: circular defaults: {' -> '.join(map(str, (*seen, path)))}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        node = OmegaConf.load(path)
    except (OmegaConfBaseException, Exception) as err:
        raise ValueError(f"{path}: malformed YAML: {err}") from None
    if not isinstance(node, DictConfig):
        raise ValueError(f"{path}: expected a mapping of sections at the top level")
    data = OmegaConf.to_container(node, resolve=False)
    defaults = data.pop("defaults", None) or []
    if isinstance(defaults, str):
        defaults = [defaults]
    base: dict[str, Any] = {}
    for name in defaults:
        base = _merge(base, _read_yaml((path.parent / name).resolve(), (*seen, path)))
    return _merge(base, data)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a YAML config with ``defaults:`` inheritance and dotted ``key=value`` overrides.

    Args:
        path: the YAML file.
        overrides: e.g. ``["grpo.max_num_steps=10", "loss_fn.ais.ema=0.5"]`` (OmegaConf
            dotlist syntax; values are parsed as YAML).

    Returns:
        The merged, interpolation-resolved config as a plain dict (validated by
        :func:`validate_config`).

    Raises:
        ValueError: malformed YAML or override, or an invalid / unknown key (named).
    """
    data = _read_yaml(Path(path).resolve())
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ValueError(f"override {bad[0]!r} is invalid: expected key.path=value")
    try:
        merged = OmegaConf.merge(OmegaConf.create(data), OmegaConf.from_dotlist(list(overrides)))
        resolved = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"invalid override or interpolation: {err}") from None
    resolved = migrate_config(resolved)
    validate_config(resolved)
    return resolved


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def validate_config(data: dict[str, Any]) -> RecipeConfig:
    """Validate the base config and every arm's merged config; return the base one.

    Raises:
        ValueError: names the key path (for an arm: ``experiment.arms.<name>: ...``).
    """
    base = resolve_arm(data, None)
    for arm in base.experiment.arms:
        try:
            resolve_arm(data, arm)
        except ValueError as err:
            raise ValueError(f"experiment.arms.{arm}: {err}") from None
    return base


def resolve_arm(data: dict[str, Any], arm: str | None) -> RecipeConfig:
    """Merge arm ``arm``'s override (None: none) into ``data`` and validate every section.

    Raises:
        ValueError: an unknown top-level section or key, or an invalid value, named by path.
    """
    data = _plain(data)
    if not isinstance(data, dict):
        raise ValueError(f"config: expected a mapping of sections, got {type(data).__name__}")
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ValueError(f"{unknown[0]} is not a known section (allowed: {', '.join(SECTIONS)})")
    if arm is not None:
        arms = validate_section(ExperimentSection, data.get("experiment"), "experiment").arms
        if arm not in arms:
            raise ValueError(f"experiment.arms.{arm}: unknown arm (known: {list(arms)})")
        data = _merge(data, arms[arm] or {})
    if isinstance(data.get("rollout"), dict) and "fp8" in data["rollout"]:
        data = {**data, "rollout": migrate_rollout(data["rollout"])}
    for (section, sub), model in _NESTED_MODELS.items():  # nested first: precise key paths
        parent = data.get(section)
        if isinstance(parent, dict) and parent.get(sub) is not None:
            validate_section(model, parent[sub], f"{section}.{sub}")
    sec = {
        name: validate_section(model, data.get(name), name)
        for name, model in _SECTION_MODELS.items()
    }
    loss_fn = dict(data.get("loss_fn") or {})
    ais = loss_fn.pop("ais", None)
    pg = validate_section(PGLossConfig, loss_fn, "loss_fn")
    correction = validate_section(CorrectionConfig, ais, "loss_fn.ais")
    conflicts = surrogate_conflicts(correction, pg)  # e.g. tbpo with use_cispo
    if conflicts:
        raise ValueError("\n".join(conflicts))
    precision = rollout_precision(sec["rollout"])
    cfg = RecipeConfig(pg=pg, correction=correction, precision=precision, raw=data, **sec)
    _check_batching(cfg)
    _check_rollout_alignment(cfg)
    return cfg


def _check_rollout_alignment(cfg: RecipeConfig) -> None:
    """Cross-section rules of ``policy.rollout_aligned_quantization`` (QaRL's trainer).

    A BF16 rollout (``format`` and ``kv_cache`` bf16) is allowed: nothing is quantized, and
    the aligned forward is the plain one (so the key can be set for every arm at once).
    """
    if not cfg.policy.rollout_aligned_quantization:
        return
    if cfg.precision.compute_dtype not in (None, "float32"):
        raise ValueError(
            "policy.rollout_aligned_quantization=True is invalid with "
            f"rollout.quantizer.compute_dtype={cfg.precision.compute_dtype!r}: the aligned "
            "trainer computes in fp32; expected null or 'float32'"
        )


def _check_batching(cfg: RecipeConfig) -> None:
    """Cross-section rules of the batch layout (chunks, DP ranks, optimizer steps)."""
    grpo, rollout = cfg.grpo, cfg.rollout
    if grpo.num_prompts_per_step % rollout.prompts_per_chunk:
        raise ValueError(
            f"grpo.num_prompts_per_step={grpo.num_prompts_per_step} must be a multiple of "
            f"rollout.prompts_per_chunk={rollout.prompts_per_chunk}"
        )
    num_chunks = grpo.num_prompts_per_step // rollout.prompts_per_chunk
    if num_chunks % cfg.cluster.dp_size:
        raise ValueError(
            f"cluster.dp_size={cfg.cluster.dp_size} must divide the {num_chunks} rollout chunks "
            f"(grpo.num_prompts_per_step / rollout.prompts_per_chunk): each rank owns whole chunks"
        )
    gbs = cfg.train_global_batch_size
    if cfg.rollout_batch_size % gbs:
        raise ValueError(
            f"policy.train_global_batch_size={gbs} must divide the rollout batch "
            f"{cfg.rollout_batch_size} (num_prompts_per_step x num_generations_per_prompt)"
        )
    num_minibatches = cfg.rollout_batch_size // gbs
    if cfg.correction.bypass and num_minibatches > 1:
        raise ValueError(
            f"loss_fn.ais.bypass=true needs one optimizer step per rollout batch: "
            f"policy.train_global_batch_size={gbs} gives {num_minibatches} (pi_old := mu holds "
            "only before the first update); set it to null or to the rollout batch "
            f"{cfg.rollout_batch_size}"
        )
    chunk_samples = rollout.prompts_per_chunk * grpo.num_generations_per_prompt
    if chunk_samples % num_minibatches:
        raise ValueError(
            f"policy.train_global_batch_size={gbs} gives {num_minibatches} optimizer steps per "
            f"GRPO step, which must divide the {chunk_samples} samples of a rollout chunk "
            "(rollout.prompts_per_chunk x grpo.num_generations_per_prompt)"
        )


def config_hash(obj: Any, length: int = 12) -> str:
    """Stable short hash of a JSON-serialisable object (cache keys, run identity)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
