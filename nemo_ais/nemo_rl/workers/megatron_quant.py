# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""AIS worker on NeMo-RL's ModelOpt QAT Megatron worker (QARL; import only in that worker's venv).

``policy.quant_cfg`` makes ``Policy`` pick upstream's ``MegatronQuantPolicyWorker`` (QARL's rollout-aligned trainer):
its forward runs ModelOpt fake quantization (straight-through), ``prev_logprobs`` included, and its refit exports packed
NVFP4. This adds the AIS prepare step and :class:`~nemo_ais.nemo_rl.workers.megatron.AISMegatronMixin`: the quant worker
streams the FP8 KV scales its refit entry points are given, so the mixin closes the same v0.7.0 gap. Ray forbids
subclassing an actor class, so the base is upstream's ``__ray_actor_class__``.
"""

import ray
from nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker import MegatronQuantPolicyWorker
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker

from nemo_ais.nemo_rl.workers.megatron import AISMegatronMixin

MegatronQuantPolicyWorkerImpl = MegatronQuantPolicyWorker.__ray_actor_class__
"""Upstream's ``MegatronQuantPolicyWorker`` without its ``@ray.remote`` wrapper."""


@ray.remote(runtime_env=get_runtime_env_for_policy_worker("megatron_quant_policy_worker"))  # pragma: no cover
class AISMegatronQuantPolicyWorker(AISMegatronMixin, MegatronQuantPolicyWorkerImpl):
    """``MegatronQuantPolicyWorker`` (ModelOpt fake-quant trainer) + the AIS prepare step."""
