# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``kl_rs``: KL rejection sampling, w_hat_i = 1[s_i <= thr] * 1[no token rho < v] (veRL)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from nemo_ais.modes._base import Mode, flat_keys, log_ratio
from nemo_ais.sections import Section


class KlRsConfig(Section):
    """``loss_fn.ais.kl_rs``: the per-sequence KL statistic, its threshold and the token veto."""

    estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="kl_rs: per-token KL(mu || pi_old) estimate k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l."
    )
    aggregation: Literal["mean", "max"] = Field(
        "mean", description="kl_rs: per-sequence statistic abs(mean_t k) or max_t abs(k)."
    )
    threshold: float = Field(0.01, gt=0.0, description="kl_rs: a sequence is rejected if its statistic > this.")
    veto_min_ratio: float | None = Field(
        None, gt=0.0, lt=1.0, description="kl_rs: also reject a sequence with any token rho < this (None: no veto)."
    )


_ESTIMATORS = {"k1": lambda ell: -ell, "k2": lambda ell: ell.square() / 2, "k3": lambda ell: ell.expm1() - ell}


def _statistic(log_rho, valid, config):
    """s_i = abs(mean_t k(l_it)) or max_t abs(k(l_it)), ``[B, 1]``; k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l."""
    c = config.log_ratio_clamp
    ell = log_rho.clamp(min=-c, max=c)
    k = _ESTIMATORS[config.kl_rs.estimator](ell).mul(valid)
    if config.kl_rs.aggregation == "max":
        return k.abs().amax(dim=-1, keepdim=True) if k.shape[-1] > 0 else k.sum(-1, keepdim=True)
    n = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    return (k.sum(dim=-1, keepdim=True) / n).abs()


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat_i = 1[s_i <= thr] * 1[no valid token with rho < v] (rejection, no IS weight)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    kept = _statistic(log_rho, valid, config) <= config.kl_rs.threshold
    if config.kl_rs.veto_min_ratio is not None:
        vetoed = (log_rho < math.log(config.kl_rs.veto_min_ratio)) & valid
        kept = kept & ~vetoed.any(dim=-1, keepdim=True)
    return (valid & kept).to(log_rho.dtype)


MODE = Mode(
    name="kl_rs",
    weight=weight,
    importance_weight=False,
    mode_stats=True,
    config=KlRsConfig,
    moved_keys=flat_keys("rs_", "estimator", "aggregation", "threshold", "veto_min_ratio"),
)
