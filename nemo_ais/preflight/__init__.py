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
"""Pre-flight checks of a NeMo-RL GRPO + AIS config, offline, on a login node.

Catches, without NeMo-RL, a GPU or torch, the mistakes that otherwise surface minutes into
a multi-node Slurm job: an ``assert`` in NeMo-RL's ``grpo.setup``, a ``KeyError`` after
Ray started, a DeepGEMM shape error in vLLM's FP8 linear layers, a silently dropped tail
of the rollout batch, a config that does not fit the GPUs (:mod:`.memory_budget`).

**Dependencies** (what the launchers' ``PYTHON`` needs): Python >= 3.11 with
``pydantic>=2.7``, ``omegaconf>=2.3`` and ``pyyaml>=6.0`` (and what pip installs with them:
pydantic-core, annotated-types, typing-extensions, typing-inspection,
antlr4-python3-runtime). Nothing else: not torch, transformers, tqdm, numpy, NeMo-RL,
Megatron, vLLM or Ray (``tests/unit/test_preflight_torch_free.py`` runs it where only the
standard library, ``nemo_ais`` and those packages can be imported). :mod:`.requirements`
holds that list; the launchers run it first as a probe, so a Python that lacks one gets
one line naming ``PYTHON``. Inside ``nemo_ais`` it
imports only :mod:`nemo_ais.config` (with the correction modes' records,
:mod:`nemo_ais.modes`, and :mod:`nemo_ais.sections`) and :mod:`nemo_ais.alarms`, all
torch-free at import.

CLI::

    python -m nemo_ais.preflight CONFIG [OVERRIDE ...] [--quiet] [--get KEY]
                                 [--nemo-rl-version v0.7.0|main]
    python -m nemo_ais.preflight.memory_budget CONFIG [...] [--gpu-gib 80]

(``python -m nemo_ais.nemo_rl.cluster_check`` and ``python -m
nemo_ais.nemo_rl.memory_budget`` are aliases, torch-free too.)

Layout:

* :mod:`.loader`: :func:`load_config` (NeMo-RL's own loader when importable, else
  :func:`load_config_fallback`), :func:`get` (the one dotted-key reader), :func:`is_mixin`.
* :mod:`.model_shapes`: :class:`ModelShape`, :func:`resolve_model_shape` (the model's
  ``config.json`` from a local directory or the HF cache, no download; else the one table
  :data:`MODEL_SHAPES`, saying so).
* :mod:`.layout`: :class:`ParallelLayout` (trainer and vLLM sizes).
* :mod:`.nemo_rl_target`: which NeMo-RL the config runs on (``--nemo-rl-version``, else
  the source at ``NEMO_RL_DIR``, read and never imported) and which rollout formats it has.
* :mod:`.checks`: the registry and :func:`check_config`; the checks live in
  :mod:`.checks.loss` (``loss_fn.ais``), :mod:`.checks.upstream` (NeMo-RL's unguarded
  reads, checkpoint rule), :mod:`.checks.parallel` (trainer, batch, vLLM layout),
  :mod:`.checks.fp8` (FP8 flags, 128-aligned weight shards) and :mod:`.checks.formats`
  (NVFP4 / MXFP8 rollouts: NeMo-RL version, switches, 16- / 32-aligned input dims).
* :mod:`.memory_budget`: per-GPU / per-node memory estimate; :mod:`.cli`: the CLI.

**Adding a check is one function.** Write it in the module of its subject (or a new
module, added to :data:`nemo_ais.preflight.checks.RULE_MODULES`), decorated with
:func:`~nemo_ais.preflight.checks.check`; it reads the config through its
:class:`~nemo_ais.preflight.checks.Context` and returns a
:class:`~nemo_ais.preflight.checks.Verdict` (or None where it does not apply)::

    @check("vllm_nvfp4_shards", needs_shape=True)
    def check_vllm_nvfp4_shards(ctx: Context) -> Verdict | None:
        if ctx.get("policy.generation.vllm_cfg.precision") != "nvfp4":
            return None
        shards = block_quantized_shards(ctx.shape, ctx.layout.vllm_tp, ctx.layout.vllm_ep)
        problems = [f"{name} = {size:g} is not divisible by 16 ..." for name, size in
                    shards.items() if size % 16]
        return Verdict(problems, "every NVFP4 shard is a multiple of 16")

Each problem is one failure line naming the field path, the value and what is expected;
``warnings`` never fail. ``needs_shape=True`` skips the check for a model whose shapes are
unknown; ``mixins=True`` also runs it on an arm mixin (a ``loss_fn.ais`` delta). Then add
a broken variant of a shipped config to ``BROKEN`` in ``tests/unit/test_cluster_configs.py``
(it must fail your check with your message) and a row to the table in docs/cluster.md.
"""

from nemo_ais.preflight.checks import (
    CHECKS,
    CheckResult,
    Context,
    Verdict,
    check,
    check_config,
    validate_config,
)
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
from nemo_ais.preflight.layout import ParallelLayout, parallel_layout
from nemo_ais.preflight.loader import (
    apply_overrides,
    get,
    has,
    is_mixin,
    load_config,
    load_config_fallback,
)
from nemo_ais.preflight.model_shapes import (
    MODEL_SHAPES,
    ModelShape,
    ResolvedShape,
    find_model_shape,
    resolve_model_shape,
)
from nemo_ais.preflight.nemo_rl_target import (
    NEMO_RL_VERSIONS,
    ROLLOUT_FORMATS,
    NeMoRLTarget,
    resolve_target,
)

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
    "has",
    "is_mixin",
    "is_moe",
    "load_config",
    "load_config_fallback",
    "main",
    "parallel_layout",
    "quantized_linears",
    "resolve_model_shape",
    "resolve_target",
    "rollout_format",
    "rollout_format_problems",
    "setup_sees_importance_sampling",
    "supported_versions",
    "validate_config",
]
