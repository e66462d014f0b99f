# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``seq_tis``: w_hat_i = min(prod_t rho_t, C_s) = exp(clamp(S_i, -L, log C_s)) (veRL)."""

from __future__ import annotations

from nemo_ais.modes._base import Mode, capped_exp, seq_log_weight


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat_i = min(prod_t rho_t, C_s) = exp(clamp(S_i, -L, log C_s)) (veRL sequence TIS)."""
    log_w = seq_log_weight(logp_old, logp_rollout, valid)
    return capped_exp(log_w, config).mul(valid)


MODE = Mode(name="seq_tis", weight=weight, mode_stats=True, seq_level=True)
