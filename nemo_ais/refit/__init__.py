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
"""The refit into vLLM: the weight stream of every format and the KV-cache scales sent with it."""

from nemo_ais.refit.kv_scales import (
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
    collect_engine_kv_scales,
    kv_scale_names,
    require_calibrated_kv_scales,
    verify_kv_scales,
)
from nemo_ais.refit.stream import (
    BlockSyncConfig,
    Fp8SyncConfig,
    Fp8SyncPlan,
    RefitConfig,
    RefitPlan,
    RefitStream,
    block_weight_stream,
    fp8_weight_stream,
    plan_block_sync,
    plan_fp8_sync,
    plan_refit,
    refit_stream,
)

__all__ = [
    "BlockSyncConfig",
    "Fp8SyncConfig",
    "Fp8SyncPlan",
    "KVScaleCalibrator",
    "KVScaleConfig",
    "KVScales",
    "RefitConfig",
    "RefitPlan",
    "RefitStream",
    "block_weight_stream",
    "collect_engine_kv_scales",
    "fp8_weight_stream",
    "kv_scale_names",
    "plan_block_sync",
    "plan_fp8_sync",
    "plan_refit",
    "refit_stream",
    "require_calibrated_kv_scales",
    "verify_kv_scales",
]
