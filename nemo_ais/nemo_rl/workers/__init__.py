# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""AIS policy workers for NeMo-RL v0.7.0 and main (``worker_extension_cls_fqn`` targets).

Each is a NeMo-RL worker + :class:`~nemo_ais.nemo_rl.workers.mixin.AISTrainMixin`, imported by fqn in Ray workers only.
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
