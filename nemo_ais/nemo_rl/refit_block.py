# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NVFP4 / MXFP8 refit seam: a BF16 trainer's weights quantized in the vLLM worker.

NeMo-RL refits an NVFP4 engine only from a ModelOpt trainer that exports packed NVFP4;
with a BF16 trainer the vLLM worker must quantize, as for FP8. The FP8 seam's hook
(:mod:`nemo_ais.nemo_rl.refit`) gets a second mode, armed by :data:`ENV_VAR` (the JSON
of a :class:`~nemo_ais.refit.config.BlockSyncConfig`):

* :func:`install` wraps ``is_fp8_model`` (NVFP4: also True for a ``ModelOptNvFp4Config``
  engine, so the refit reaches ``load_weights``) and ``load_weights``, which streams the
  pairs of :func:`refit_block_pairs` into ONE ``model.load_weights`` call.
* :func:`refit_block_pairs` quantizes what the engine holds in the format (NVFP4: layers
  whose quant method is ModelOpt's, found with upstream's ``_get_module_from_param_name``;
  MXFP8: ``_is_fp8_weight``); other tensors pass unchanged (NVFP4) or through upstream's
  ``load_weights`` (MXFP8). Fused shards straddling two chunks are held until complete.
* MXFP8 needs main's ``is_mx`` engine; its scale name defaults to main's
  ``weight_scale_from_checkpoint``. main's own MXFP8 refit gives the same bytes (tested),
  so the config section arms NVFP4 only.
* :func:`configure` -- the launcher's step: ``ais_nvfp4_refit`` -> :data:`ENV_VAR` and the
  hook folder first on ``PYTHONPATH``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_ais.config import require_config
from nemo_ais.formats.registry import get_format
from nemo_ais.nemo_rl import compat, vllm_refit
from nemo_ais.nemo_rl.vllm_refit import BLOCK_RECORDED_SIGNATURES as RECORDED_SIGNATURES
from nemo_ais.refit.stream import BlockSyncConfig, RefitStream
from nemo_ais.rules.config_keys import get
from nemo_ais.rules.native_kernels import NATIVE_KERNELS

__all__ = [
    "ENV_VAR",
    "HOOK_DIR",
    "RECORDED_SIGNATURES",
    "SECTION",
    "config_from_env",
    "configure",
    "engine_is_nvfp4",
    "holds_nvfp4",
    "install",
    "refit_block_pairs",
]

logger = logging.getLogger(__name__)

ENV_VAR = "NEMO_AIS_BLOCK_REFIT"
SECTION = "ais_nvfp4_refit"
HOOK_DIR = Path(__file__).resolve().parent / "_vllm_hook"  # its sitecustomize arms the hook
# vLLM's ModelOpt NVFP4 classes, matched by name in the MRO (no vLLM import)
NVFP4_QUANT_CONFIG = "ModelOptNvFp4Config"
NVFP4_METHODS = frozenset({"ModelOptNvFp4LinearMethod", "ModelOptNvFp4FusedMoE"})
_GROUPED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _mro_names(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__} if obj is not None else set()


def engine_is_nvfp4(vllm_config: Any) -> bool:
    """True when vLLM's quant config is ModelOpt NVFP4 (W4A4 or W4A16, any subclass)."""
    return NVFP4_QUANT_CONFIG in _mro_names(getattr(vllm_config, "quant_config", None))


def holds_nvfp4(upstream: Any, model: Any, name: str) -> bool:
    """True when the engine holds ``name`` in NVFP4 (its layer's quant method is ModelOpt NVFP4).

    Raises:
        ValueError: ``name`` is a grouped expert slab of NVFP4 experts (export per-expert names).
    """
    grouped = name.endswith(_GROUPED_EXPERTS)
    if not name.endswith(".weight") and not grouped:
        return False
    layer = upstream._get_module_from_param_name(model, name)
    nvfp4 = bool(_mro_names(getattr(layer, "quant_method", None)) & NVFP4_METHODS)
    if grouped and nvfp4:
        raise ValueError(
            f"{name}: a grouped expert slab of NVFP4 experts; the NVFP4 refit quantizes "
            "per-expert weights (...mlp.experts.<e>.gate_proj.weight), export those"
        )
    return nvfp4 and not grouped


refit_block_pairs = vllm_refit.engine_pairs


def _check_signatures(module: Any) -> None:
    fix = (
        "(NeMo-RL v0.7.0 and main). Re-check nemo_ais/nemo_rl/refit_block.py against this "
        f"NeMo-RL version or unset {ENV_VAR}."
    )
    names = ("load_weights", "_is_fp8_weight", "is_fp8_model", "_get_module_from_param_name")
    vllm_refit.check_signatures(module, names, RECORDED_SIGNATURES, fix)


def _input_amax(config: BlockSyncConfig) -> dict[str, float] | None:
    if not get_format(config.format).static_input_amax:
        return None
    if config.input_amax_file is None:
        raise ValueError(
            f"{ENV_VAR}: format nvfp4_w4a4 needs input_amax_file (JSON {{module or fused group: "
            "calibrated input amax}}): the refit streams input_scale = amax / (6 * 448)"
        )
    return json.loads(Path(config.input_amax_file).read_text())


def install(module: Any, config: BlockSyncConfig) -> bool:
    """Wrap ``module.load_weights`` (and, for NVFP4, ``is_fp8_model``); False if already patched.

    Raises:
        RuntimeError: signatures differ. ValueError: W4A4 without ``input_amax_file``.
        TypeError: ``config`` is not a :class:`BlockSyncConfig`.
    """
    require_config(config, BlockSyncConfig, "refit_block.install(config)")
    if getattr(module.load_weights, vllm_refit.PATCHED, False):
        return False
    try:
        _check_signatures(module)
        stream = RefitStream(_hook_config(config), _input_amax(config))
    except (RuntimeError, ValueError) as err:
        logger.warning(
            "nemo_ais: AIS %s refit NOT installed in pid %d: %s", config.format, os.getpid(), err
        )
        raise
    nvfp4 = _family(config) == "nvfp4"
    original_load, original_is_fp8_model = module.load_weights, module.is_fp8_model
    held_nvfp4: dict[tuple[int, str], bool] = {}  # as upstream caches _is_fp8_weight

    def holds(model: Any, name: str) -> bool:
        key = (id(model), name)
        if key not in held_nvfp4:
            held_nvfp4[key] = holds_nvfp4(module, model, name)
        return held_nvfp4[key]

    def is_fp8_model(vllm_config):
        return (nvfp4 and engine_is_nvfp4(vllm_config)) or original_is_fp8_model(vllm_config)

    def load_weights(weights, model_runner):
        model = model_runner.model
        _require_engine(module, model_runner, config)
        if nvfp4:
            engine_holds = functools.partial(holds, model)
            passthrough = vllm_refit.unchanged
        else:
            engine_holds = functools.partial(module._is_fp8_weight, model=model)
            passthrough = vllm_refit.upstream_pairs(original_load, model)
        model.load_weights(refit_block_pairs(weights, engine_holds, stream, passthrough))

    vllm_refit.patch(module, "load_weights", load_weights)
    if nvfp4:
        vllm_refit.patch(module, "is_fp8_model", is_fp8_model)
    logger.warning(
        "nemo_ais: %s.load_weights wrapped in pid %d: the BF16 refit is quantized to %s by "
        "nemo_ais.fp8",
        module.__name__,
        os.getpid(),
        config.format,
    )
    return True


def _family(config: BlockSyncConfig) -> str:
    """The vLLM method family of the configured format (``nvfp4`` or ``mxfp8``)."""
    return NATIVE_KERNELS[config.format].family


def _hook_config(config: BlockSyncConfig) -> BlockSyncConfig:
    """``mxfp8_scale_name: None`` -> NeMo-RL main's refit name ``weight_scale_from_checkpoint``."""
    if config.mxfp8_scale_name is not None:
        return config
    return config.model_copy(update={"mxfp8_scale_name": "weight_scale_from_checkpoint"})


def _require_engine(upstream: Any, model_runner: Any, config: BlockSyncConfig) -> None:
    """The engine is in the configured format, else ``RuntimeError`` naming both."""
    if _family(config) == "mxfp8":
        if not compat.upstream_quantizes_mx(upstream):
            raise RuntimeError(
                f"{ENV_VAR}: format=mxfp8 but NeMo-RL's FP8 config is not MXFP8 (needs "
                "policy.generation.vllm_cfg.precision: fp8 and is_mx: true, NeMo-RL main)"
            )
        return
    vllm_config = getattr(model_runner, "vllm_config", None)
    if vllm_config is not None and not engine_is_nvfp4(vllm_config):
        found = type(getattr(vllm_config, "quant_config", None)).__name__
        raise RuntimeError(
            f"{ENV_VAR}: format={config.format} but the vLLM engine's quant config is "
            f"{found}, expected a {NVFP4_QUANT_CONFIG} (a ModelOpt NVFP4 engine)"
        )


def config_from_env(environ: dict[str, str] | None = None) -> BlockSyncConfig | None:
    """The :class:`BlockSyncConfig` in :data:`ENV_VAR` (None when unset)."""
    return vllm_refit.config_from_env(ENV_VAR, BlockSyncConfig, environ)


def configure(
    config: Mapping[str, Any], environ: dict[str, str] | None = None
) -> BlockSyncConfig | None:
    """Arm the NVFP4 refit from the ``ais_nvfp4_refit`` section (None: absent or disabled).

    Defaults come from the engine config, so the stream keeps in BF16 what vLLM keeps:
    ``ignore`` = ``policy.generation.real_quant_ignore`` (else NeMo-RL's
    ``DEFAULT_NVFP4_IGNORE``), ``tp_size`` = ``vllm_cfg.tensor_parallel_size``. Sets
    :data:`ENV_VAR` and puts :data:`HOOK_DIR` first on ``PYTHONPATH`` (before Ray starts).

    Raises:
        ValueError: naming the field: an invalid section, a non-NVFP4 format, W4A4 without
            ``input_amax_file``, ``real_quant`` not true, or ``ais_fp8_refit`` enabled too.
    """
    from nemo_ais.config import validate_section

    section = config.get(SECTION)
    if section is None:
        return None
    generation = get(config, "policy.generation", {})
    vllm_cfg = get(generation, "vllm_cfg", {})
    engine = {"tp_size": vllm_cfg.get("tensor_parallel_size", 1)}
    if "ignore" not in section:
        engine["ignore"] = tuple(_engine_ignore(generation))
    refit_cfg = validate_section(BlockSyncConfig, {**engine, **section}, SECTION)
    if not refit_cfg.enabled:
        return None
    problems = _configure_problems(config, generation, refit_cfg)
    if problems:
        raise ValueError("; ".join(problems))
    environ = os.environ if environ is None else environ
    environ[ENV_VAR] = refit_cfg.model_dump_json()
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    hook = str(HOOK_DIR)
    environ["PYTHONPATH"] = os.pathsep.join([hook, *(p for p in parts if p != hook)])
    return refit_cfg


def _engine_ignore(generation: Mapping[str, Any]) -> list[str]:
    ignore = generation.get("real_quant_ignore")
    if ignore is not None:
        return list(ignore)
    from nemo_rl.modelopt.utils import DEFAULT_NVFP4_IGNORE  # NeMo-RL's own default

    return list(DEFAULT_NVFP4_IGNORE)


def _configure_problems(
    config: Mapping[str, Any], generation: Mapping[str, Any], refit_cfg: BlockSyncConfig
) -> list[str]:
    problems = []
    if _family(refit_cfg) != "nvfp4":
        problems.append(
            f"{SECTION}.format={refit_cfg.format!r} is invalid: expected nvfp4_w4a16 or "
            "nvfp4_w4a4 (MXFP8 rollouts refit through NeMo-RL main's own MXFP8 quantizer, the "
            "same bytes)"
        )
    if get_format(refit_cfg.format).static_input_amax and refit_cfg.input_amax_file is None:
        problems.append(
            f"{SECTION}.input_amax_file=None is invalid with format nvfp4_w4a4: expected a "
            "JSON {module or fused group: calibrated input amax} (the refit streams "
            "input_scale = amax / (6 * 448))"
        )
    if generation.get("real_quant") is not True:
        problems.append(
            f"{SECTION}.enabled=true needs policy.generation.real_quant: true (got "
            f"{generation.get('real_quant')!r}): it quantizes the refit for NeMo-RL's "
            "ModelOpt NVFP4 vLLM engine"
        )
    fp8 = config.get("ais_fp8_refit")
    if isinstance(fp8, Mapping) and fp8.get("enabled", True):
        problems.append(
            f"ais_fp8_refit and {SECTION} are both enabled: one engine has one weight "
            "format (set ais_fp8_refit.enabled: false)"
        )
    return problems
