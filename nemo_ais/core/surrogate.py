# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Steps 4-5 of the loss (:mod:`nemo_ais.core.loss`): the clipped surrogate by mode, and the KL.

Step 4 is the record's ``surrogate``: NeMo-RL's token PPO clip (GSPO, CISPO, dual clip, REINFORCE) or tbpo's
sequence-ratio trust band **[reconstruction]** of QaRL (arXiv 2604.07853). Step 5 is NeMo-RL's ``calculate_kl`` times
its importance weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig


class LossInputs(NamedTuple):
    """Step-1 inputs in the compute dtype; detached and 0 where m = 0 unless the field's comment says otherwise."""

    logp_theta: torch.Tensor  # log pi_theta (with its graph; not masked)
    log_r: torch.Tensor  # log pi_theta - log pi_old (with graph; not masked)
    log_rho: torch.Tensor  # l = log pi_old - log mu
    log_q: torch.Tensor | None  # log pi_ref - log pi_theta_kl (KL on; with graph; not masked)
    log_kl_is: torch.Tensor | None  # log pi_theta_kl - log mu (on-policy KL; graph; 0 at m = 0)
    adv: torch.Tensor  # [B, T]
    m: torch.Tensor  # float mask


class Surrogate(NamedTuple):
    """Step 4's per-token clipped loss and the ratios the metrics read."""

    clip_loss: torch.Tensor  # [B, T], carries the graph to log pi_theta
    r: torch.Tensor  # detached, for the metrics
    r_clip: torch.Tensor
    token_ratio: bool = True  # False: r is a sequence ratio (GSPO's, tbpo's s_i), broadcast


def sequence_log_ratio(x: LossInputs, log_ratio_clamp: float) -> torch.Tensor:
    """``[B, 1]`` clamp(mean over the sequence's valid tokens of log r, +-L) (0 if none)."""
    n_tok_seq = x.m.sum(dim=-1, keepdim=True)
    log_s = (x.log_r * x.m).sum(dim=-1, keepdim=True) / torch.where(n_tok_seq > 0, n_tok_seq, 1)
    return log_s.clamp(-log_ratio_clamp, log_ratio_clamp)


def token_surrogate(x: LossInputs, pg: PGLossConfig, config: CorrectionConfig) -> Surrogate:
    """Step 4: per-token clipped surrogate ``[B, T]``, NeMo-RL's (GSPO and CISPO included)."""
    if pg.disable_ppo_ratio:  # before GSPO's ratio, as NeMo-RL
        r = x.logp_theta
        return Surrogate(-x.adv * r, r.detach(), r.detach())
    log_ratio_clamp = config.log_ratio_clamp
    if pg.sequence_level_importance_ratios:
        r = sequence_log_ratio(x, log_ratio_clamp).exp().expand_as(x.m)
    else:
        r = x.log_r.clamp(-log_ratio_clamp, log_ratio_clamp).exp()
    r_clip = r.clamp(1 - pg.ratio_clip_min, 1 + pg.ratio_clip_max)
    neg_adv = -x.adv
    if pg.use_cispo:  # clipped IS weight, no gradient through it; no PPO max, no dual clip
        clip_loss = neg_adv * r_clip.detach() * x.logp_theta
    else:
        clip_loss = torch.max(neg_adv * r, neg_adv * r_clip)
    if pg.ratio_clip_c is not None:  # dual clip (A < 0)
        dual = torch.min(clip_loss, neg_adv * pg.ratio_clip_c)
        clip_loss = torch.where(x.adv < 0, dual, clip_loss)
    return Surrogate(clip_loss, r.detach(), r_clip.detach(), token_ratio=not pg.sequence_level_importance_ratios)


def tbpo_surrogate(x: LossInputs, pg: PGLossConfig, config: CorrectionConfig) -> Surrogate:
    """Step 4, mode tbpo: the trust band of the loss's box ``[B, T]``, no gradient outside it **[reconstruction]**."""
    s = sequence_log_ratio(x, config.log_ratio_clamp).exp().expand_as(x.m)
    band = config.tbpo
    s_pos = s.clamp(1 - band.clip_low, 1 + band.clip_high)
    s_neg = s.clamp(1 - band.neg_clip_low, 1 + band.neg_clip_high)
    neg_adv = -x.adv
    pos_loss = torch.max(neg_adv * s, neg_adv * s_pos)
    clip_loss = torch.where(x.adv < 0, neg_adv * s_neg, pos_loss)
    s_clip = torch.where(x.adv < 0, s_neg, s_pos)
    return Surrogate(clip_loss, s.detach(), s_clip.detach(), token_ratio=False)


# step 4 by ``MODES[mode].surrogate``: the token PPO clip, or tbpo's sequence band
SURROGATES: dict[str, Callable] = {"token": token_surrogate, "tbpo": tbpo_surrogate}


# k(x) of each estimator, given x and e = exp(x) (k3 only; None for k1 / k2)
KL_VALUES: dict[str, Callable] = {
    "k1": lambda x, e: -x,
    "k2": lambda x, e: x.square() / 2,
    "k3": lambda x, e: (e - 1) - x,
}


def kl_penalty(x: LossInputs, pg: PGLossConfig, m: torch.Tensor) -> torch.Tensor:
    """Step 5: per-token clamp(s k(x), +-out) ``[B, T]`` (times beta in step 6).

    x = clamp(log pi_ref - log pi_theta_kl); s = nan_to_num(exp(log pi_theta_kl - log mu)) with
    ``use_on_policy_kl_approximation``, else s = exp(log pi_theta_kl - sg(.)) and s k(x) is written as
    k(x) - (x - sg(x)) sg(k(x)) (the same value and gradient).
    """
    raw = x.log_q
    log_q = torch.where(m.bool(), raw, 0)  # a masked garbage value stays out of exp()
    if pg.kl_input_clamp_value is not None:
        log_q = log_q.clamp(-pg.kl_input_clamp_value, pg.kl_input_clamp_value)
    kind = pg.reference_policy_kl_type
    if kind == "k3":  # exp(x) stays finite (one e-fold below overflow): inf makes the score term inf - 0 * inf = NaN
        log_q = log_q.clamp(max=math.log(torch.finfo(log_q.dtype).max) - 1)
    k = KL_VALUES[kind](log_q, log_q.exp() if kind == "k3" else None)
    if x.log_kl_is is None:
        kl_tok = k - (log_q - log_q.detach()) * k.detach()
    else:  # on-policy approximation: NeMo-RL's nan_to_num(exp(.)), 1 at m = 0 (exponent masked), gradient 0 on overflow
        with torch.no_grad():
            lost = ~torch.isfinite(x.log_kl_is.exp())
        s = torch.where(lost, -math.inf, x.log_kl_is).exp()
        if pg.kl_input_clamp_value is not None:
            s = torch.where(raw == log_q, s, s.detach())
        kl_tok = s * k
    if pg.kl_output_clamp_value is not None:
        kl_tok = kl_tok.clamp(-pg.kl_output_clamp_value, pg.kl_output_clamp_value)
    return kl_tok
