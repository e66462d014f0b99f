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

from typing import Any

import ray
import torch
from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker
from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

from nemo_ais.megatron import get_data_parallel_group
from nemo_ais.megatron.kv_calibration import calibrate_qkv_fp8_scales
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin

__all__ = ["AISMegatronPolicyWorker"]


@ray.remote(
    runtime_env=get_runtime_env_for_policy_worker("megatron_policy_worker")
)  # pragma: no cover
class AISMegatronPolicyWorker(AISTrainMixin, MegatronPolicyWorkerImpl):
    """``MegatronPolicyWorker`` + the AIS prepare step + our FP8 KV-scale calibration."""

    def _ais_dp_group(self):
        return get_data_parallel_group()

    @torch.no_grad()
    def calibrate_qkv_fp8_scales(
        self,
        *,
        data: Any,
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]:
        """NeMo-RL's KV-scale calibration, computed by :mod:`nemo_ais.megatron.kv_calibration`.

        Same signature and result as v0.7.0 (``{"format", "percentile", "margin",
        "layers": {vLLM scale name: float}}``); Q/K/V are read, as upstream, at the
        ``core_attention`` inputs (after q/k-norm and RoPE). Differences: per micro-batch
        ``percentile(|x|)``, max over micro-batches (upstream: a percentile over
        per-micro-batch amaxes); layer keys are global across pipeline stages; ranks are
        combined by ONE ``all_reduce(MAX)`` over the default group (every TP/PP/CP/DP rank
        of the policy) instead of ``all_gather_object`` + ``broadcast_object_list``;
        ``include_q=False`` returns K/V names only (upstream's converter needs
        ``q_scale``); the ``FP8_MAX_Q/K/V`` environment overrides are not read (448).
        """
        self.model.eval()
        return calibrate_qkv_fp8_scales(
            self.model,
            lambda: self.get_logprobs(
                data=data, micro_batch_size=micro_batch_size, require_router_replay=False
            ),
            num_layers=self.megatron_bridge.transformer_config.num_layers,
            percentile=percentile,
            margin=margin,
            include_q=include_q,
            group=torch.distributed.group.WORLD if torch.distributed.is_initialized() else None,
            device=self._ais_device(),
        )
