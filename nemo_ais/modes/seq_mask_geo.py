# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``seq_mask_geo``: w_hat = rho * 1[lo <= exp(mean_t l_it) <= hi] (NeMo-RL ``seq-mask-tis``)."""

from __future__ import annotations

from pydantic import Field

from nemo_ais.modes._base import Interval, interval_mode, log_ratio


class SeqMaskGeoConfig(Interval):
    """``loss_fn.ais.seq_mask_geo``: the kept interval of the geometric-mean ratio."""

    min: float = Field(0.999, gt=0.0, description="seq_mask_geo: lower bound of the geometric-mean ratio.")
    max: float = Field(1.002, gt=0.0, description="seq_mask_geo: upper bound of the geometric-mean ratio.")


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat = rho * 1[lo <= rho_geo,i <= hi], rho_geo,i = exp(mean_t l_it); rho clamped at +-L."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    n_tok_seq = valid.sum(dim=-1).clamp(min=1)
    rho_geo_seq = (log_rho.sum(dim=-1) / n_tok_seq).exp()
    kept_seq = (rho_geo_seq >= config.seq_mask_geo.min) & (rho_geo_seq <= config.seq_mask_geo.max)
    clamp = config.log_ratio_clamp
    rho = log_rho.clamp(min=-clamp, max=clamp).exp()
    return rho.mul_(valid & kept_seq.unsqueeze(-1))


MODE = interval_mode("seq_mask_geo", weight, SeqMaskGeoConfig, "seq_mask_")
