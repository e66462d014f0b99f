# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The AIS method: weights, statistics, diagnostics, mixer and the clipped GRPO loss.

Pure torch (torch, the stdlib, :mod:`nemo_ais.config`, :mod:`nemo_ais.modes`); rho = pi_old / mu everywhere;
[reconstruction] formulas: ``docs/method.md``.
"""

from nemo_ais.config import CorrectionConfig
from nemo_ais.core.diagnostics import AISDiagnostics, AISState, compute_diagnostics, diagnostics_from_stats
from nemo_ais.core.loss import LossOutput, clipped_pg_loss
from nemo_ais.core.metrics import METRICS, MetricSpec, metric_normalizations
from nemo_ais.core.stats import (
    BAD_INPUT_SLOTS,
    NUM_SLOTS,
    STATS_BYTES,
    AISStats,
    Slot,
    compute_statistics,
    reduce_statistics,
)
from nemo_ais.core.weights import WEIGHT_FNS, correction_weights, log_ratio

__all__ = [
    "BAD_INPUT_SLOTS",
    "METRICS",
    "NUM_SLOTS",
    "STATS_BYTES",
    "WEIGHT_FNS",
    "AISDiagnostics",
    "AISState",
    "AISStats",
    "CorrectionConfig",
    "LossOutput",
    "MetricSpec",
    "Slot",
    "clipped_pg_loss",
    "compute_diagnostics",
    "compute_statistics",
    "correction_weights",
    "diagnostics_from_stats",
    "log_ratio",
    "metric_normalizations",
    "reduce_statistics",
]
