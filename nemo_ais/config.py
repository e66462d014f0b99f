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
"""Validated configuration for the AIS correction and the clipped GRPO loss.

Two pydantic v2 models, both ``extra="forbid"`` and ``frozen=True``:

* :class:`CorrectionConfig` -- the ``loss_fn.ais`` section: which correction mode
  multiplies the policy-gradient loss, and every constant of the AIS mixer.
  The formulas these constants feed are a documented **[reconstruction]** of
  "AIS: Adaptive Importance Sampling for Quantized RL" (arXiv 2605.13907); the
  paper's exact formulas are not public. See ``docs/method.md``.
* :class:`PGLossConfig` -- the clipped-surrogate knobs. Field names and meanings
  follow NeMo-RL v0.7.0's ``ClippedPGLossConfig`` where the two overlap.

Ratio direction, everywhere in this package: ``rho = pi_old / mu``, the BF16
trainer's probability of a sampled token over the (FP8) rollout engine's.

A mode's own knobs live in its sub-section, ``loss_fn.ais.<mode>`` (``icepop: {min, max}``,
``kl_rs: {threshold, ...}``), whose model is the mode's record's ``config``
(:mod:`nemo_ais.modes`); the flat keys of the earlier layout (``icepop_min``,
``rs_threshold``, ...) are refused with the new name. The section machinery
(:func:`validate_section`, :func:`require_config`) lives in :mod:`nemo_ais.sections` and is
re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from nemo_ais.modes import MODES
from nemo_ais.sections import (
    Section,
    config_type_error,
    require_config,
    validate_section,
)

__all__ = [
    "CorrectionConfig",
    "CorrectionMode",
    "PGLossConfig",
    "config_type_error",
    "pg_loss_section",
    "require_config",
    "surrogate_conflicts",
    "validate_section",
]

CorrectionMode = Literal[tuple(MODES)]  # type: ignore[valid-type]

# float32 exp() overflows above ~88.7; the clamp bound must stay below that.
_MAX_LOG_RATIO_CLAMP = 80.0

# loss_fn.ais.<mode>: one sub-section per mode that has knobs of its own (the mode's record)
_ModeSections = create_model(
    "_ModeSections",
    __base__=Section,
    **{
        name: (mode.config, Field(default_factory=mode.config, description=mode.config.__doc__))
        for name, mode in MODES.items()
        if mode.config is not None
    },
)
# the flat keys of the earlier layout -> their place in the mode's sub-section
_MOVED_KEYS = {
    old: f"{name}.{new}" for name, mode in MODES.items() for old, new in mode.moved_keys.items()
}


class CorrectionConfig(_ModeSections):
    """The ``loss_fn.ais`` section: correction mode and AIS mixer constants.

    Modes (per-token weight multiplying the clipped actor loss, rho = pi_old/mu):

    ============== ===================================== =========================
    mode           weight                                knobs
    ============== ===================================== =========================
    none           1                                     --
    tis            clamp(rho, floor, C)                  weight_cap, tis.floor
    icepop         rho * 1[lo <= rho <= hi]              icepop.min, icepop.max
    seq_mask_geo   rho * 1[lo <= rho_geo,i <= hi]        seq_mask_geo.min/max
    ais            (1 - alpha) + alpha * min(rho, C)     weight_cap + mixer below
    seq_tis        min(prod_t rho_t, C_seq)              seq_weight_cap
    seq_mis        prod_t rho_t * 1[lo <= prod <= hi]    seq_mis.min/max, seq_weight_cap
    kl_rs          1[stat_i <= thr, no vetoed token]     kl_rs.estimator, .aggregation,
                                                         .threshold, .veto_min_ratio
    m2po           1[l^2 < q*] (batch-level q*)          m2po.tau
    tbpo           min(rho_geo,i, C_seq), and the        seq_weight_cap, tbpo.clip_*,
                   sequence-ratio trust-band surrogate   tbpo.neg_clip_* [reconstruction]
    ============== ===================================== =========================

    The shared knobs stay flat (``weight_cap``: tis and ais; ``seq_weight_cap``: seq_tis,
    seq_mis and tbpo; the switches, the diagnostics and the mixer); each mode's own knobs
    are its sub-section, the model of its record (:mod:`nemo_ais.modes`).

    Switches: ``batch_normalize`` (IS modes: w / mean of w over the global batch) and
    ``bypass`` (pi_old := mu: rho = 1, the PPO ratio is pi_theta / mu).
    """

    moved_keys: ClassVar[Mapping[str, str]] = _MOVED_KEYS

    mode: CorrectionMode = Field("ais", description=f"Correction mode; one of {', '.join(MODES)}.")
    # --- truncation (tis and ais) -------------------------------------------------------
    weight_cap: float = Field(
        2.0,
        gt=1.0,
        description="C: token weights are min(rho, C) in tis and ais (C <= 1 removes up-weighting).",
    )
    # --- sequence-level weights (seq_tis, seq_mis, tbpo) ----------------------------------
    seq_weight_cap: float = Field(
        2.0,
        gt=1.0,
        description="C_seq: seq_tis / seq_mis weight min(prod_t rho_t, C_seq) (veRL default 2.0); "
        "tbpo weight min(exp(mean_t l), C_seq) (QaRL seq_tis_imp_ratio_cap 2.0).",
    )
    batch_normalize: bool = Field(
        False,
        description="IS modes: divide the weights by their global batch mean (token mean, or "
        "sequence mean for seq_tis / seq_mis).",
    )
    bypass: bool = Field(
        False,
        description="pi_old := mu (rollout log-probs as prev_logprobs): rho = 1, PPO ratio "
        "pi_theta / mu.",
    )
    # --- AIS diagnostics [reconstruction] --------------------------------------------------
    seq_weight: Literal["geometric", "product"] = Field(
        "geometric",
        description="Sequence weight W_i for the ESS: exp(mean_t l) (geometric) or exp(sum_t l).",
    )
    log_ratio_clamp: float = Field(
        20.0,
        gt=0.0,
        le=_MAX_LOG_RATIO_CLAMP,
        description="|l| is clamped to this before exp() (raw l is kept for metrics).",
    )
    severity_scale: float = Field(0.02, gt=0.0, description="tau: g_sev = 1 - exp(-D / tau).")
    reliability_floor: float = Field(
        0.5, ge=0.0, lt=1.0, description="r_min: g_rel = clip((R - r_min) / (1 - r_min), 0, 1)."
    )
    variance_tolerance: float = Field(
        1.0, gt=0.0, description="kappa: g_var = 1 / (1 + CV^2 / kappa)."
    )
    # --- mixer ----------------------------------------------------------------------------
    mixer: Literal["product", "constant"] = Field(
        "product",
        description="product: alpha = g_sev * g_rel * g_var; constant: alpha = constant_alpha.",
    )
    constant_alpha: float = Field(
        1.0, ge=0.0, le=1.0, description="alpha used by mixer=constant (fixed-alpha ablations)."
    )
    use_severity_gate: bool = Field(True, description="False replaces g_sev by 1 (ablation).")
    use_reliability_gate: bool = Field(True, description="False replaces g_rel by 1 (ablation).")
    use_variance_gate: bool = Field(True, description="False replaces g_var by 1 (ablation).")
    ema: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="beta: alpha_t = beta * alpha_{t-1} + (1 - beta) * alpha_raw (0 = no smoothing).",
    )
    alpha_min: float = Field(0.0, ge=0.0, le=1.0, description="Lower clamp of alpha.")
    alpha_max: float = Field(1.0, ge=0.0, le=1.0, description="Upper clamp of alpha.")

    @model_validator(mode="after")
    def _check_bounds(self) -> CorrectionConfig:
        if self.batch_normalize and not MODES[self.mode].importance_weight:
            importance = ", ".join(name for name, m in MODES.items() if m.importance_weight)
            raise ValueError(
                f"batch_normalize=True is invalid with mode={self.mode!r}: expected an "
                f"importance-sampling mode ({importance})"
            )
        if self.alpha_min > self.alpha_max:
            raise ValueError(f"alpha_min={self.alpha_min} must be <= alpha_max={self.alpha_max}")
        return self


class PGLossConfig(Section):
    """Clipped GRPO surrogate; names and semantics follow NeMo-RL's ``ClippedPGLossConfig``.

    ``L = -sum w_hat * max-side-clipped(r * A) * m / N`` with ``r = exp(logp_theta - logp_old)``
    clipped to ``[1 - ratio_clip_min, 1 + ratio_clip_max]``, optional dual clip ``c`` for
    negative advantages, plus ``reference_policy_kl_penalty * KL(pi_theta || pi_ref)``.
    NeMo-RL's ``use_cispo``, ``sequence_level_importance_ratios`` (GSPO),
    ``use_on_policy_kl_approximation`` and ``positive_example_nll_weight`` (VAPO) have
    NeMo-RL v0.7.0's semantics (algorithm box of :mod:`nemo_ais.core.loss`), and NeMo-RL's
    assertions on their combinations are validation errors naming the fields.
    """

    ratio_clip_min: float = Field(0.2, ge=0.0, lt=1.0, description="eps_low of the ratio clip.")
    ratio_clip_max: float = Field(0.2, ge=0.0, description="eps_high of the ratio clip.")
    ratio_clip_c: float | None = Field(
        None, gt=1.0, description="Dual-clip constant c (> 1) for A < 0; None disables it."
    )
    reference_policy_kl_penalty: float = Field(
        0.0, ge=0.0, description="Coefficient of the KL penalty to the reference policy."
    )
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator (http://joschu.net/blog/kl-approx.html)."
    )
    kl_input_clamp_value: float | None = Field(
        20.0, gt=0.0, description="Clamp of log(pi_ref/pi_theta) before the KL estimator."
    )
    kl_output_clamp_value: float | None = Field(
        10.0, gt=0.0, description="Clamp of each per-token KL value."
    )
    token_level_loss: bool = Field(
        True,
        description="True: normalise by global valid tokens; False: per-sequence mean, "
        "normalised by global valid sequences.",
    )
    disable_ppo_ratio: bool = Field(
        False, description="Use logp_theta * A (REINFORCE) instead of the clipped ratio."
    )
    use_cispo: bool = Field(
        False,
        description="CISPO: loss -A * sg(clip(r, 1 - eps_low, 1 + eps_high)) * "
        "logp_theta, without the PPO max.",
    )
    sequence_level_importance_ratios: bool = Field(
        False,
        description="GSPO: r_i = exp(mean_t log r_it) per sequence (needs token_level_loss "
        "false); the IS weight stays loss_fn.ais's (use mode seq_tis for a sequence one).",
    )
    use_on_policy_kl_approximation: bool = Field(
        False,
        description="KL term weighted by exp(logp_theta - logp_rollout) (with gradient) "
        "instead of the value-1 score-function weight.",
    )
    positive_example_nll_weight: float = Field(
        0.0,
        ge=0.0,
        description="VAPO: + this * mean NLL of the call's tokens of samples with reward > 0 "
        "(0 disables; needs the rewards).",
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> PGLossConfig:
        """NeMo-RL's ``ClippedPGLossFn`` asserts, as errors naming the fields."""
        if self.sequence_level_importance_ratios and self.token_level_loss:
            raise ValueError(
                "sequence_level_importance_ratios=True is invalid with token_level_loss=True: "
                "expected token_level_loss: false (GSPO's sequence ratio goes with the "
                "per-sequence mean; NeMo-RL's ClippedPGLossFn asserts the same)"
            )
        if not self.use_cispo:
            return self
        rules = (  # field, set against CISPO, the value CISPO needs, why
            ("disable_ppo_ratio", self.disable_ppo_ratio, "false", "CISPO needs the ratio"),
            (
                "sequence_level_importance_ratios",
                self.sequence_level_importance_ratios,
                "false",
                "CISPO uses token-level ratios",
            ),
            (
                "ratio_clip_c",
                self.ratio_clip_c is not None,
                "null",
                "the dual clip would overwrite the CISPO loss",
            ),
            ("token_level_loss", not self.token_level_loss, "true", "CISPO is token-level"),
        )
        for field, conflicting, expected, why in rules:
            if conflicting:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} is invalid with use_cispo=True: "
                    f"expected {expected} ({why}; NeMo-RL's ClippedPGLossFn asserts the same)"
                )
        return self


def surrogate_conflicts(config: CorrectionConfig, pg: PGLossConfig) -> list[str]:
    """One message per ``pg`` surrogate option that ``config.mode`` cannot combine with.

    A mode with its own surrogate (``tbpo``'s sequence-ratio band) lists the NeMo-RL
    alternatives to the token PPO surrogate that must stay off with it (its record's
    ``surrogate_conflicts``: ``disable_ppo_ratio``, ``use_cispo``,
    ``sequence_level_importance_ratios``).

    Args:
        config: the validated ``loss_fn.ais`` section.
        pg: the validated clipped-surrogate knobs (``loss_fn``).

    Returns:
        ``loss_fn.<field>=True is invalid with loss_fn.ais.mode='tbpo': expected False
        (why)`` per conflict, in field order; empty for a mode without such options.
    """
    return [
        f"loss_fn.{field}=True is invalid with loss_fn.ais.mode={config.mode!r}: expected "
        f"False ({why})"
        for field, why in MODES[config.mode].surrogate_conflicts.items()
        if getattr(pg, field)
    ]


def pg_loss_section(loss_fn: Mapping[str, Any]) -> PGLossConfig:
    """:class:`PGLossConfig` of a NeMo-RL ``loss_fn`` section (NeMo-RL's field names).

    Only :class:`PGLossConfig`'s fields are read; an absent one takes ``PGLossConfig``'s
    default (pass a complete section, e.g. a ``ClippedPGLossConfig``'s fields, for
    NeMo-RL's defaults). ``use_kl_in_reward: true`` moves the KL into the reward, so the
    loss's ``reference_policy_kl_penalty`` is 0, as in NeMo-RL's ``ClippedPGLossFn``.

    Args:
        loss_fn: the ``loss_fn`` mapping (other keys, ``ais`` included, are ignored).

    Returns:
        The validated, frozen :class:`PGLossConfig`.

    Raises:
        ValueError: naming ``loss_fn.<field>`` with the value and the expected form
            (e.g. ``ratio_clip_c`` must be > 1, CISPO without dual clip).
    """
    fields = {k: loss_fn[k] for k in PGLossConfig.model_fields if k in loss_fn}
    if loss_fn.get("use_kl_in_reward", False):
        fields["reference_policy_kl_penalty"] = 0.0
    return validate_section(PGLossConfig, fields, "loss_fn")
