# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``ais``: w_hat = (1 - alpha) + alpha min(rho, C) **[reconstruction]** (arXiv 2605.13907)."""

from __future__ import annotations

from nemo_ais.modes._base import Mode, Replay, log_ratio, where_valid


def weight(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = (1 - alpha) + alpha * min(rho, C) [reconstruction]; ``where`` drops masked junk."""
    w_tok = log_ratio(logp_old, logp_rollout, valid).exp_().clamp_(max=config.weight_cap)
    w_hat = w_tok.mul_(alpha).add_(1 - alpha)
    return where_valid(valid, w_hat)


def batch_mean(alpha: float, w_mean: float) -> float:
    """Global mean of w_hat from the fixed statistics: (1 - alpha) + alpha * mean min(rho, C)."""
    return (1 - alpha) + alpha * w_mean


MODE = Mode(
    name="ais",
    weight=weight,
    applied_alpha=lambda diagnostics: diagnostics["alpha"],
    batch_field="alpha",
    batch_mean=batch_mean,
    replay=Replay(frac_capped=lambda diagnostics: diagnostics.frac_capped if diagnostics.alpha > 0 else 0.0),
)
