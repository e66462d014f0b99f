# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Telemetry of :func:`~nemo_ais.core.loss.clipped_pg_loss` in NeMo-RL's *summable* form.

rho = pi_old / mu; the diagnostic formulas are a **[reconstruction]** (``docs/method.md``). NeMo-RL SUMS every metric
over micro-batches and data-parallel ranks, so each value is emitted already divided by the GLOBAL normaliser:

* TOKENS:    ``sum_local(x * m) / global_valid_tokens``; global scalar s: ``s * local_valid_toks / global_valid_toks``.
* SEQUENCES: ``sum_local(x_i) / global_valid_seqs``.
* NONE:      a count, summed as is.
* LOSS:      TOKENS if ``token_level_loss`` else SEQUENCES.

An empty global batch emits 0 everywhere but ``ais/empty_batch`` = 1. :data:`METRICS` is the one table;
``docs/metrics.md`` mirrors it (a test checks both).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nemo_ais.core.diagnostics import AISDiagnostics
from nemo_ais.modes import batch_values

TOKENS = "tokens"
SEQUENCES = "sequences"
NONE = "none"
LOSS = "loss"  # TOKENS if token_level_loss else SEQUENCES
AIS_PREFIX = "ais/"


class MetricSpec(NamedTuple):
    """One row of the metrics table."""

    name: str
    formula: str
    normalizer: str
    healthy: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("loss", "sum_t w_hat * clip_loss * m / N + KL term", LOSS, "finite"),
    MetricSpec("num_valid_samples", "#sequences with >= 1 valid token", NONE, "> 0"),
    MetricSpec("probs_ratio", "mean_t r, r = pi_theta / pi_old", TOKENS, "~1 (0.9-1.1)"),
    MetricSpec("probs_ratio_clamped", "mean_t clip(r, 1 - eps_low, 1 + eps_high)", TOKENS, "~1"),
    MetricSpec("kl_penalty", "KL term / reference_policy_kl_penalty (0 if off)", LOSS, ">= 0"),
    MetricSpec("sampling_importance_ratio", "mean_t w_hat (the applied correction weight)", TOKENS, "~1"),
    MetricSpec("ais/alpha", "clamp(EMA(alpha_raw), alpha_min, alpha_max)", TOKENS, "[0, 1]"),
    MetricSpec("ais/alpha_raw", "g_sev * g_rel * g_var (or constant_alpha)", TOKENS, "[0, 1]"),
    MetricSpec("ais/g_sev", "1 - exp(-D / tau)", TOKENS, "[0, 1]; rises with mismatch"),
    MetricSpec("ais/g_rel", "clip((R - r_min) / (1 - r_min), 0, 1)", TOKENS, "[0, 1]; ~1"),
    MetricSpec("ais/g_var", "1 / (1 + CV^2 / kappa)", TOKENS, "(0, 1]; ~1"),
    MetricSpec("ais/ess_seq", "R = (sum W)^2 / (N sum W^2)", TOKENS, "(0, 1]; > 0.9 healthy"),
    MetricSpec("ais/severity", "D = mean_t abs(l)", TOKENS, ">= 0; < 0.05 for FP8"),
    MetricSpec("ais/cv_w", "sqrt(CV^2) of w = min(rho, C)", TOKENS, ">= 0; < 0.3"),
    MetricSpec("ais/cv2", "n sum w^2 / (sum w)^2 - 1", TOKENS, ">= 0; < 0.1"),
    MetricSpec("ais/kl_k1", "mean_t -l (KL(mu ‖ pi_old), samples from mu)", TOKENS, "~0; abs < 1e-2"),
    MetricSpec("ais/kl_k3", "mean_t exp(l) - 1 - l", TOKENS, ">= 0; < 1e-2"),
    MetricSpec("ais/w_mean", "mean_t min(rho, C)", TOKENS, "~1"),
    MetricSpec("ais/frac_capped", "#{rho > C} / n_tok", TOKENS, "[0, 1]; < 1e-3"),
    MetricSpec("ais/token_mult_prob_error", "mean_t exp(abs(l)) (NeMo-RL's metric)", TOKENS, ">= 1; < 1.05"),
    MetricSpec("ais/raw_ratio_mean", "mean_t exp(l) (not capped; E_mu[rho] = 1)", TOKENS, "~1"),
    MetricSpec("ais/n_seq", "N: sequences with >= 1 valid token (global)", TOKENS, "> 0"),
    MetricSpec("ais/n_tok", "n: valid tokens (global)", TOKENS, "> 0"),
    MetricSpec("ais/empty_batch", "1 if no valid token in the global batch", TOKENS, "0"),
    MetricSpec("ais/w_norm", "batch_normalize: global mean of the mode's weight (1 when off)", TOKENS, "~1"),
    *(MetricSpec(AIS_PREFIX + v.name, v.formula, TOKENS, v.healthy) for v in batch_values()),
    MetricSpec(
        "ais/mode_frac_masked",
        "seq_mis / kl_rs: sequences / tokens with w_hat = 0; m2po: tokens masked",
        TOKENS,
        "[0, 1]; small",
    ),
    MetricSpec("ais/mode_frac_capped", "seq_tis / seq_mis / tbpo: sequences with w_i = C_seq", TOKENS, "[0, 1]"),
    MetricSpec(
        "ais/mode_ess",
        "seq_tis / seq_mis / kl_rs / tbpo: (sum w)^2 / (n sum w^2) of the mode's weight (else 1)",
        TOKENS,
        "(0, 1]; > 0.5",
    ),
    MetricSpec(
        "ais/abs_log_ratio_p999",
        "p99.9 of abs(l) over valid tokens (lower edge of its histogram bin; true value < 2x)",
        TOKENS,
        ">= 0; < 1 for FP8",
    ),
    MetricSpec(
        "ais/abs_log_ratio_peak",
        "max of abs(l) over valid tokens (lower edge of its histogram bin; true value < 2x)",
        TOKENS,
        ">= 0; a single token",
    ),
    MetricSpec(
        "ais/seq_kl_peak",
        "max over sequences of mean_t exp(l) - 1 - l (lower bin edge; true value < 2x)",
        TOKENS,
        ">= 0; < 0.1",
    ),
)


def metric_normalizations(token_level_loss: bool = True) -> dict[str, str]:
    """Metric name -> normaliser (``tokens`` / ``sequences`` / ``none``), LOSS resolved."""
    loss_norm = TOKENS if token_level_loss else SEQUENCES
    return {m.name: loss_norm if m.normalizer == LOSS else m.normalizer for m in METRICS}


# ``ais/*`` rows of METRICS, in table order, and the AISDiagnostics field each one scales
AIS_METRIC_NAMES = tuple(m.name for m in METRICS if m.name.startswith(AIS_PREFIX))
_AIS_FIELDS = tuple(name.removeprefix(AIS_PREFIX) for name in AIS_METRIC_NAMES)


def ais_values(diagnostics: AISDiagnostics) -> list[float]:
    """The global scalars s behind :data:`AIS_METRIC_NAMES`, in that order (python floats)."""
    return [getattr(diagnostics, f) for f in _AIS_FIELDS]


def summable_scale(n_tok_local: torch.Tensor, global_n_tok: torch.Tensor) -> torch.Tensor:
    """n_tok_local / global_n_tok, the factor of a global scalar's summable form; 0 if empty."""
    is_empty = global_n_tok == 0
    return torch.where(is_empty, 0, n_tok_local / torch.where(is_empty, 1, global_n_tok))


def ais_metrics(
    diagnostics: AISDiagnostics, n_tok_local: torch.Tensor, global_n_tok: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``ais/<field>`` -> s * n_tok_local / global_n_tok, 0-dim detached tensors (module doc)."""
    scale = summable_scale(n_tok_local, global_n_tok).detach()
    fields = ais_values(diagnostics)
    if scale.device.type == "cpu":  # one vector multiply
        values = (torch.tensor(fields, dtype=scale.dtype) * scale).unbind()
    else:  # python scalar x device tensor: no host-to-device copy (which would sync)
        values = [value * scale for value in fields]
    out = dict(zip(AIS_METRIC_NAMES, values, strict=True))
    out[AIS_PREFIX + "empty_batch"] = torch.where(
        global_n_tok == 0, diagnostics.empty_batch, out[AIS_PREFIX + "empty_batch"]
    ).detach()
    return out
