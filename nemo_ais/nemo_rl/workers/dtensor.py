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
"""AIS DTensorPolicyWorker (import only inside a NeMo-RL DTensor worker process)."""

import ray
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.dtensor_policy_worker import DTensorPolicyWorkerImpl

from nemo_ais.nemo_rl.workers.mixin import AISDTensorMixin

__all__ = ["AISDTensorPolicyWorker"]


@ray.remote(
    runtime_env=get_runtime_env_for_policy_worker("dtensor_policy_worker")
)  # pragma: no cover
class AISDTensorPolicyWorker(AISDTensorMixin, DTensorPolicyWorkerImpl):
    """``DTensorPolicyWorker`` + the AIS prepare step over the ``dp`` mesh group."""
