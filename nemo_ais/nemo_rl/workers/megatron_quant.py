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
"""AIS worker on NeMo-RL's ModelOpt QAT Megatron worker (QARL; import only in that worker's venv).

``policy.quant_cfg`` makes NeMo-RL's ``Policy`` pick
``nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker.MegatronQuantPolicyWorker``
(``resolve_policy_worker_cls``, v0.7.0 and main): the trainer's forward runs ModelOpt fake
quantization of the recipe (straight-through backward), ``get_logprobs`` (``prev_logprobs``)
included, and the refit exports packed NVFP4 weights for a real-quant vLLM rollout (or folds
``weight_quantizer(weight)`` into BF16 for any other rollout). This is QARL's rollout-aligned
trainer, upstream's own. :class:`AISMegatronQuantPolicyWorker` adds the AIS prepare step
(:class:`~nemo_ais.nemo_rl.workers.mixin.AISTrainMixin`), so ``loss_fn.ais`` (e.g.
``mode: tbpo``) trains on it.

Upstream decorates the class itself with ``@ray.remote`` (there is no ``...Impl`` as for the
BF16 worker) and Ray forbids subclassing an actor class, so the base is the decorated
class's ``__ray_actor_class__``: the class as upstream wrote it.

What of our BF16 Megatron worker applies here (read in both versions): all of
:class:`~nemo_ais.nemo_rl.workers.megatron.AISMegatronMixin`. The quant worker overrides
neither ``calibrate_qkv_fp8_scales`` nor the refit entry points
(``stream_weights_via_ipc_zmq`` / ``broadcast_weights_for_collective``); it overrides
``_iter_params_with_optional_kv_scales(kv_scales)``, which both call with the scales they
are given, and its real-quant export streams each q/k/v scale of an FP8 KV cache from those
(1.0 when absent): the same v0.7.0 colocated-refit gap as the BF16 worker, closed the same
way. Our calibration hooks ``core_attention``, which ModelOpt's layer spec keeps.
"""

import ray
from nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker import (
    MegatronQuantPolicyWorker,
)
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker

from nemo_ais.nemo_rl.workers.megatron import AISMegatronMixin

__all__ = ["AISMegatronQuantPolicyWorker", "MegatronQuantPolicyWorkerImpl"]

MegatronQuantPolicyWorkerImpl = MegatronQuantPolicyWorker.__ray_actor_class__
"""Upstream's ``MegatronQuantPolicyWorker`` without its ``@ray.remote`` wrapper."""


@ray.remote(
    runtime_env=get_runtime_env_for_policy_worker("megatron_quant_policy_worker")
)  # pragma: no cover
class AISMegatronQuantPolicyWorker(AISMegatronMixin, MegatronQuantPolicyWorkerImpl):
    """``MegatronQuantPolicyWorker`` (ModelOpt fake-quant trainer) + the AIS prepare step."""
