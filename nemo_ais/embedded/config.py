# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Validated configuration of the embedded recipe (``nemo-ais run``).

NeMo-RL-style YAML sections, each a model of :mod:`nemo_ais.embedded.sections`; an unknown or malformed key is a
``ValueError`` naming its path (``grpo.num_prompts_per_step=0 is invalid: ...``). The deprecated ``rollout.fp8:`` block
is still read, with a ``FutureWarning`` (:func:`migrate_rollout`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_ais.config import CorrectionConfig, PGLossConfig, surrogate_conflicts, validate_section
from nemo_ais.embedded.sections import (
    DEFAULT_QUANTIZER,
    NESTED_MODELS,
    PRECISION_KEYS,
    SECTION_MODELS,
    CheckpointingSection,
    ClusterSection,
    DataSection,
    ExperimentSection,
    GRPOSection,
    LoggerSection,
    PolicySection,
    RolloutSection,
    rollout_precision,
)
from nemo_ais.embedded.task import task_from_config
from nemo_ais.formats.kv_cache import get_kv_format
from nemo_ais.refit.config import RENAMED_KEYS
from nemo_ais.rollout.config import RolloutPrecisionConfig

# The shipped presets are package data (pyproject.toml), so a wheel install finds them.
CONFIG_DIR = Path(str(resources.files("nemo_ais.embedded") / "presets"))
SECTIONS = ("grpo", "loss_fn", "policy", "rollout", "data", "logger", "checkpointing", "cluster", "experiment")
_FORMER_FP8_KEYS = ("enabled", "kv_cache_fp8")
_FP8_BLOCK_DEPRECATED = (
    "rollout.fp8 (the former FP8 rollout block) is deprecated and will be removed: write rollout.format (enabled: "
    "false -> format: bf16 with kv_cache: bf16), rollout.kv_cache (kv_cache_fp8: true -> fp8), the exclusion keys "
    "under rollout, and the format's knobs under rollout.quantizer (docs/embedded.md)"
)


def migrate_rollout(rollout: dict[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """A copy of ``rollout`` with its deprecated ``fp8:`` block folded into the current keys.

    An old config means what it meant (the mapping: docs/embedded.md). Raises ``ValueError`` (named) for a block that
    is not a mapping, has an unknown key or a non-bool former key, or mixes a former key with ``format`` / ``kv_cache``.
    """
    out = copy.deepcopy(rollout)
    block = out.pop("fp8", None)
    if block is None:
        return out
    if not isinstance(block, dict):
        raise ValueError(f"rollout.fp8: expected a mapping, got {type(block).__name__}")
    allowed = (*_FORMER_FP8_KEYS, *RolloutPrecisionConfig.model_fields)
    unknown = [k for k in block if k not in allowed and k not in RENAMED_KEYS]
    if unknown:
        raise ValueError(f"rollout.fp8.{unknown[0]} is not a known field (allowed: {', '.join(allowed)})")
    renamed = {k: v for k, v in block.items() if k in RENAMED_KEYS}
    if renamed:  # the config's own refusal, with the new name, at the path the user wrote
        validate_section(RolloutPrecisionConfig, renamed, "rollout.fp8")
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
        if key in PRECISION_KEYS and key not in out:
            former_default = {"format": "fp8", "kv_cache": "bf16", "keep_patterns": []}
            out[key] = former_default.get(key, field.get_default())
    for key, value in block.items():
        if key in PRECISION_KEYS:
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

    An arm's block becomes the keys in which its migrated ``rollout`` differs from the migrated top level, so
    :func:`resolve_arm` validates ``data`` and the result alike (tested).
    """
    base = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    experiment = data.get("experiment") if isinstance(data.get("experiment"), dict) else {}
    arms = experiment.get("arms") if isinstance(experiment.get("arms"), dict) else {}
    legacy = [a for a, o in arms.items() if isinstance(o, dict) and _has_fp8_block(o.get("rollout"))]
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
        out["experiment"]["arms"][arm]["rollout"] = {k: v for k, v in merged.items() if new_base.get(k) != v}
    return out


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
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if nested else copy.deepcopy(value)
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read ``path`` and resolve its ``defaults:`` (file names relative to it)."""
    if path in seen:
        raise ValueError(f"{path}: circular defaults: {' -> '.join(map(str, (*seen, path)))}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        node = OmegaConf.load(path)
    except Exception as err:
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

    Returns the merged, resolved, validated config as a plain dict; ``ValueError`` names a malformed YAML or override,
    or an invalid / unknown key.
    """
    data = _read_yaml(Path(path).resolve())
    cluster = data.get("cluster")
    if "env" in data or (isinstance(cluster, dict) and "gpus_per_node" in cluster):
        raise ValueError(
            f"{path} is a NeMo-RL run config (it has NeMo-RL's env / cluster.gpus_per_node "
            "keys): nemo-ais run and attribute take an embedded recipe config (--preset, or "
            "a copy of one); NeMo-RL configs run through launchers/ (docs/cluster.md)"
        )
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


def validate_config(data: dict[str, Any]) -> RecipeConfig:
    """Validate the base config and every arm's (errors prefixed ``experiment.arms.<name>:``)."""
    base = resolve_arm(data, None)
    task_from_config(base.data)  # the task's own range checks (data.eval_size against num_digits, ...)
    for arm in base.experiment.arms:
        try:
            resolve_arm(data, arm)
        except ValueError as err:
            raise ValueError(f"experiment.arms.{arm}: {err}") from None
    return base


def resolve_arm(data: dict[str, Any], arm: str | None) -> RecipeConfig:
    """Merge arm ``arm``'s override (None: none) into ``data``; validate (errors name the path)."""
    if isinstance(data, DictConfig | ListConfig):
        data = OmegaConf.to_container(data, resolve=True)
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
    if _has_fp8_block(data.get("rollout")):
        data = {**data, "rollout": migrate_rollout(data["rollout"])}
    for (section, sub), model in NESTED_MODELS.items():  # nested first: precise key paths
        parent = data.get(section)
        if isinstance(parent, dict) and parent.get(sub) is not None:
            validate_section(model, parent[sub], f"{section}.{sub}")
    sec = {name: validate_section(model, data.get(name), name) for name, model in SECTION_MODELS.items()}
    loss_fn = dict(data.get("loss_fn") or {})
    ais = loss_fn.pop("ais", None)
    pg = validate_section(PGLossConfig, loss_fn, "loss_fn")
    correction = validate_section(CorrectionConfig, ais, "loss_fn.ais")
    conflicts = surrogate_conflicts(correction, pg)  # e.g. tbpo with use_cispo
    if conflicts:
        raise ValueError("\n".join(conflicts))
    if pg.reference_policy_kl_penalty > 0:
        raise ValueError(
            f"loss_fn.reference_policy_kl_penalty={pg.reference_policy_kl_penalty:g} is invalid here: expected 0 (the "
            "embedded recipe keeps no reference policy; the KL term runs in NeMo-RL, on the cluster)"
        )
    precision = rollout_precision(sec["rollout"])
    if precision.kv_cache != "bf16":
        model = sec["policy"].model
        where = "policy.model (hidden_size / num_attention_heads)"
        get_kv_format(precision.kv_cache).check_head_dim(model.hidden_size // model.num_attention_heads, where)
    cfg = RecipeConfig(pg=pg, correction=correction, precision=precision, raw=data, **sec)
    _check_batching(cfg)
    _check_rollout_alignment(cfg)
    _check_curriculum(cfg)
    return cfg


def _check_curriculum(cfg: RecipeConfig) -> None:
    """``policy.warm_start.curriculum`` needs the chain task and shorter chains."""
    stage = cfg.policy.warm_start.curriculum
    if stage is None:
        return
    if cfg.data.task != "chain" or stage.chain_length >= cfg.data.chain_length:
        raise ValueError(
            f"policy.warm_start.curriculum.chain_length={stage.chain_length} is invalid: expected data.task=chain (got "
            f"{cfg.data.task}) and fewer values than data.chain_length={cfg.data.chain_length}"
        )


def _check_rollout_alignment(cfg: RecipeConfig) -> None:
    """``policy.rollout_aligned_quantization`` needs an fp32 compute dtype; a BF16 arm passes (nothing is quantized)."""
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
            f"loss_fn.ais.bypass=true needs one optimizer step per rollout batch: policy.train_global_batch_size={gbs} "
            f"gives {num_minibatches} (pi_old := mu holds only before the first update); set it to null or to the "
            f"rollout batch {cfg.rollout_batch_size}"
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
