# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Per-token correction weights: the mode's record picks one small function (rho = pi_old / mu).

Algorithm box (``docs/method.md``; **[reconstruction]** of arXiv 2605.13907 where marked):

1. log-ratio        l_it = log pi_old,it - log mu_it        (prev_logprobs - generation_logprobs)
                    rho_it = exp(l_it) = pi_old / mu        (trainer over rollout engine)
2. weight w_hat_it, by mode (chosen once: ``MODES[mode].weight``, :mod:`nemo_ais.modes`):

   ============= ============================================ ==================================
   mode          w_hat_it                                     config fields
   ============= ============================================ ==================================
   none          1                                            --
   tis           clamp(rho, floor, C)                         weight_cap C, tis.floor
   icepop        rho * 1[lo <= rho <= hi]                     icepop.min lo, icepop.max hi
   seq_mask_geo  rho * 1[lo <= exp(mean_t l_it) <= hi]        seq_mask_geo.min lo, .max hi
   ais           (1 - alpha) + alpha * min(rho, C)            weight_cap C; alpha from the
                 **[reconstruction]**                         diagnostics (one per global batch)
   seq_tis       min(exp(S_i), C_s),  S_i = sum_t l_it        seq_weight_cap C_s (veRL seq TIS)
                 = exp(clamp(S_i, -L, log C_s))
   seq_mis       exp(min(S_i, log C_s)) * 1[log lo <= S_i     seq_mis.min lo, seq_mis.max hi,
                 <= log hi]                                   seq_weight_cap (veRL seq MIS)
   kl_rs         1[s_i <= thr] * 1[no token rho < v]          kl_rs.estimator k, .aggregation,
                 s_i = abs(mean_t k(l_it)) or max_t abs(k)    .threshold thr, .veto_min_ratio
                 k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l      v (veRL k1/k2/k3 rejection + veto)
   m2po          1[(l^c_it)^2 < q*]; q* from the global       m2po.tau; q* from the diagnostics
                 histogram of l^2 (one per global batch)      (AReaL M2PO, binned: see stats)
   tbpo          min(exp(mean_t l_it), C_s)                   seq_weight_cap C_s (QaRL's
                 = exp(clamp(S_i / n_i, -L, log C_s))         sequence mismatch weight); the
                 **[reconstruction]**                         loss swaps in its sequence-ratio
                                                              surrogate (Mode.surrogate)
   ============= ============================================ ==================================

   ``batch_normalize`` (IS modes, applied in the loss): w_hat / w_bar, w_bar the global
   mean of w over valid tokens (seq_tis / seq_mis / tbpo: over sequences), from the diagnostics.

3. w_hat_it = 0 where m_it = 0, so the weight doubles as the weighted mask of the loss.

Weights are detached (no gradient flows through mu or pi_old). ``tis`` and ``ais``
cap rho at C, so exp() overflow (l > 88 in float32) gives C, never inf; ``icepop``
drops such tokens; ``seq_mask_geo`` takes rho = exp(clamp(l, +-log_ratio_clamp)).
NeMo-RL's ``seq-mask-tis`` is our ``seq_mask_geo``. Each weight function lives in its
mode's module (:mod:`nemo_ais.modes`); :data:`WEIGHT_FNS` is the registry of records.
"""

from __future__ import annotations

import torch

from nemo_ais.config import CorrectionConfig, require_config
from nemo_ais.modes import MODES, Mode, compute_dtype, log_ratio

__all__ = ["WEIGHT_FNS", "compute_dtype", "correction_weights", "log_ratio"]

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
        logp_old: ``[B, T]`` trainer log-probs at the start of the step (``prev_logprobs``).
        logp_rollout: ``[B, T]`` rollout-engine log-probs (``generation_logprobs``).
        mask: ``[B, T]`` bool or float in {0, 1} (token_mask x sample_mask).
        config: the ``loss_fn.ais`` section.
        alpha: the global-batch value of the mode (``MODES[mode].batch_field`` of the
            diagnostics): alpha for ``ais``, the threshold q* for ``m2po``; required there.

    Returns:
        ``[B, T]`` detached weights, float32 (float64 for float64 input), 0 where mask == 0.

    Raises:
        ValueError: mode ``ais`` without ``alpha``.
        TypeError: ``config`` is not a :class:`~nemo_ais.config.CorrectionConfig` (a dict:
            build it with ``CorrectionConfig(**d)``).
    """
    require_config(config, CorrectionConfig, "correction_weights(config)")
    mode = MODES[config.mode]
    if mode.needs_alpha and alpha is None:
        raise ValueError(
            f"correction_weights: mode {config.mode!r} needs alpha (pass AISDiagnostics.alpha "
            "from compute_diagnostics)"
        )
    valid = mask if mask.dtype == torch.bool else mask == 1
    return mode.weight(logp_old, logp_rollout, valid, config, alpha)
