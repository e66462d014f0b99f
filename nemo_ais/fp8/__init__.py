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
"""Rollout precision: the FP8, MXFP8, NVFP4 (and MXFP4) quantizers, the refit stream, KV scales.

Pure PyTorch; the Transformer Engine backend (:mod:`nemo_ais.fp8.te_backend`) is imported
lazily. Where each format lives and its conventions: ``docs/low_precision.md``.
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
from nemo_ais.fp8.mxfp4 import MXFP4Tensor, dequantize_mxfp4, quantize_mxfp4
from nemo_ais.fp8.mxfp8 import MXFP8Tensor, dequantize_mxfp8, fake_quantize_mxfp8, quantize_mxfp8
from nemo_ais.fp8.nvfp4 import NVFP4Tensor, dequantize_nvfp4, fake_quantize_nvfp4, quantize_nvfp4
from nemo_ais.fp8.quant import (
    E4M3_MAX,
    dequantize_activations,
    dequantize_blockwise,
    quantize_activations,
    quantize_blockwise,
)
from nemo_ais.fp8.stream import Fp8SyncConfig, Fp8SyncPlan, fp8_weight_stream, plan_fp8_sync
from nemo_ais.fp8.stream_block import BlockSyncConfig, block_weight_stream, plan_block_sync

__all__ = [
    "E4M3_MAX",
    "BlockSyncConfig",
    "Fp8SyncConfig",
    "Fp8SyncPlan",
    "KVScaleCalibrator",
    "KVScaleConfig",
    "KVScales",
    "MXFP4Tensor",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "block_weight_stream",
    "collect_engine_kv_scales",
    "dequantize_activations",
    "dequantize_blockwise",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "fake_quantize_mxfp8",
    "fake_quantize_nvfp4",
    "fp8_weight_stream",
    "kv_scale_names",
    "plan_block_sync",
    "plan_fp8_sync",
    "quantize_activations",
    "quantize_blockwise",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "require_calibrated_kv_scales",
    "verify_kv_scales",
]
