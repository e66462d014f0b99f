# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``tbpo``: QaRL's trust-band policy optimisation **[reconstruction]** (arXiv 2604.07853).

The loss swaps the token PPO clip for the band of the sequence ratio (:func:`nemo_ais.core.surrogate.tbpo_surrogate`).
"""

from __future__ import annotations

from pydantic import Field

from nemo_ais.modes._base import Mode, capped_exp, flat_keys, seq_log_weight
from nemo_ais.sections import FLOAT32_MAX, Section


class TbpoConfig(Section):
    """``loss_fn.ais.tbpo``: the trust band of the sequence ratio s_i, by the sign of A."""

    clip_low: float = Field(3e-4, gt=0.0, lt=1.0, description="tbpo, A >= 0: s_i clipped below at 1 - this (GSPO).")
    clip_high: float = Field(
        4e-4, gt=0.0, le=FLOAT32_MAX, description="tbpo, A >= 0: s_i clipped above at 1 + this (QaRL 4e-4)."
    )
    neg_clip_low: float = Field(
        3e-4, gt=0.0, lt=1.0, description="tbpo, A < 0: lower edge 1 - this of the two-sided band (QaRL 3e-4)."
    )
    neg_clip_high: float = Field(
        7e-4, gt=0.0, le=FLOAT32_MAX, description="tbpo, A < 0: upper edge 1 + this of the band (QaRL 7e-4)."
    )


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat_i = min(rho_geo,i, C_s) = exp(clamp(S_i / n_i, -L, log C_s)) (QaRL TBPO)."""
    n_tok_seq = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    log_w = seq_log_weight(logp_old, logp_rollout, valid) / n_tok_seq
    return capped_exp(log_w, config).mul(valid)


MODE = Mode(
    name="tbpo",
    weight=weight,
    mode_stats=True,
    seq_level=True,
    surrogate="tbpo",
    surrogate_conflicts={
        "disable_ppo_ratio": "tbpo's surrogate is built on the sequence ratio",
        "use_cispo": "tbpo has its own sequence-ratio surrogate, CISPO's replaces the PPO clip",
        "sequence_level_importance_ratios": "tbpo has its own sequence-ratio surrogate (its band is loss_fn.ais.tbpo)",
        "token_level_loss": "tbpo's objective is a mean over sequences, -mean_i[m_i f_i], as GSPO's (NeMo-RL asserts "
        "token_level_loss false for it): a token mean would weigh each sequence by its length",
    },
    unused_options=("ratio_clip_min", "ratio_clip_max", "ratio_clip_c"),
    unused_why="its surrogate clips the sequence ratio to the band loss_fn.ais.tbpo.clip_low/"
    "clip_high (A >= 0) and loss_fn.ais.tbpo.neg_clip_low/neg_clip_high (A < 0)",
    config=TbpoConfig,
    moved_keys=flat_keys("tbpo_", "clip_low", "clip_high", "neg_clip_low", "neg_clip_high"),
)
