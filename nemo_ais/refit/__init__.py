# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
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
