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
"""Per-token correction weights, one small function per mode (ratio rho = pi_old / mu).

Algorithm box (``docs/method.md``; **[reconstruction]** of arXiv 2605.13907 where marked):

1. log-ratio        l_it = log pi_old,it - log mu_it        (prev_logprobs - generation_logprobs)
                    rho_it = exp(l_it) = pi_old / mu        (trainer over rollout engine)
2. weight w_hat_it, by mode (chosen once from :data:`WEIGHT_FNS`):

   ============= ============================================ ==================================
   mode          w_hat_it                                     config fields
   ============= ============================================ ==================================
   none          1                                            --
   tis           clamp(rho, floor, C)                         weight_cap C, weight_floor
   icepop        rho * 1[lo <= rho <= hi]                     icepop_min lo, icepop_max hi
   seq_mask_geo  rho * 1[lo <= exp(mean_t l_it) <= hi]        seq_mask_min lo, seq_mask_max hi
   ais           (1 - alpha) + alpha * min(rho, C)            weight_cap C; alpha from the
                 **[reconstruction]**                         diagnostics (one per global batch)
   seq_tis       min(exp(S_i), C_s),  S_i = sum_t l_it        seq_weight_cap C_s (veRL seq TIS)
                 = exp(clamp(S_i, -L, log C_s))
   seq_mis       exp(min(S_i, log C_s)) * 1[log lo <= S_i     seq_mis_min lo, seq_mis_max hi,
                 <= log hi]                                   seq_weight_cap (veRL seq MIS)
   kl_rs         1[s_i <= thr] * 1[no token rho < v]          rs_estimator k, rs_aggregation,
                 s_i = abs(mean_t k(l_it)) or max_t abs(k)    rs_threshold thr, rs_veto_min_ratio
                 k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l      v (veRL k1/k2/k3 rejection + veto)
   m2po          1[(l^c_it)^2 < q*]; q* from the global           m2po_tau; q* from the diagnostics
                 histogram of l^2 (one per global batch)      (AReaL M2PO, binned: see stats)
   tbpo          min(exp(mean_t l_it), C_s)                   seq_weight_cap C_s (QaRL's
                 = exp(clamp(S_i / n_i, -L, log C_s))         sequence mismatch weight); the
                 **[reconstruction]**                         loss swaps in its sequence-ratio
                                                              surrogate (WeightFn.surrogate)
   ============= ============================================ ==================================

   ``batch_normalize`` (IS modes, applied in the loss): w_hat / w_bar, w_bar the global
   mean of w over valid tokens (seq_tis / seq_mis / tbpo: over sequences), from the diagnostics.

3. w_hat_it = 0 where m_it = 0, so the weight doubles as the weighted mask of the loss.

Weights are detached (no gradient flows through mu or pi_old). ``tis`` and ``ais``
cap rho at C, so exp() overflow (l > 88 in float32) gives C, never inf; ``icepop``
drops such tokens; ``seq_mask_geo`` takes rho = exp(clamp(l, +-log_ratio_clamp)).
NeMo-RL's ``seq-mask-tis`` is our ``seq_mask_geo``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from nemo_ais.config import CorrectionConfig, require_config

__all__ = ["WEIGHT_FNS", "WeightFn", "compute_dtype", "correction_weights", "log_ratio"]


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 inputs are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def log_ratio(
    logp_old: torch.Tensor, logp_rollout: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Step 1: l = log pi_old - log mu at valid positions, 0 elsewhere.

    Args:
        logp_old: ``[B, T]`` trainer log-probs (``prev_logprobs``), any float dtype.
        logp_rollout: ``[B, T]`` rollout log-probs (``generation_logprobs``).
        valid: bool ``[B, T]``, ``mask == 1``.

    Returns:
        ``[B, T]`` detached, float32 (float64 if an input is float64). Masked positions
        hold 0, so -inf padding never produces NaN.
    """
    dtype = compute_dtype(logp_old, logp_rollout)
    log_rho = logp_old.detach().to(dtype) - logp_rollout.detach().to(dtype)
    return torch.where(valid, log_rho, torch.zeros((), dtype=dtype, device=log_rho.device))


def _w_none(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = 1 (the ratio is never computed)."""
    return valid.to(compute_dtype(logp_old, logp_rollout))


def _w_tis(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = clamp(rho, floor, C); floor = weight_floor or 0 (NeMo-RL ``tis``)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    floor = config.weight_floor if config.weight_floor is not None else 0
    w_tok = torch.exp(log_rho).clamp_(min=floor, max=config.weight_cap)
    return w_tok.mul_(valid)


def _w_icepop(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = rho * 1[lo <= rho <= hi] (NeMo-RL ``icepop``)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    rho = torch.exp(log_rho)
    kept = (rho >= config.icepop_min) & (rho <= config.icepop_max) & valid
    return torch.where(kept, rho, torch.zeros((), dtype=rho.dtype, device=rho.device))


def _w_seq_mask_geo(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = rho * 1[lo <= rho_geo,i <= hi], rho_geo,i = exp(mean_t l_it) (NeMo-RL ``seq-mask-tis``)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    n_tok_seq = valid.sum(dim=-1).clamp(min=1)
    rho_geo_seq = torch.exp(log_rho.sum(dim=-1) / n_tok_seq)
    kept_seq = (rho_geo_seq >= config.seq_mask_min) & (rho_geo_seq <= config.seq_mask_max)
    clamp = config.log_ratio_clamp
    rho = torch.exp(log_rho.clamp(min=-clamp, max=clamp))
    return rho.mul_(valid & kept_seq.unsqueeze(-1))


def _w_ais(logp_old, logp_rollout, valid, config, alpha):
    """w_hat = (1 - alpha) + alpha * min(rho, C) ([reconstruction]).

    Hot path (every micro-batch): five elementwise ops, no sanitising pass; garbage at
    masked positions (inf, NaN) is dropped by the final ``where``.
    """
    dtype = compute_dtype(logp_old, logp_rollout)
    log_rho = logp_old.detach().to(dtype) - logp_rollout.detach().to(dtype)
    w_tok = torch.exp_(log_rho).clamp_(max=config.weight_cap)
    w_hat = w_tok.mul_(alpha).add_(1 - alpha)
    return torch.where(valid, w_hat, torch.zeros((), dtype=dtype, device=w_hat.device))


def _seq_log_weight(logp_old, logp_rollout, valid):
    """S_i = sum_t l_it over valid tokens, ``[B, 1]`` (float64 for float64 input)."""
    return log_ratio(logp_old, logp_rollout, valid).sum(dim=-1, keepdim=True)


def _capped_exp(log_w, config):
    """min(exp(log_w), C_s) = exp(clamp(log_w, -L, log C_s)), exactly C_s where capped."""
    log_cap = math.log(config.seq_weight_cap)
    w = log_w.clamp(min=-config.log_ratio_clamp, max=log_cap).exp()
    return torch.where(log_w >= log_cap, config.seq_weight_cap, w)


def _w_seq_tis(logp_old, logp_rollout, valid, config, alpha):
    """w_hat_i = min(prod_t rho_t, C_s) = exp(clamp(S_i, -L, log C_s)) (veRL sequence TIS)."""
    log_w = _seq_log_weight(logp_old, logp_rollout, valid)
    return _capped_exp(log_w, config).mul(valid)


def _w_seq_mis(logp_old, logp_rollout, valid, config, alpha):
    """w_hat_i = min(prod rho, C_s) if lo <= prod_t rho_t <= hi else 0 (veRL sequence MIS)."""
    log_w = _seq_log_weight(logp_old, logp_rollout, valid)
    kept = (log_w >= math.log(config.seq_mis_min)) & (log_w <= math.log(config.seq_mis_max))
    return _capped_exp(log_w, config).mul(valid & kept)


def _kl_rs_statistic(log_rho, valid, config):
    """s_i = abs(mean_t k(l_it)) or max_t abs(k(l_it)), ``[B, 1]``."""
    c = config.log_ratio_clamp
    ell = log_rho.clamp(min=-c, max=c)
    k = {
        "k1": lambda: -ell,
        "k2": lambda: ell.square() / 2,
        "k3": lambda: torch.expm1(ell) - ell,
    }[config.rs_estimator]().mul(valid)
    if config.rs_aggregation == "max":
        return k.abs().amax(dim=-1, keepdim=True) if k.shape[-1] > 0 else k.sum(-1, keepdim=True)
    n = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    return (k.sum(dim=-1, keepdim=True) / n).abs()


def _w_kl_rs(logp_old, logp_rollout, valid, config, alpha):
    """w_hat_i = 1[s_i <= thr] * 1[no valid token with rho < v] (rejection, no IS weight)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    kept = _kl_rs_statistic(log_rho, valid, config) <= config.rs_threshold
    if config.rs_veto_min_ratio is not None:
        vetoed = (log_rho < math.log(config.rs_veto_min_ratio)) & valid
        kept = kept & ~vetoed.any(dim=-1, keepdim=True)
    return (valid & kept).to(log_rho.dtype)


def _w_m2po(logp_old, logp_rollout, valid, config, threshold):
    """w_hat_it = 1[clamp(l_it, +-L)^2 < q*] (AReaL M2PO, binned).

    q* is the global batch's (the diagnostics' ``m2po_threshold``; 1e4 > L^2: nothing masked).
    """
    c = config.log_ratio_clamp
    log_rho = log_ratio(logp_old, logp_rollout, valid).clamp_(min=-c, max=c)
    return (valid & (log_rho.square() < threshold)).to(log_rho.dtype)


def _w_tbpo(logp_old, logp_rollout, valid, config, alpha):
    """w_hat_i = min(rho_geo,i, C_s) = exp(clamp(S_i / n_i, -L, log C_s)) (QaRL TBPO)."""
    n_tok_seq = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    log_w = _seq_log_weight(logp_old, logp_rollout, valid) / n_tok_seq
    return _capped_exp(log_w, config).mul(valid)


class WeightFn(NamedTuple):
    """A mode's weight function and the global-batch value it needs (None: none).

    ``batch_field`` names the :class:`~nemo_ais.core.AISDiagnostics` field passed as the
    function's last argument: ``alpha`` (ais) or ``m2po_threshold`` (m2po).
    """

    fn: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, CorrectionConfig, float | None], torch.Tensor
    ]
    batch_field: str | None = None
    seq_level: bool = False  # one weight per sequence (batch_normalize averages over sequences)
    surrogate: str = "token"  # the loss's step-4 surrogate: token PPO clip, or "tbpo"

    @property
    def needs_alpha(self) -> bool:
        """True if the weight needs a value of the global batch (alpha, the m2po threshold)."""
        return self.batch_field is not None


WEIGHT_FNS: dict[str, WeightFn] = {
    "none": WeightFn(_w_none),
    "tis": WeightFn(_w_tis),
    "icepop": WeightFn(_w_icepop),
    "seq_mask_geo": WeightFn(_w_seq_mask_geo),
    "ais": WeightFn(_w_ais, batch_field="alpha"),
    "seq_tis": WeightFn(_w_seq_tis, seq_level=True),
    "seq_mis": WeightFn(_w_seq_mis, seq_level=True),
    "kl_rs": WeightFn(_w_kl_rs),
    "m2po": WeightFn(_w_m2po, batch_field="m2po_threshold"),
    "tbpo": WeightFn(_w_tbpo, seq_level=True, surrogate="tbpo"),
}


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
        alpha: the global-batch value of the mode (``WEIGHT_FNS[mode].batch_field`` of the
            diagnostics): alpha for ``ais``, the threshold q* for ``m2po``; required there.

    Returns:
        ``[B, T]`` detached weights, float32 (float64 for float64 input), 0 where mask == 0.

    Raises:
        ValueError: mode ``ais`` without ``alpha``.
        TypeError: ``config`` is not a :class:`~nemo_ais.config.CorrectionConfig` (a dict:
            build it with ``CorrectionConfig(**d)``).
    """
    require_config(config, CorrectionConfig, "correction_weights(config)")
    weight_fn = WEIGHT_FNS[config.mode]
    if weight_fn.needs_alpha and alpha is None:
        raise ValueError(
            f"correction_weights: mode {config.mode!r} needs alpha (pass AISDiagnostics.alpha "
            "from compute_diagnostics)"
        )
    valid = mask if mask.dtype == torch.bool else mask == 1
    return weight_fn.fn(logp_old, logp_rollout, valid, config, alpha)
