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
"""AIS Megatron policy worker (import only inside a NeMo-RL Megatron worker process)."""

import ray
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

from nemo_ais.megatron import get_data_parallel_group
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin

__all__ = ["AISMegatronPolicyWorker"]


@ray.remote(
    runtime_env=get_runtime_env_for_policy_worker("megatron_policy_worker")
)  # pragma: no cover
class AISMegatronPolicyWorker(AISTrainMixin, MegatronPolicyWorkerImpl):
    """``MegatronPolicyWorker`` + the AIS prepare step over ``parallel_state``'s DP group."""

    def _ais_dp_group(self):
        return get_data_parallel_group()
