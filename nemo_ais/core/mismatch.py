# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Step 7b of the loss: the rollout-mismatch metrics of one call, in the summable form.

Per valid token (rho = pi_old / mu, l = log rho, r = pi_theta / pi_old; k the ``reference_policy_kl_type`` estimator):

==================================== ===================================================
key                                  value
==================================== ===================================================
``mismatch/mult_prob_error``         mean_t exp(abs(l))
``mismatch/kl_rollout_old``          mean_t k(l)                  (KL(mu || pi_old))
``mismatch/kl_old_rollout``          mean_t k(-l)                 (KL(pi_old || mu))
``mismatch/js_divergence``           mean_t [softplus(l) - l / 2 - log 2]
``mismatch/entropy``                 -mean_t exp(log pi_theta - log mu) log pi_theta
``mismatch/ratio_min`` / ``_max``    min / max of r over valid tokens
``mismatch/ratio_clamped_min/_max``  min / max of clip(r) over valid tokens
==================================== ===================================================

They are ``ClippedPGLossFn``'s metrics (the adapter renames them, :data:`nemo_ais.nemo_rl.seam.NEMO_RL_MISMATCH_NAMES`),
except that every exponent is clamped at ``log_ratio_clamp`` so each is finite whenever the loss is.
"""

from __future__ import annotations

import math

import torch

from nemo_ais.config import PGLossConfig
from nemo_ais.core.surrogate import KL_VALUES, LossInputs, Surrogate

LOG_2 = math.log(2)

# min / max-reduced across calls (every other key is summed)
MISMATCH_EXTREMES = (
    "mismatch/ratio_min",
    "mismatch/ratio_max",
    "mismatch/ratio_clamped_min",
    "mismatch/ratio_clamped_max",
)


def _weighted_sum_(values: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """sum_it values_it c_it of a temporary, scaled in place (``values`` is overwritten)."""
    return values.mul_(coef).sum()


@torch.no_grad()
def mismatch_metrics(
    x: LossInputs, sur: Surrogate, tok_coef: torch.Tensor, n_tok_local: float, pg: PGLossConfig, log_ratio_clamp: float
) -> dict[str, torch.Tensor]:
    """The module table's metrics, 0-dim detached tensors (no host sync; +-inf if empty)."""
    c = log_ratio_clamp
    kl_value = KL_VALUES[pg.reference_policy_kl_type]
    log_rho = x.log_rho.clamp(-c, c)
    exp_l, exp_neg_l = torch.exp(log_rho), torch.neg(log_rho).exp_()
    ratio = sur.r
    if pg.disable_ppo_ratio or not sur.token_ratio:  # the entropy wants the token ratio
        ratio = x.log_r.clamp(-c, c).exp_()
    theta_over_mu = torch.mul(ratio, exp_l).clamp_(max=math.exp(c))  # pi_theta / mu
    big = torch.finfo(theta_over_mu.dtype).max  # the entropy term's +-inf -> +-big
    js = torch.nn.functional.softplus(log_rho).sub_(log_rho, alpha=0.5).sub_(LOG_2)
    entropy = theta_over_mu.mul_(x.logp_theta).clamp_(-big, big)
    out = {  # each temporary is ours: scaled in place, then summed; exp_l is reused last
        "mismatch/kl_rollout_old": _weighted_sum_(kl_value(log_rho, exp_l), tok_coef),
        "mismatch/kl_old_rollout": _weighted_sum_(kl_value(-log_rho, exp_neg_l), tok_coef),
        "mismatch/js_divergence": _weighted_sum_(js, tok_coef),
        "mismatch/entropy": -_weighted_sum_(entropy, tok_coef),
        "mismatch/mult_prob_error": _weighted_sum_(torch.maximum(exp_l, exp_neg_l, out=exp_l), tok_coef),
    }
    return {**out, **_ratio_extremes(sur, x.m, n_tok_local, pg)}


def _ratio_extremes(sur: Surrogate, m: torch.Tensor, n_tok_local: float, pg: PGLossConfig):
    """Min / max of r and clip(r) over valid tokens; +inf / -inf if there is none."""
    if n_tok_local == 0:
        inf = torch.full((), math.inf, dtype=m.dtype, device=m.device)
        return dict(zip(MISMATCH_EXTREMES, (inf, -inf, inf, -inf), strict=True))
    pad = torch.sub(1, m).mul_(torch.finfo(m.dtype).max)  # masked positions out of min / max
    r_valid = sur.r * m
    r_min, r_max = (r_valid + pad).min(), r_valid.sub_(pad).max()
    if pg.disable_ppo_ratio:
        r_clip_min, r_clip_max = r_min, r_max
    elif not sur.token_ratio:  # tbpo: the band depends on the sign of A
        r_clip_valid = sur.r_clip * m
        r_clip_min, r_clip_max = (r_clip_valid + pad).min(), r_clip_valid.sub_(pad).max()
    else:
        bounds = dict(min=1 - pg.ratio_clip_min, max=1 + pg.ratio_clip_max)
        r_clip_min, r_clip_max = r_min.clamp(**bounds), r_max.clamp(**bounds)
    return dict(zip(MISMATCH_EXTREMES, (r_min, r_max, r_clip_min, r_clip_max), strict=True))
