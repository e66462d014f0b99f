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
"""Blockwise FP8 (E4M3) quantization, the vLLM weight-sync stream and FP8 KV-cache scales.

Pure PyTorch; the Transformer Engine backend (:mod:`nemo_ais.fp8.te_backend`) is imported
lazily. Conventions: ``docs/fp8.md``.
"""

from nemo_ais.fp8.kv_scales import (
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
    collect_engine_kv_scales,
    kv_scale_names,
    require_calibrated_kv_scales,
    verify_kv_scales,
)
from nemo_ais.fp8.quant import (
    E4M3_MAX,
    dequantize_activations,
    dequantize_blockwise,
    quantize_activations,
    quantize_blockwise,
)
from nemo_ais.fp8.stream import Fp8SyncConfig, Fp8SyncPlan, fp8_weight_stream, plan_fp8_sync

__all__ = [
    "E4M3_MAX",
    "Fp8SyncConfig",
    "Fp8SyncPlan",
    "KVScaleCalibrator",
    "KVScaleConfig",
    "KVScales",
    "collect_engine_kv_scales",
    "dequantize_activations",
    "dequantize_blockwise",
    "fp8_weight_stream",
    "kv_scale_names",
    "plan_fp8_sync",
    "quantize_activations",
    "quantize_blockwise",
    "require_calibrated_kv_scales",
    "verify_kv_scales",
]
