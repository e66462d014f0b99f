# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Per-token correction weights: the mode's record picks one small function (rho = pi_old / mu).

Algorithm box (``docs/method.md``; **[reconstruction]** where marked):

1. l_it = log pi_old,it - log mu_it, rho_it = exp(l_it)
2. w_hat_it = ``MODES[mode].weight`` (:mod:`nemo_ais.modes`):

   ============= ============================================ ==============================
   mode          w_hat_it                                     knobs
   ============= ============================================ ==============================
   none          1                                            --
   tis           clamp(rho, floor, C)                         weight_cap, tis.floor
   icepop        rho * 1[lo <= rho <= hi]                     icepop.min / max
   seq_mask_geo  rho * 1[lo <= exp(mean_t l_it) <= hi]        seq_mask_geo.min / max
   ais           (1 - alpha) + alpha * min(rho, C)            weight_cap; alpha per global
                 **[reconstruction]**                         batch (diagnostics)
   seq_tis       exp(clamp(S_i, -L, log C_s)), S_i = sum_t l  seq_weight_cap (veRL)
   seq_mis       exp(min(S_i, log C_s)) 1[lo <= e^S_i <= hi]  seq_mis.min / max (veRL)
   kl_rs         1[s_i <= thr] 1[no token rho < v]            kl_rs.* (veRL rejection)
   m2po          1[(l^c)^2 < q*], q* of the global batch      m2po.tau (AReaL M2PO)
   tbpo          exp(clamp(S_i / n_i, -L, log C_s))           seq_weight_cap (QaRL)
                 **[reconstruction]**
   ============= ============================================ ==============================

   ``batch_normalize``: w_hat / w_bar, the global batch mean (from the diagnostics).
3. w_hat_it = 0 where m_it = 0; weights are detached and finite (caps, clamps).
"""

from __future__ import annotations

import math

import torch

from nemo_ais.config import CorrectionConfig, require_config
from nemo_ais.core import validation
from nemo_ais.modes import MODES, Mode, compute_dtype as compute_dtype, log_ratio as log_ratio

# mode -> its record (weight function, global-batch value, sequence level, surrogate)
WEIGHT_FNS: dict[str, Mode] = MODES


@torch.no_grad()
def correction_weights(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    alpha: float | None = None,
) -> torch.Tensor:
    """Steps 1-3: the detached per-token weight w_hat of ``config.mode``.

    Args:
        logp_old: ``[B, T]`` trainer log-probs (``prev_logprobs``).
        logp_rollout: ``[B, T]`` rollout-engine log-probs (``generation_logprobs``).
        mask: ``[B, T]`` bool or float in {0, 1}.
        alpha: the mode's global-batch value (``batch_field``: alpha, m2po's q*).

    Returns:
        ``[B, T]`` detached, float32 (float64 for float64 input), 0 where mask == 0.

    Raises:
        ValueError: a mode that needs ``alpha`` without it (or a non-finite one); a shape, device, mask value not in
            {0, 1} or NaN / inf at a valid position, naming the input.
        TypeError: an input or ``config`` of the wrong type.
    """
    require_config(config, CorrectionConfig, "correction_weights(config)")
    mode = MODES[config.mode]
    if mode.needs_alpha and (alpha is None or not math.isfinite(alpha)):
        raise ValueError(
            f"correction_weights: mode {config.mode!r} needs a finite alpha, got {alpha!r} (pass "
            f"AISDiagnostics.{mode.batch_field} from compute_diagnostics)"
        )
    validation.check_ratio_inputs(logp_old, logp_rollout, mask)
    validation.check_values({"prev_logprobs": logp_old, "generation_logprobs": logp_rollout}, mask)
    return mode.weight(logp_old, logp_rollout, validation.valid_positions(mask), config, alpha)
