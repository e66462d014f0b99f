# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``seq_mis``: w_hat_i = min(prod rho, C_s) * 1[lo <= prod_t rho_t <= hi] (veRL seq MIS)."""

from __future__ import annotations

import math

from pydantic import Field

from nemo_ais.modes._base import Interval, capped_exp, interval_mode, seq_log_weight


class SeqMisConfig(Interval):
    """``loss_fn.ais.seq_mis``: the kept interval of the sequence ratio prod_t rho_t."""

    min: float = Field(0.5, gt=0.0, description="seq_mis: a sequence is kept iff lo <= prod_t rho_t <= hi.")
    max: float = Field(2.0, gt=0.0, description="seq_mis: upper bound hi of prod_t rho_t.")


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat_i = min(prod rho, C_s) if lo <= prod_t rho_t <= hi else 0 (veRL sequence MIS)."""
    log_w = seq_log_weight(logp_old, logp_rollout, valid)
    kept = (log_w >= math.log(config.seq_mis.min)) & (log_w <= math.log(config.seq_mis.max))
    return capped_exp(log_w, config).mul(valid & kept)


MODE = interval_mode("seq_mis", weight, SeqMisConfig, "seq_mis_", replay=None, mode_stats=True, seq_level=True)
