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
"""AIS diagnostics and the mixing coefficient alpha, from GLOBAL sufficient statistics.

Algorithm box (**[reconstruction]** of arXiv 2605.13907; ratio rho = pi_old / mu;
sums from :mod:`nemo_ais.core.stats`, already reduced over the data-parallel group):

1. reliability    R    = (sum_i W_i)^2 / (N * sum_i W_i^2)      in (0, 1]  (sequence ESS ratio)
2. severity       D    = sum |l_it| m_it / sum m_it                        (mean |log-ratio|)
3. amplification  CV^2 = (sum w^2 / n) / (sum w / n)^2 - 1                 (token level, w = min(rho, C))
4. gates          g_sev = 1 - exp(-D / tau)                                tau   = severity_scale
                  g_rel = clip((R - r_min) / (1 - r_min), 0, 1)            r_min = reliability_floor
                  g_var = 1 / (1 + CV^2 / kappa)                           kappa = variance_tolerance
                  (a gate disabled in the config is 1)
5. mixer          alpha_raw = g_sev * g_rel * g_var   (mixer=product)
                  alpha_raw = constant_alpha          (mixer=constant)
6. EMA + clamp    alpha_t = clamp(beta * alpha_{t-1} + (1 - beta) * alpha_raw, alpha_min, alpha_max)
                  beta = ``ema``; the first update (no history) takes alpha_raw.

Also reported: KL(mu || pi_old) on samples from mu, k1 = mean(-l), k3 = mean(exp(l) - 1 - l);
w_mean, frac_capped, token_mult_prob_error = mean exp|l|, raw_ratio_mean = mean exp(l).

Determinism: the reduced float64 vector is read to the host ONCE (the only host sync
per global batch) and every formula above is evaluated in Python floats (IEEE float64),
so alpha is bit-identical on every rank that holds the same reduced vector.

Globally empty batch (no valid token anywhere): alpha = alpha_raw = 0, empty_batch = 1,
R = 1, D = 0, CV^2 = 0, k1 = k3 = 0, w_mean = raw_ratio_mean = token_mult_prob_error = 1,
frac_capped = 0, g_sev = 0, g_rel = g_var = 1; the EMA value is left unchanged (an empty
batch carries no evidence), its update counter still advances.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import validation
from nemo_ais.core.stats import AISStats, Slot, compute_statistics, reduce_statistics

__all__ = [
    "AISDiagnostics",
    "AISState",
    "compute_diagnostics",
    "diagnostics_from_stats",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AISDiagnostics:
    """Per-global-batch AIS diagnostics, python floats (identical on every rank)."""

    alpha: float
    alpha_raw: float
    g_sev: float
    g_rel: float
    g_var: float
    ess_seq: float
    severity: float
    cv_w: float
    cv2: float
    kl_k1: float
    kl_k3: float
    w_mean: float
    frac_capped: float
    token_mult_prob_error: float
    raw_ratio_mean: float
    n_seq: float
    n_tok: float
    empty_batch: float

    def as_dict(self) -> dict[str, float]:
        """Field name -> value."""
        return dataclasses.asdict(self)


@dataclass
class AISState:
    """EMA state of alpha; survives checkpoint/resume via ``state_dict``.

    Attributes:
        alpha: last smoothed alpha (None before the first non-empty batch).
        num_updates: number of ``compute_diagnostics`` calls that were given this state
            (each advances it exactly once; an empty batch leaves ``alpha`` unchanged).
    """

    alpha: float | None = None
    num_updates: int = 0

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state for a checkpoint."""
        return {"alpha": self.alpha, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.alpha = None if state["alpha"] is None else float(state["alpha"])
        self.num_updates = int(state["num_updates"])


def _reliability(n_seq: float, w_seq_sum: float, w_seq_sq_sum: float) -> float:
    """Step 1: R = (sum W)^2 / (N sum W^2), capped at 1 against rounding; 1 if N = 0."""
    if n_seq == 0 or w_seq_sq_sum == 0:
        return 1.0
    return min(1.0, w_seq_sum * w_seq_sum / (n_seq * w_seq_sq_sum))


def _severity(n_tok: float, abs_log_rho_sum: float) -> float:
    """Step 2: D = sum |l| / n; 0 if n = 0."""
    return abs_log_rho_sum / n_tok if n_tok > 0 else 0.0


def _cv2(n_tok: float, w_dev_sum: float, w_dev_sq_sum: float) -> float:
    """Step 3: CV^2 = (n sum w^2 - (sum w)^2) / (sum w)^2 from u = w - 1 (shift-invariant).

    n sum w^2 - (sum w)^2 = n sum u^2 - (sum u)^2, and sum w = n + sum u; the shift avoids
    the cancellation of n sum w^2 / (sum w)^2 - 1 when w ~ 1. 0 if n = 0; floored at 0.
    """
    w_sum = n_tok + w_dev_sum
    if n_tok == 0 or w_sum <= 0:
        return 0.0
    return max(0.0, (n_tok * w_dev_sq_sum - w_dev_sum * w_dev_sum) / (w_sum * w_sum))


def _gates(severity: float, ess_seq: float, cv2: float, config: CorrectionConfig):
    """Step 4: (g_sev, g_rel, g_var); a disabled gate is 1."""
    g_sev = 1 - math.exp(-severity / config.severity_scale)
    r_min = config.reliability_floor
    g_rel = min(1.0, max(0.0, (ess_seq - r_min) / (1 - r_min)))
    g_var = 1 / (1 + cv2 / config.variance_tolerance)
    return (
        g_sev if config.use_severity_gate else 1.0,
        g_rel if config.use_reliability_gate else 1.0,
        g_var if config.use_variance_gate else 1.0,
    )


_MIXERS = {
    "product": lambda g_sev, g_rel, g_var, config: g_sev * g_rel * g_var,
    "constant": lambda g_sev, g_rel, g_var, config: config.constant_alpha,
}


def _smooth(alpha_raw: float, config: CorrectionConfig, state: AISState | None) -> float:
    """Step 6: EMA (if a state is given) then clamp to [alpha_min, alpha_max]; advances state."""
    beta = config.ema
    previous = state.alpha if state is not None and state.alpha is not None else alpha_raw
    alpha = beta * previous + (1 - beta) * alpha_raw
    alpha = min(config.alpha_max, max(config.alpha_min, alpha))
    if state is not None:
        state.alpha = alpha
        state.num_updates += 1
    return alpha


def _sums(global_stats: AISStats) -> dict[Slot, float]:
    """The one host sync per global batch: the reduced vector as python floats."""
    values = global_stats.vector.tolist()
    return {slot: values[slot] for slot in Slot}


def _empty_diagnostics() -> AISDiagnostics:
    """Defined result for a globally empty batch (see the module docstring)."""
    return AISDiagnostics(
        alpha=0.0,
        alpha_raw=0.0,
        g_sev=0.0,
        g_rel=1.0,
        g_var=1.0,
        ess_seq=1.0,
        severity=0.0,
        cv_w=0.0,
        cv2=0.0,
        kl_k1=0.0,
        kl_k3=0.0,
        w_mean=1.0,
        frac_capped=0.0,
        token_mult_prob_error=1.0,
        raw_ratio_mean=1.0,
        n_seq=0.0,
        n_tok=0.0,
        empty_batch=1.0,
    )


def _diagnostics_from_sums(
    s: dict[Slot, float], config: CorrectionConfig, state: AISState | None
) -> AISDiagnostics:
    """Steps 1-6 on host floats."""
    n_tok = s[Slot.N_TOK]
    if n_tok == 0:
        logger.warning("AIS: globally empty batch (no valid token); alpha = 0, ais/empty_batch = 1")
        if state is not None:
            state.num_updates += 1
        return _empty_diagnostics()
    ess_seq = _reliability(s[Slot.N_SEQ], s[Slot.W_SEQ_SUM], s[Slot.W_SEQ_SQ_SUM])  # step 1
    severity = _severity(n_tok, s[Slot.ABS_LOG_RHO_SUM])  # step 2
    cv2 = _cv2(n_tok, s[Slot.W_TOK_DEV_SUM], s[Slot.W_TOK_DEV_SQ_SUM])  # step 3
    g_sev, g_rel, g_var = _gates(severity, ess_seq, cv2, config)  # step 4
    alpha_raw = _MIXERS[config.mixer](g_sev, g_rel, g_var, config)  # step 5
    alpha = _smooth(alpha_raw, config, state)  # step 6
    return AISDiagnostics(
        alpha=alpha,
        alpha_raw=alpha_raw,
        g_sev=g_sev,
        g_rel=g_rel,
        g_var=g_var,
        ess_seq=ess_seq,
        severity=severity,
        cv_w=math.sqrt(cv2),
        cv2=cv2,
        kl_k1=-s[Slot.LOG_RHO_SUM] / n_tok,
        kl_k3=(s[Slot.RHO_DEV_SUM] - s[Slot.LOG_RHO_CLAMPED_SUM]) / n_tok,
        w_mean=1 + s[Slot.W_TOK_DEV_SUM] / n_tok,
        frac_capped=s[Slot.N_CAPPED] / n_tok,
        token_mult_prob_error=1 + s[Slot.EXP_ABS_DEV_SUM] / n_tok,
        raw_ratio_mean=1 + s[Slot.RHO_DEV_SUM] / n_tok,
        n_seq=s[Slot.N_SEQ],
        n_tok=n_tok,
        empty_batch=0.0,
    )


_BAD_SLOTS = {
    "prev_logprobs/generation_logprobs": Slot.N_BAD_LOGPROBS,
    "mask": Slot.N_BAD_MASK,
}


def diagnostics_from_stats(
    global_stats: AISStats, config: CorrectionConfig, state: AISState | None = None
) -> AISDiagnostics:
    """Steps 1-6 from reduced statistics: R, D, CV^2, gates, alpha ([reconstruction]).

    Args:
        global_stats: statistics already summed over the data-parallel group.
        config: the ``loss_fn.ais`` section.
        state: EMA state; advanced once (a globally empty batch keeps its alpha).

    Returns:
        :class:`AISDiagnostics`; the documented finite result for an empty batch.

    Raises:
        ValueError: the statistics count bad input values (on every rank alike).
    """
    s = _sums(global_stats)
    for name, slot in _BAD_SLOTS.items():
        if s[slot] > 0:
            raise ValueError(
                f"{name}: {int(s[slot])} bad values (NaN, inf, or mask not in {{0, 1}}) "
                "summed over the process group"
            )
    return _diagnostics_from_sums(s, config, state)


def compute_diagnostics(
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    group: torch.distributed.ProcessGroup | None = None,
    state: AISState | None = None,
) -> AISDiagnostics:
    """Statistics -> ONE all-reduce -> diagnostics, for one global batch.

    Call once per global batch (every rank of ``group``, same number of times) and pass
    the result to every micro-batch's :func:`~nemo_ais.core.loss.clipped_pg_loss`.

    Args:
        prev_logprobs: ``[B, T]`` trainer log-probs pi_old, any float dtype.
        generation_logprobs: ``[B, T]`` rollout-engine log-probs mu.
        mask: ``[B, T]`` bool or float in {0, 1} (token_mask x sample_mask).
        config: the ``loss_fn.ais`` section.
        group: data-parallel process group; None = single process, no collective.
        state: EMA state of alpha, advanced exactly once.

    Returns:
        :class:`AISDiagnostics` (python floats, bit-identical on every rank).

    Raises:
        TypeError, ValueError: bad type/shape/device (locally, before the collective).
        ValueError: NaN / inf / mask values not in {0, 1} anywhere in the group, raised on
            every rank after the collective, naming the tensor, the global count and the
            first local index.
    """
    local_stats = compute_statistics(prev_logprobs, generation_logprobs, mask, config)
    global_stats = reduce_statistics(local_stats, group)
    s = _sums(global_stats)
    if s[Slot.N_BAD_LOGPROBS] > 0 or s[Slot.N_BAD_MASK] > 0:
        valid = validation.valid_positions(mask)
        named = {"prev_logprobs": prev_logprobs, "generation_logprobs": generation_logprobs}
        counts = validation.bad_value_counts(named, mask, valid).tolist()
        where = "" if group is None else " on this rank (the process group has "
        where += "" if group is None else f"{int(s[Slot.N_BAD_LOGPROBS] + s[Slot.N_BAD_MASK])})"
        validation.raise_for_bad_values({**named, "mask": mask}, valid, counts, where)
        raise ValueError(  # every rank raises, also those whose own shard is clean
            f"prev_logprobs/generation_logprobs/mask: {int(s[Slot.N_BAD_LOGPROBS])} non-finite "
            f"log-prob values and {int(s[Slot.N_BAD_MASK])} mask values not in {{0, 1}} on other "
            "ranks of the process group"
        )
    return _diagnostics_from_sums(s, config, state)
