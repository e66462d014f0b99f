# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``icepop``: w_hat = rho * 1[lo <= rho <= hi] (NeMo-RL ``icepop``)."""

from __future__ import annotations

from pydantic import Field

from nemo_ais.modes._base import Interval, interval_mode, log_ratio, where_valid


class IcepopConfig(Interval):
    """``loss_fn.ais.icepop``: the kept interval of the token ratio rho."""

    min: float = Field(0.5, gt=0.0, description="icepop: lower bound lo of rho.")
    max: float = Field(5.0, gt=0.0, description="icepop: upper bound hi of rho.")


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat = rho * 1[lo <= rho <= hi] (NeMo-RL ``icepop``)."""
    rho = log_ratio(logp_old, logp_rollout, valid).exp()
    kept = (rho >= config.icepop.min) & (rho <= config.icepop.max) & valid
    return where_valid(kept, rho)


MODE = interval_mode("icepop", weight, IcepopConfig, "icepop_")
