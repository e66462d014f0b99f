# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The refit into vLLM: the weight stream of every format and the KV-cache scales sent with it.

A lazy face: ``import nemo_ais.refit.config`` (the torch-free section configs the offline check reads) does not
import torch; each name below loads its submodule on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    **dict.fromkeys(
        (
            "KVScaleCalibrator",
            "KVScaleConfig",
            "KVScales",
            "collect_engine_kv_scales",
            "kv_scale_names",
            "require_calibrated_kv_scales",
            "verify_kv_scales",
        ),
        "nemo_ais.refit.kv_scales",
    ),
    **dict.fromkeys(
        (
            "RefitPlan",
            "RefitStream",
            "block_weight_stream",
            "fp8_weight_stream",
            "plan_block_sync",
            "plan_fp8_sync",
            "plan_refit",
            "refit_stream",
        ),
        "nemo_ais.refit.stream",
    ),
    **dict.fromkeys(("BlockSyncConfig", "Fp8SyncConfig", "RefitConfig"), "nemo_ais.refit.config"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
