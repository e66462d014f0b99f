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
"""AIS policy workers for NeMo-RL v0.7.0 and main (``worker_extension_cls_fqn`` targets).

Each subclasses a NeMo-RL worker with :class:`~nemo_ais.nemo_rl.workers.mixin.AISTrainMixin`
(the prepare step at the top of ``train()``); the Megatron workers also override
``calibrate_qkv_fp8_scales`` (:mod:`nemo_ais.megatron.kv_calibration`). They are imported
by fqn inside the Ray worker processes only. :data:`AIS_WORKER_FQNS` maps each NeMo-RL
worker to its AIS worker.
"""

__all__ = ["AIS_WORKER_FQNS"]

# NeMo-RL's worker fqn -> the AIS worker that extends it (same Python environment).
AIS_WORKER_FQNS = {
    "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker": (
        "nemo_ais.nemo_rl.workers.megatron.AISMegatronPolicyWorker"
    ),
    "nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker.MegatronQuantPolicyWorker": (
        "nemo_ais.nemo_rl.workers.megatron_quant.AISMegatronQuantPolicyWorker"
    ),
    "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker": (
        "nemo_ais.nemo_rl.workers.dtensor.AISDTensorPolicyWorker"
    ),
    "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2": (
        "nemo_ais.nemo_rl.workers.dtensor_v2.AISDTensorPolicyWorkerV2"
    ),
}
