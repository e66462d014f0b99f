# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Pre-flight checks of a NeMo-RL GRPO + AIS config, offline, on a login node.

Catches, without NeMo-RL, a GPU or torch, what otherwise fails minutes into a Slurm job: an ``assert`` in
``grpo.setup``, a ``KeyError`` after Ray started, a DeepGEMM shape error in vLLM's FP8 layers, a dropped tail of the
rollout batch, a config that does not fit the GPUs (:mod:`.memory_budget`). Needs only pydantic, omegaconf and pyyaml
(:mod:`.requirements`; tests/unit/test_preflight_torch_free.py); inside ``nemo_ais`` it imports only the torch-free
:mod:`nemo_ais.config`, :mod:`nemo_ais.rules` and :mod:`nemo_ais.alarms`.

CLI::

    python -m nemo_ais.preflight CONFIG [OVERRIDE ...] [--quiet] [--get KEY] [--paths]
                                 [--nemo-rl-version v0.7.0|main]
    python -m nemo_ais.preflight.memory_budget CONFIG [...] [--gpu-gib 80]

Adding a check is one function decorated with :func:`~nemo_ais.preflight.checks.check` (docs/cluster.md).
"""

from nemo_ais.preflight.checks import CHECKS, CheckResult, Context, Verdict, check, check_config, validate_config
from nemo_ais.preflight.checks.formats import (
    MXFP8_BLOCK,
    NVFP4_BLOCK,
    is_moe,
    quantized_linears,
    rollout_format,
    rollout_format_problems,
    supported_versions,
)
from nemo_ais.preflight.checks.fp8 import FP8_BLOCK, block_quantized_shards, fp8_kv_refit_problems
from nemo_ais.preflight.checks.loss import (
    AIS_CONFLICTS,
    ais_conflicts,
    bypass_kl_in_reward_problems,
    bypass_problems,
    setup_sees_importance_sampling,
)
from nemo_ais.preflight.checks.upstream import ENTRY_POINT_KEYS
from nemo_ais.preflight.cli import main
from nemo_ais.preflight.layout import ParallelLayout, gpu_split, parallel_layout, pipeline_stages
from nemo_ais.preflight.loader import apply_overrides, get, has, is_mixin, load_config, load_config_fallback
from nemo_ais.preflight.model_shapes import (
    MODEL_SHAPES,
    ModelShape,
    ResolvedShape,
    find_model_shape,
    resolve_model_shape,
)
from nemo_ais.preflight.nemo_rl_target import NEMO_RL_VERSIONS, ROLLOUT_FORMATS, NeMoRLTarget, resolve_target

__all__ = [
    "AIS_CONFLICTS",
    "CHECKS",
    "ENTRY_POINT_KEYS",
    "FP8_BLOCK",
    "MODEL_SHAPES",
    "MXFP8_BLOCK",
    "NEMO_RL_VERSIONS",
    "NVFP4_BLOCK",
    "ROLLOUT_FORMATS",
    "CheckResult",
    "Context",
    "ModelShape",
    "NeMoRLTarget",
    "ParallelLayout",
    "ResolvedShape",
    "Verdict",
    "ais_conflicts",
    "apply_overrides",
    "block_quantized_shards",
    "bypass_kl_in_reward_problems",
    "bypass_problems",
    "check",
    "check_config",
    "find_model_shape",
    "fp8_kv_refit_problems",
    "get",
    "gpu_split",
    "has",
    "is_mixin",
    "is_moe",
    "load_config",
    "load_config_fallback",
    "main",
    "parallel_layout",
    "pipeline_stages",
    "quantized_linears",
    "resolve_model_shape",
    "resolve_target",
    "rollout_format",
    "rollout_format_problems",
    "setup_sees_importance_sampling",
    "supported_versions",
    "validate_config",
]
