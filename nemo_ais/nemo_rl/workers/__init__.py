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

Each module subclasses one of NeMo-RL's worker implementations with
:class:`~nemo_ais.nemo_rl.workers.mixin.AISTrainMixin`, which runs the per-global-batch
AIS prepare step (:mod:`nemo_ais.nemo_rl.seam`) at the top of ``train()``. The Megatron
workers (BF16, and NeMo-RL's ModelOpt QAT worker that ``policy.quant_cfg`` selects: QARL)
also override ``calibrate_qkv_fp8_scales`` with our FP8 KV-scale calibration
(:mod:`nemo_ais.megatron.kv_calibration`). The modules
import NeMo-RL, Megatron or Automodel: they are imported by fully-qualified name inside
the Ray worker processes only, never by the driver.

============================================================ ==============================
worker (fqn)                                                 NeMo-RL base / DP group
============================================================ ==============================
``nemo_ais.nemo_rl.workers.megatron.AISMegatronPolicyWorker``  ``MegatronPolicyWorkerImpl``;
                                                             ``parallel_state`` DP group
``nemo_ais.nemo_rl.workers.megatron_quant.``                   ``MegatronQuantPolicyWorker``
``AISMegatronQuantPolicyWorker``                               (its ``__ray_actor_class__``);
                                                             ``parallel_state`` DP group
``nemo_ais.nemo_rl.workers.dtensor.AISDTensorPolicyWorker``    ``DTensorPolicyWorkerImpl``;
                                                             ``dp_mesh`` group
``nemo_ais.nemo_rl.workers.dtensor_v2.AISDTensorPolicyWorkerV2`` ``DTensorPolicyWorkerV2Impl``;
                                                             ``dp_mesh`` group
============================================================ ==============================
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
