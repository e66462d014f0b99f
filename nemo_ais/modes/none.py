# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``none``: w_hat = 1, the uncorrected clipped loss (NeMo-RL's ``ClippedPGLossFn``)."""

from __future__ import annotations

from nemo_ais.modes._base import Mode, compute_dtype, uncorrected


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat = 1 (the ratio is never computed)."""
    return valid.to(compute_dtype(logp_old, logp_rollout))


MODE = Mode(name="none", weight=weight, importance_weight=False, applied_alpha=uncorrected)
