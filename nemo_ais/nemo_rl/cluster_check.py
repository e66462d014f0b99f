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
"""Offline checks of a NeMo-RL GRPO + AIS config: parallel sizes, vLLM FP8 shards, loss_fn.ais.

Catches, on a laptop and without NeMo-RL, the layout mistakes that otherwise surface
minutes into a multi-node Slurm job (an assert in ``Policy``/``VllmGeneration``, a
DeepGEMM shape error in vLLM's FP8 block-quantized linear layers, or a silently
dropped tail of the rollout batch). Pure Python: imports omegaconf, yaml and
:mod:`nemo_ais.config`, never Megatron, vLLM or torch. Configs are loaded by NeMo-RL's own
``load_config`` / ``parse_hydra_overrides`` when NeMo-RL is importable, else by
:func:`load_config_fallback`, a re-implementation proven equal by a test.

Checks (each returns a :class:`CheckResult`; ``fail`` makes :func:`validate_config` raise):

0. Every key NeMo-RL v0.7.0's entry point, ``setup()``, logger and checkpoint manager read
   unguarded is present (:data:`ENTRY_POINT_KEYS`, e.g. ``policy.draft.enabled``), and
   ``checkpointing.model_save_format`` is null unless ``policy.dtensor_cfg._v2`` (else
   ``Policy.save_checkpoint`` raises at the first save); ``data_plane.enabled`` is off (the
   launcher refuses TransferQueue for every arm).

1. ``loss_fn.ais`` validates as :class:`~nemo_ais.config.CorrectionConfig`; unless its
   mode is ``none``, NeMo-RL's own importance-sampling knobs (and the other loss options
   in :data:`AIS_CONFLICTS`) are off (both on would weight tokens twice).
2. FP8 rollout flags (NeMo-RL v0.7.0 ``grpo.setup`` / ``init_fp8`` rules): an FP8 KV
   cache needs ``precision: fp8``, the Megatron backend, pipeline size 1 and no async GRPO.
3. Megatron layout: ``world = nodes x gpus_per_node`` divisible by ``TP x PP x CP``
   (``DP = world / (TP x PP x CP)``); MoE: ``EP`` divides the expert count,
   ``ETP x EP`` divides ``world / PP``, sequence parallel on when ``TP > 1``; heads
   divisible by TP; layers divisible by PP; TP >= 4 needs equal train / logprob micro-batches.
4. Batch: ``num_prompts_per_step x num_generations_per_prompt`` is a multiple of
   ``train_global_batch_size`` (else NeMo-RL drops the tail), which is a multiple of
   ``DP x train_micro_batch_size``.
5. vLLM layout: ``TP x PP`` divides the GPUs; ``PP > 1`` needs ``async_engine``;
   ``EP`` is a multiple of TP and divides the expert count.
6. vLLM FP8 shards: with ``precision: fp8`` every per-rank weight dimension that is
   block-quantized (Q, K, V, O, gate/up, down; experts) must be divisible by 128.

CLI (the launchers run the file directly, which skips ``nemo_ais.nemo_rl/__init__``
and its torch import)::

    python -m nemo_ais.nemo_rl.cluster_check configs/nemo_rl/qwen3_8b_2n8g_fp8.yaml \
        [key=value ...] [--quiet] [--get cluster.num_nodes]
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_ais.alarms import AISAlarmsConfig
from nemo_ais.config import CorrectionConfig, validate_section

__all__ = [
    "AIS_CONFLICTS",
    "ENTRY_POINT_KEYS",
    "FP8_BLOCK",
    "MODEL_DIMS",
    "CheckResult",
    "ModelDims",
    "ParallelLayout",
    "ais_conflicts",
    "apply_overrides",
    "check_config",
    "find_model_dims",
    "is_mixin",
    "load_config",
    "load_config_fallback",
    "main",
    "parallel_layout",
    "validate_config",
]

FP8_BLOCK = 128
"""Block size of DeepSeek-style FP8 weights in vLLM/DeepGEMM (128 x 128 tiles)."""

# NeMo-RL loss_fn options that must stay at their "off" value when loss_fn.ais.mode is not
# none: (off value, why). With mode none the AIS loss is NeMo-RL's ClippedPGLossFn unchanged.
# The one table for both this offline check and nemo_ais.nemo_rl.loss.AISLossConfig.
_AIS_CONFLICT_TABLE: dict[str, tuple[Any, str]] = {
    "use_importance_sampling_correction": (
        False,
        "AIS is itself the importance-sampling correction; enabling both weights the loss twice",
    ),
    "truncated_importance_sampling_type": (
        None,
        "AIS replaces NeMo-RL's truncated IS; use loss_fn.ais.mode (tis, icepop, seq_mask_geo)",
    ),
    "sequence_level_importance_ratios": (False, "not supported with AIS (GSPO ratios)"),
    "force_on_policy_ratio": (False, "AIS needs prev_logprobs, which this option skips"),
    "use_cispo": (False, "not supported with AIS"),
    "use_on_policy_kl_approximation": (False, "not supported with AIS"),
    "positive_example_nll_weight": (0.0, "not supported with AIS (VAPO NLL term)"),
}
AIS_CONFLICTS: dict[str, Any] = {knob: off for knob, (off, _) in _AIS_CONFLICT_TABLE.items()}
"""NeMo-RL ``loss_fn`` option -> the value it must keep when ``loss_fn.ais.mode`` is not none."""


def ais_conflicts(loss_fn: Mapping[str, Any], mode: str) -> list[str]:
    """One message per NeMo-RL ``loss_fn`` option that conflicts with ``loss_fn.ais.mode``.

    Args:
        loss_fn: the ``loss_fn`` section (absent keys count as off).
        mode: the validated ``loss_fn.ais.mode``; ``"none"`` conflicts with nothing.
    """
    if mode == "none":
        return []
    return [
        f"loss_fn.{knob}={loss_fn[knob]!r} conflicts with loss_fn.ais.mode={mode!r}: {why} "
        f"(set loss_fn.{knob}: {'null' if off is None else str(off).lower()}, or "
        "loss_fn.ais.mode: none to use NeMo-RL's own loss)"
        for knob, (off, why) in _AIS_CONFLICT_TABLE.items()
        if loss_fn.get(knob, off) != off
    ]


_FP8_KV_DTYPES = ("fp8", "fp8_e4m3")
_KV_DTYPES = ("auto", *_FP8_KV_DTYPES)


@dataclass(frozen=True)
class ModelDims:
    """Shapes of a decoder-only model that fix which parallel sizes are legal.

    ``num_experts = 0`` means dense; ``moe_intermediate_size`` is per expert.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int
    num_experts: int = 0
    moe_intermediate_size: int = 0
    source: str = ""


# Values from each model's Hugging Face ``config.json`` (hidden_size, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, num_hidden_layers, num_experts,
# moe_intermediate_size). Keys are lower-cased basenames of the model id.
MODEL_DIMS: dict[str, ModelDims] = {
    "qwen3-0.6b": ModelDims(1024, 16, 8, 128, 3072, 28, source="hf:Qwen/Qwen3-0.6B config.json"),
    "qwen3-1.7b": ModelDims(2048, 16, 8, 128, 6144, 28, source="hf:Qwen/Qwen3-1.7B config.json"),
    "qwen3-8b": ModelDims(4096, 32, 8, 128, 12288, 36, source="hf:Qwen/Qwen3-8B config.json"),
    "qwen3-30b-a3b": ModelDims(
        2048, 32, 4, 128, 6144, 48, 128, 768, source="hf:Qwen/Qwen3-30B-A3B config.json"
    ),
    "qwen2.5-1.5b": ModelDims(
        1536, 12, 2, 128, 8960, 28, source="hf:Qwen/Qwen2.5-1.5B config.json"
    ),
    "llama-3.1-8b": ModelDims(
        4096, 32, 8, 128, 14336, 32, source="hf:meta-llama/Llama-3.1-8B config.json"
    ),
}
for _alias, _key in (
    ("qwen3-8b-base", "qwen3-8b"),
    ("qwen3-30b-a3b-base", "qwen3-30b-a3b"),
    ("qwen2.5-1.5b-instruct", "qwen2.5-1.5b"),
    ("llama-3.1-8b-instruct", "llama-3.1-8b"),
):
    MODEL_DIMS[_alias] = MODEL_DIMS[_key]


def find_model_dims(model_name: str) -> ModelDims | None:
    """Look a HF id or a local checkpoint path up in :data:`MODEL_DIMS` by its basename."""
    return MODEL_DIMS.get(Path(str(model_name).rstrip("/")).name.lower())


@dataclass(frozen=True)
class CheckResult:
    """One check: ``name``, ``status`` (ok | warn | fail) and a one-line ``detail``."""

    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str

    def __str__(self) -> str:
        return f"[{self.status.upper():4}] {self.name}: {self.detail}"


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes derived from a config (Megatron trainer and colocated vLLM engine)."""

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    vllm_tp: int
    vllm_pp: int
    vllm_ep: int
    vllm_engines: int


# ----------------------------------------------------------------------------------------
# Loading: NeMo-RL's own loader when importable; else a re-implementation of it
# ----------------------------------------------------------------------------------------


def _nemo_rl_config() -> Any:
    """``nemo_rl.utils.config`` (NeMo-RL's loader: omegaconf + hydra), or None if absent."""
    try:
        import nemo_rl.utils.config as nemo_rl_config
    except ImportError:
        return None
    return nemo_rl_config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load a config exactly as NeMo-RL's entry point does, apply overrides, resolve.

    With NeMo-RL importable this IS its loader: ``register_omegaconf_resolvers``,
    ``load_config`` and ``parse_hydra_overrides`` from ``nemo_rl.utils.config``, then
    ``OmegaConf.to_container(resolve=True)`` (``examples/run_grpo.py``). Without it (a
    laptop, the launchers' pre-flight check) :func:`load_config_fallback`, a
    re-implementation that a test proves equal on every shipped config and override example.

    Returns:
        A plain, fully interpolated ``dict`` (without the ``defaults`` key).

    Raises:
        FileNotFoundError: the file or one of its ``defaults`` does not exist.
        ValueError: a malformed or unknown-key override (NeMo-RL's message), or (fallback)
            an inheritance cycle.
    """
    upstream = _nemo_rl_config()
    if upstream is None:
        return load_config_fallback(path, overrides)
    upstream.register_omegaconf_resolvers()
    if not Path(path).is_file():
        raise FileNotFoundError(f"config {path} does not exist")
    cfg = upstream.load_config(str(path))
    if overrides:
        try:
            cfg = upstream.parse_hydra_overrides(cfg, list(overrides))
        except upstream.OverridesError as err:
            raise ValueError(str(err)) from err
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def _register_resolvers() -> None:
    # Same names and meaning as NeMo-RL's resolvers, so its YAML interpolations resolve here.
    for name, fn in (
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("max", lambda a, b: max(a, b)),
    ):
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # omegaconf 2.4 renamed it; 2.3 (NeMo-RL) has only this
                warnings.simplefilter("ignore")
                OmegaConf.register_new_resolver(name, fn)


def _merge(base: DictConfig, child: DictConfig) -> DictConfig:
    # A section marked `_override_: true` replaces the inherited one instead of merging.
    for key in list(child.keys()):
        node = child[key]
        if isinstance(node, DictConfig) and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, child)
    assert isinstance(merged, DictConfig)
    return merged


def _load_tree(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ValueError(f"defaults: inheritance cycle {cycle}")
    if not path.is_file():
        where = f" (a defaults: entry of {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"config {path} does not exist{where}")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise TypeError(f"{path}: expected a YAML mapping at the top level, got a list")
    if "defaults" not in cfg:
        return cfg
    parents = cfg.pop("defaults")
    if isinstance(parents, str):
        parents = [parents]
    elif isinstance(parents, ListConfig):
        parents = [str(p) for p in parents]
    else:
        raise TypeError(f"{path}: defaults: expected a path or a list of paths, got {parents!r}")
    merged = OmegaConf.create({})
    for parent in parents:
        parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
        merged = _merge(merged, _load_tree(parent_path.resolve(), (*chain, path)))
    return _merge(merged, cfg)


# Hydra's override grammar for unquoted scalars (what parse_hydra_overrides produces).
_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_FLOAT = re.compile(
    r"[+-]?(([0-9](_?[0-9])*)?\.[0-9](_?[0-9])*|[0-9](_?[0-9])*\.?)([eE][+-]?[0-9](_?[0-9])*)?"
    r"|[+-]?(inf|nan)",
    re.IGNORECASE,
)


def _parse_value(raw: str) -> Any:
    """An override value as Hydra types it (null, bool, int, float, list/dict, else str)."""
    text = raw.strip()
    if text.lower() == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    if text.startswith(("[", "{")):
        return yaml.safe_load(text)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Apply Hydra overrides as NeMo-RL's ``parse_hydra_overrides`` does (struct mode).

    ``a.b=v`` sets an existing key (merging a dict value), ``+a.b=v`` adds a key that is
    absent or null, ``++a.b=v`` adds or sets, ``~a.b`` (or ``~a.b=v``, if the value is v)
    deletes. Values are typed like Hydra's (``null``, ``true``, ``8``, ``1e-6``, ``[1, 2]``;
    anything else, e.g. ``00:03:45:00``, a string).
    """
    for item in overrides:
        key, eq, raw = item.partition("=")
        if key.startswith("~"):
            key = key[1:]
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if current is None:
                raise ValueError(f"override {item!r}: {key} is not in the config (or is null)")
            if eq and _parse_value(raw) != current:
                raise ValueError(f"override {item!r}: {key} is {current!r}, not {raw}")
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            parent.pop(leaf)
            continue
        if not eq:
            raise ValueError(f"override {item!r}: expected key=value, +key=value or ~key")
        value = _parse_value(raw)
        if key.startswith("++"):
            OmegaConf.update(cfg, key[2:], value, merge=True, force_add=True)
        elif key.startswith("+"):
            key = key[1:]
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if current is not None and not isinstance(value, (dict, list)):
                raise ValueError(
                    f"override {item!r}: {key} is already in the config (write {item[1:]} to "
                    f"set it, or +{item} to add or set)"
                )
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
                raise ValueError(
                    f"override {item!r}: {key} is not in the config (write +{key}=... to add a key)"
                )
            OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def load_config_fallback(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """NeMo-RL's ``load_config`` + ``parse_hydra_overrides``, re-implemented (no NeMo-RL, no hydra).

    ``defaults:`` (a path or a list of paths, relative to the file that names them or
    absolute) is resolved depth-first, later entries and the child winning; a section
    with ``_override_: true`` replaces the inherited one; then :func:`apply_overrides`.

    Returns:
        A plain, fully interpolated ``dict`` (without the ``defaults`` key).

    Raises:
        FileNotFoundError: the file or one of its ``defaults`` does not exist.
        ValueError: an inheritance cycle, or a malformed / unknown-key override.
    """
    _register_resolvers()
    cfg = _load_tree(Path(path).resolve(), ())
    cfg = apply_overrides(cfg, overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def is_mixin(cfg: dict[str, Any]) -> bool:
    """True for an arm mixin (a delta without ``policy``/``cluster``), not a full config."""
    return "policy" not in cfg or "cluster" not in cfg


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def _get(cfg: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node or node[part] is None:
            return default
        node = node[part]
    return node


def parallel_layout(cfg: dict[str, Any]) -> ParallelLayout:
    """Trainer (Megatron) and rollout (vLLM) sizes of a colocated config; DP is floor-divided."""
    world = int(_get(cfg, "cluster.num_nodes", 1)) * int(_get(cfg, "cluster.gpus_per_node", 1))
    mcfg = "policy.megatron_cfg."
    if _get(cfg, mcfg + "enabled", False):
        tp = int(_get(cfg, mcfg + "tensor_model_parallel_size", 1))
        pp = int(_get(cfg, mcfg + "pipeline_model_parallel_size", 1))
        cp = int(_get(cfg, mcfg + "context_parallel_size", 1))
        ep = int(_get(cfg, mcfg + "expert_model_parallel_size", 1))
        etp = int(_get(cfg, mcfg + "expert_tensor_parallel_size", 1))
    else:
        tp = int(_get(cfg, "policy.dtensor_cfg.tensor_parallel_size", 1))
        cp = int(_get(cfg, "policy.dtensor_cfg.context_parallel_size", 1))
        pp, ep, etp = 1, 1, 1
    vcfg = "policy.generation.vllm_cfg."
    vllm_tp = int(_get(cfg, vcfg + "tensor_parallel_size", 1))
    vllm_pp = int(_get(cfg, vcfg + "pipeline_parallel_size", 1))
    vllm_ep = int(_get(cfg, vcfg + "expert_parallel_size", 1))
    return ParallelLayout(
        world=world,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=world // max(1, tp * pp * cp),
        vllm_tp=vllm_tp,
        vllm_pp=vllm_pp,
        vllm_ep=vllm_ep,
        vllm_engines=world // max(1, vllm_tp * vllm_pp),
    )


class _Report:
    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def add(self, name: str, problems: list[str], ok_detail: str) -> None:
        status: Literal["ok", "fail"] = "fail" if problems else "ok"
        self.results.append(CheckResult(name, status, "; ".join(problems) or ok_detail))

    def warn(self, name: str, detail: str) -> None:
        self.results.append(CheckResult(name, "warn", detail))


def _check_ais(cfg: dict[str, Any], report: _Report) -> None:
    loss = _get(cfg, "loss_fn", {})
    if "ais" not in loss:
        report.warn("loss_fn.ais", "no loss_fn.ais section: the AIS loss is not configured")
        return
    problems = []
    try:
        ais = validate_section(CorrectionConfig, loss["ais"], "loss_fn.ais")
    except (TypeError, ValueError) as err:
        problems.append(str(err).replace("\n", "; "))
        ais = None
    raw = loss["ais"] if isinstance(loss["ais"], dict) else {}
    mode = ais.mode if ais else raw.get("mode", "ais")
    problems += ais_conflicts(loss, mode)
    if loss.get("ais_alarms") is not None:  # the refit guard (absent: off)
        try:
            validate_section(AISAlarmsConfig, loss["ais_alarms"], "loss_fn.ais_alarms")
        except (TypeError, ValueError) as err:
            problems.append(str(err).replace("\n", "; "))
    report.add("loss_fn.ais", problems, f"mode={ais.mode if ais else '?'}, validated")


# Keys NeMo-RL v0.7.0 reads unguarded (``cfg["key"]``) between its entry point and the first
# checkpoint: (dotted key, who reads it, the flag that makes it read; None = always). A
# missing one is a KeyError after Ray has started (examples/run_grpo.py: policy.draft).
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
    (
        "grpo.async_grpo.max_trajectory_age_steps",
        "examples/run_grpo.py main()",
        "grpo.async_grpo.enabled",
    ),
    ("policy.dynamic_batching.train_mb_tokens", "Policy", "policy.dynamic_batching.enabled"),
    ("policy.dynamic_batching.sequence_length_round", "Policy", "policy.dynamic_batching.enabled"),
    ("policy.sequence_packing.train_mb_tokens", "Policy", "policy.sequence_packing.enabled"),
    ("policy.draft.loss_weight", "models/megatron/train.py", "policy.draft.enabled"),
)


def _has(cfg: dict[str, Any], dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _check_entry_point(cfg: dict[str, Any], report: _Report) -> None:
    problems = [
        f"{key} is missing: NeMo-RL v0.7.0 reads it unguarded ({reader}"
        f"{f', with {flag}=true' if flag else ''}) and stops with KeyError '{key.rsplit('.', 1)[-1]}'"
        f" (add it; configs/nemo_rl/grpo_ais_base.yaml has every one)"
        for key, reader, flag in ENTRY_POINT_KEYS
        if (flag is None or _get(cfg, flag, False)) and not _has(cfg, key)
    ]
    if _get(cfg, "data_plane.enabled", False):
        problems.append(
            "data_plane.enabled=true (TransferQueue: TQPolicy + grpo_train_sync) is not "
            "supported by launchers/run_grpo_ais.py (every arm trains on the AIS worker); "
            "set data_plane.enabled=false"
        )
    report.add(
        "entry_point_keys", problems, f"all {len(ENTRY_POINT_KEYS)} upstream lookups present"
    )


def _check_checkpointing(cfg: dict[str, Any], report: _Report) -> None:
    fmt = _get(cfg, "checkpointing.model_save_format")
    problems = []
    if _get(cfg, "checkpointing.enabled", False) and fmt is not None:
        if not _get(cfg, "policy.dtensor_cfg._v2", False):
            problems.append(
                f"checkpointing.model_save_format={fmt!r} is invalid without "
                f"policy.dtensor_cfg._v2=true: expected null (NeMo-RL v0.7.0's "
                f"Policy.save_checkpoint raises at the first save; the Megatron and DTensor v1 "
                f"workers take no format, torch_save | safetensors are for DTensor v2)"
            )
    report.add("checkpointing", problems, f"model_save_format={fmt!r}")


def fp8_kv_refit_problems(cfg: Mapping[str, Any]) -> list[str]:
    """Settings with which calibrated FP8 KV scales cannot reach vLLM at every refit.

    NeMo-RL v0.7.0's ``grpo_train`` refits before the first KV calibration when
    ``grpo.val_at_start`` is true (a TODO in its source): the engine would validate, and
    the first step would roll out, with every q/k/v scale at 1.0. The AIS Megatron worker
    refuses such a refit; the launcher refuses the config before Ray starts.

    Returns:
        One message per problem, naming the field (empty if fine or no FP8 KV cache).
    """
    kv = str(_get(cfg, "policy.generation.vllm_cfg.kv_cache_dtype", "auto") or "auto")
    if not kv.startswith("fp8") or not _get(cfg, "grpo.val_at_start", False):
        return []
    return [
        f"grpo.val_at_start=true with policy.generation.vllm_cfg.kv_cache_dtype={kv!r} is "
        "invalid: expected false (NeMo-RL v0.7.0 refits before the first KV-scale "
        "calibration, so the engine would run with every q/k/v scale at 1.0)"
    ]


def _check_fp8_rollout(cfg: dict[str, Any], report: _Report) -> None:
    vllm = _get(cfg, "policy.generation.vllm_cfg", {})
    precision = vllm.get("precision")
    kv = vllm.get("kv_cache_dtype", "auto")
    problems = []
    if kv not in _KV_DTYPES:
        problems.append(
            f"policy.generation.vllm_cfg.kv_cache_dtype={kv!r} is invalid: expected one of {_KV_DTYPES}"
        )
    elif kv in _FP8_KV_DTYPES:
        if precision != "fp8":
            problems.append(
                f"policy.generation.vllm_cfg.kv_cache_dtype={kv!r} needs "
                f"policy.generation.vllm_cfg.precision='fp8' (got {precision!r})"
            )
        if not _get(cfg, "policy.megatron_cfg.enabled", False):
            problems.append(
                "an FP8 KV cache needs the Megatron backend (policy.megatron_cfg.enabled)"
            )
        pp = _get(cfg, "policy.megatron_cfg.pipeline_model_parallel_size", 1)
        if pp != 1:
            problems.append(
                f"an FP8 KV cache needs policy.megatron_cfg.pipeline_model_parallel_size=1 "
                f"(got {pp}; asserted by NeMo-RL v0.7.0 grpo.setup)"
            )
        if _get(cfg, "grpo.async_grpo.enabled", False):
            problems.append("an FP8 KV cache does not support grpo.async_grpo.enabled=true")
        problems += fp8_kv_refit_problems(cfg)
    if precision == "fp8":
        dims = find_model_dims(_get(cfg, "policy.model_name", ""))
        n_bf16 = int(vllm.get("num_first_layers_in_bf16", 0)) + int(
            vllm.get("num_last_layers_in_bf16", 0)
        )
        if dims is not None and n_bf16 > dims.num_layers:
            problems.append(
                f"num_first_layers_in_bf16 + num_last_layers_in_bf16 = {n_bf16} exceeds the "
                f"model's {dims.num_layers} layers"
            )
        if not vllm.get("use_deep_gemm", False):
            report.warn(
                "fp8_rollout",
                "policy.generation.vllm_cfg.use_deep_gemm is false: FP8 runs on vLLM's slower "
                "CUTLASS block-FP8 kernels",
            )
    report.add("fp8_rollout", problems, f"precision={precision}, kv_cache_dtype={kv}")


def _check_megatron(
    cfg: dict[str, Any], lay: ParallelLayout, dims: ModelDims | None, report: _Report
) -> None:
    mcfg = "policy.megatron_cfg"
    problems = []
    model_parallel = lay.tp * lay.pp * lay.cp
    if lay.world % model_parallel:
        problems.append(
            f"GPUs = cluster.num_nodes x cluster.gpus_per_node = {lay.world} is not divisible "
            f"by TP x PP x CP = {lay.tp} x {lay.pp} x {lay.cp} = {model_parallel} "
            f"({mcfg}.tensor/pipeline/context_parallel_size)"
        )
    if dims is not None:
        if dims.num_attention_heads % lay.tp or dims.num_key_value_heads % lay.tp:
            problems.append(
                f"{mcfg}.tensor_model_parallel_size={lay.tp} must divide the "
                f"{dims.num_attention_heads} query heads and {dims.num_key_value_heads} KV heads"
            )
        staged = _get(cfg, mcfg + ".num_layers_in_first_pipeline_stage") is not None or (
            _get(cfg, mcfg + ".num_layers_in_last_pipeline_stage") is not None
        )
        if lay.pp > 1 and dims.num_layers % lay.pp and not staged:
            problems.append(
                f"{mcfg}.pipeline_model_parallel_size={lay.pp} does not divide the "
                f"{dims.num_layers} layers (or set num_layers_in_first/last_pipeline_stage)"
            )
        n_experts = dims.num_experts
        if n_experts == 0 and lay.ep > 1:
            problems.append(f"{mcfg}.expert_model_parallel_size={lay.ep} > 1 for a dense model")
        if n_experts and n_experts % lay.ep:
            problems.append(
                f"{mcfg}.expert_model_parallel_size={lay.ep} does not divide the "
                f"{n_experts} experts"
            )
        if n_experts and lay.tp > 1 and not _get(cfg, mcfg + ".sequence_parallel", False):
            problems.append(
                f"MoE with tensor_model_parallel_size={lay.tp} > 1 needs {mcfg}.sequence_parallel=true"
            )
    expert_group = lay.etp * lay.ep
    if expert_group > 1 and (lay.world % lay.pp or (lay.world // lay.pp) % expert_group):
        problems.append(
            f"ETP x EP = {lay.etp} x {lay.ep} = {expert_group} must divide GPUs / PP = "
            f"{lay.world} / {lay.pp} (expert data parallel = GPUs / (ETP x EP x PP))"
        )
    mbs = _get(cfg, "policy.train_micro_batch_size", 1)
    lbs = _get(cfg, "policy.logprob_batch_size", mbs)
    if lay.tp >= 4 and mbs != lbs:
        problems.append(
            f"TP={lay.tp} >= 4 needs policy.train_micro_batch_size ({mbs}) == "
            f"policy.logprob_batch_size ({lbs}) (NeMo-RL's batch-variant TP accuracy check)"
        )
    detail = f"GPUs={lay.world}: TP={lay.tp} PP={lay.pp} CP={lay.cp} -> DP={lay.dp}"
    if lay.ep > 1 or lay.etp > 1:
        detail += f"; EP={lay.ep} ETP={lay.etp} -> expert DP={lay.world // (lay.pp * expert_group)}"
    report.add("megatron_parallel", problems, detail)


def _check_batch(cfg: dict[str, Any], lay: ParallelLayout, report: _Report) -> None:
    prompts = int(_get(cfg, "grpo.num_prompts_per_step", 0))
    gens = int(_get(cfg, "grpo.num_generations_per_prompt", 0))
    gbs = int(_get(cfg, "policy.train_global_batch_size", 0))
    mbs = int(_get(cfg, "policy.train_micro_batch_size", 1))
    rollouts = prompts * gens
    problems = []
    if gbs <= 0 or rollouts % gbs:
        problems.append(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {prompts} x {gens} "
            f"= {rollouts} is not a multiple of policy.train_global_batch_size={gbs} "
            f"(NeMo-RL would silently drop the last {rollouts % gbs if gbs > 0 else rollouts} rollouts)"
        )
    if gbs % max(1, lay.dp * mbs):
        problems.append(
            f"policy.train_global_batch_size={gbs} is not divisible by DP x "
            f"policy.train_micro_batch_size = {lay.dp} x {mbs} = {lay.dp * mbs}"
        )
    steps = rollouts // gbs if gbs > 0 else 0
    report.add(
        "batch",
        problems,
        f"{rollouts} rollouts/step = {steps} x gbs {gbs}; gbs/DP = {gbs // max(1, lay.dp)} "
        f"= {gbs // max(1, lay.dp * mbs)} x mbs {mbs}",
    )


def _check_vllm(
    cfg: dict[str, Any], lay: ParallelLayout, dims: ModelDims | None, report: _Report
) -> None:
    vcfg = "policy.generation.vllm_cfg"
    problems = []
    engine = lay.vllm_tp * lay.vllm_pp
    if engine > lay.world or lay.world % engine:
        problems.append(
            f"vLLM TP x PP = {lay.vllm_tp} x {lay.vllm_pp} = {engine} must divide the {lay.world} GPUs"
        )
    if lay.vllm_pp > 1 and not _get(cfg, vcfg + ".async_engine", False):
        problems.append(
            f"{vcfg}.pipeline_parallel_size={lay.vllm_pp} > 1 needs {vcfg}.async_engine=true"
        )
    if lay.vllm_ep > 1:
        if lay.vllm_ep % lay.vllm_tp:
            problems.append(
                f"{vcfg}.expert_parallel_size={lay.vllm_ep} must be a multiple of "
                f"tensor_parallel_size={lay.vllm_tp} (vLLM's EP = DP x TP)"
            )
        if dims is not None and (dims.num_experts == 0 or dims.num_experts % lay.vllm_ep):
            problems.append(
                f"{vcfg}.expert_parallel_size={lay.vllm_ep} does not divide the "
                f"{dims.num_experts} experts"
            )
    if dims is not None:
        heads, kv = dims.num_attention_heads, dims.num_key_value_heads
        if heads % lay.vllm_tp or (kv % lay.vllm_tp and lay.vllm_tp % kv):
            problems.append(
                f"{vcfg}.tensor_parallel_size={lay.vllm_tp} must divide the {heads} query heads "
                f"and divide or be a multiple of the {kv} KV heads"
            )
    report.add(
        "vllm_parallel",
        problems,
        f"{lay.vllm_engines} engine(s) of TP={lay.vllm_tp} PP={lay.vllm_pp} EP={lay.vllm_ep}",
    )


def _fp8_shards(dims: ModelDims, tp: int, ep: int) -> dict[str, float]:
    """Per-rank sizes of the block-quantized dims of one vLLM TP rank.

    Output dim of column-parallel layers, input dim of row-parallel ones; K = hidden is
    never split. Values are floats when TP does not divide a dim (then never a multiple).
    """
    kv_per_rank = max(dims.num_key_value_heads / tp, 1)  # vLLM replicates KV heads if TP > kv
    shards: dict[str, float] = {
        "hidden_size (K of q/k/v, gate/up)": dims.hidden_size,
        "q_proj out / o_proj in = heads x head_dim / TP": (
            dims.num_attention_heads * dims.head_dim / tp
        ),
        "k/v_proj out = max(kv_heads / TP, 1) x head_dim": kv_per_rank * dims.head_dim,
    }
    if dims.num_experts:
        # With expert parallelism vLLM keeps each expert whole on one rank.
        expert_tp = 1 if ep > 1 else tp
        shards[f"expert gate/up out / down in = moe_intermediate / {expert_tp}"] = (
            dims.moe_intermediate_size / expert_tp
        )
    else:
        shards["gate/up out / down in = intermediate / TP"] = dims.intermediate_size / tp
    return shards


def _check_vllm_fp8_shards(
    cfg: dict[str, Any], lay: ParallelLayout, dims: ModelDims, report: _Report
) -> None:
    if _get(cfg, "policy.generation.vllm_cfg.precision") != "fp8":
        return
    problems = [
        f"{name} = {size:g} is not divisible by {FP8_BLOCK} at vLLM tensor_parallel_size="
        f"{lay.vllm_tp} (block-FP8 weights need 128-aligned shards)"
        for name, size in _fp8_shards(dims, lay.vllm_tp, lay.vllm_ep).items()
        if size != int(size) or int(size) % FP8_BLOCK
    ]
    report.add(
        "vllm_fp8_shards",
        problems,
        f"all block-quantized shards at TP={lay.vllm_tp} are multiples of {FP8_BLOCK}",
    )


def check_config(cfg: dict[str, Any]) -> list[CheckResult]:
    """Run every check on a loaded config (see the module docstring); never raises on content.

    Arm mixins (no ``policy``/``cluster``) get the ``loss_fn.ais`` check only.
    """
    report = _Report()
    _check_ais(cfg, report)
    if is_mixin(cfg):
        return report.results
    model_name = _get(cfg, "policy.model_name", "")
    dims = find_model_dims(model_name)
    if dims is None:
        report.warn(
            "model_dims",
            f"policy.model_name={model_name!r} is not in MODEL_DIMS: head, expert and FP8 "
            f"shard checks skipped (add its config.json shapes to cluster_check.MODEL_DIMS)",
        )
    if _get(cfg, "policy.generation.colocated.enabled", True) is False:
        report.warn("layout", "non-colocated generation: the GPU split is not checked")
    lay = parallel_layout(cfg)
    _check_entry_point(cfg, report)
    _check_checkpointing(cfg, report)
    _check_fp8_rollout(cfg, report)
    _check_megatron(cfg, lay, dims, report)
    _check_batch(cfg, lay, report)
    _check_vllm(cfg, lay, dims, report)
    if dims is not None:
        _check_vllm_fp8_shards(cfg, lay, dims, report)
    return report.results


def validate_config(cfg: dict[str, Any], source: str = "config") -> list[CheckResult]:
    """Run :func:`check_config`; raise one ``ValueError`` listing every failed check.

    Raises:
        ValueError: ``"<source>: N check(s) failed:"`` then one ``[FAIL] name: detail`` line each.
    """
    results = check_config(cfg)
    failed = [r for r in results if r.status == "fail"]
    if failed:
        lines = "\n".join(f"  {r}" for r in failed)
        raise ValueError(f"{source}: {len(failed)} check(s) failed:\n{lines}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the check results of each config; exit 1 if any check fails.

    ``--get KEY`` (for scripts, repeatable) runs the checks silently, prints failures to
    stderr and exits 1, or prints the resolved values (one line per config) and exits 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m nemo_ais.nemo_rl.cluster_check",
        description="Check NeMo-RL GRPO+AIS configs offline (parallel sizes, FP8 shards, "
        "loss_fn.ais).",
    )
    parser.add_argument("configs", nargs="+", help="YAML files, then Hydra-style overrides (k=v)")
    parser.add_argument(
        "--get",
        metavar="KEY",
        action="append",
        help="if the checks pass, print this resolved value (repeatable: one line, space-separated)",
    )
    parser.add_argument("--quiet", action="store_true", help="print failures only (to stderr)")
    args = parser.parse_args(argv)
    paths = [a for a in args.configs if a.endswith((".yaml", ".yml")) and "=" not in a]
    overrides = [a for a in args.configs if a not in paths]
    if not paths:
        parser.error("give at least one .yaml config")
    quiet = args.quiet or args.get is not None
    n_failed = 0
    for path in paths:
        try:
            cfg = load_config(path, overrides)
        except (OSError, TypeError, ValueError) as err:
            print(f"{path}: cannot load: {err}", file=sys.stderr)
            n_failed += 1
            continue
        results = check_config(cfg)
        failed = [r for r in results if r.status == "fail"]
        n_failed += bool(failed)
        if not quiet:
            print(path + ("" if is_mixin(cfg) else _layout_line(cfg)))
            print("\n".join(f"  {r}" for r in results))
        elif failed:
            print(f"{path}:", *(f"  {r}" for r in failed), sep="\n", file=sys.stderr)
        if args.get and is_mixin(cfg):
            print(
                f"{path}: an arm mixin (no policy/cluster section), not a full config: name it "
                f"after a model config in a defaults: list (see configs/nemo_rl/experiments/)",
                file=sys.stderr,
            )
            n_failed += 1
        elif args.get and not failed:
            values = [_get(cfg, key) for key in args.get]
            unset = [key for key, value in zip(args.get, values, strict=True) if value is None]
            if unset:
                print(f"{path}: {', '.join(unset)} not set", file=sys.stderr)
                n_failed += 1
            else:
                print(*values)
    return 1 if n_failed else 0


def _layout_line(cfg: dict[str, Any]) -> str:
    nodes, gpus = _get(cfg, "cluster.num_nodes", 1), _get(cfg, "cluster.gpus_per_node", 1)
    return f" ({_get(cfg, 'policy.model_name')}, {nodes} node(s) x {gpus} GPU(s) = {nodes * gpus})"


if __name__ == "__main__":
    sys.exit(main())
