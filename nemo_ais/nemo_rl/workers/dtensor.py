# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""AIS DTensorPolicyWorker (import only inside a NeMo-RL DTensor worker process)."""

import ray
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.dtensor_policy_worker import DTensorPolicyWorkerImpl

from nemo_ais.nemo_rl.workers.mixin import AISDTensorMixin


@ray.remote(runtime_env=get_runtime_env_for_policy_worker("dtensor_policy_worker"))  # pragma: no cover
class AISDTensorPolicyWorker(AISDTensorMixin, DTensorPolicyWorkerImpl):
    """``DTensorPolicyWorker`` + the AIS prepare step over the ``dp`` mesh group."""
