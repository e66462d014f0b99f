# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Validated configuration of the AIS correction (``loss_fn.ais``) and the clipped GRPO loss.

:class:`CorrectionConfig`: the correction mode and the AIS mixer constants (a documented **[reconstruction]** of arXiv
2605.13907, docs/method.md); each mode's own knobs are its sub-section ``loss_fn.ais.<mode>`` (its record's ``config``,
:mod:`nemo_ais.modes`). :class:`PGLossConfig`: the clipped surrogate, named as NeMo-RL v0.7.0's
``ClippedPGLossConfig``. Everywhere ``rho = pi_old / mu``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from nemo_ais.modes import MODES
from nemo_ais.sections import (
    FLOAT32_MAX,
    Section,
    config_type_error as config_type_error,
    require_config as require_config,
    validate_section,
)

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
_MOVED_KEYS = {old: f"{name}.{new}" for name, mode in MODES.items() for old, new in mode.moved_keys.items()}


# far above any useful cap (peers ship 2-5), far below float32's overflow at the weight clamp
_MAX_WEIGHT_CAP = 1e6


def _cap(description: str) -> Any:
    """A weight cap: 2.0 by default, in (1, 1e6] (C <= 1 would only down-weight)."""
    return Field(2.0, gt=1.0, le=_MAX_WEIGHT_CAP, description=description)


class CorrectionConfig(_ModeSections):
    """The ``loss_fn.ais`` section: correction mode and AIS mixer constants.

    The modes are tabled in docs/method.md; knobs shared by several modes, the diagnostics and the mixer stay flat.
    """

    moved_keys: ClassVar[Mapping[str, str]] = _MOVED_KEYS

    mode: CorrectionMode = Field("ais", description=f"Correction mode; one of {', '.join(MODES)}.")
    # --- truncation (tis and ais) -------------------------------------------------------
    weight_cap: float = _cap(
        "C: token weights are min(rho, C) in tis and ais; C must exceed 1, since a cap of 1 or "
        "less would only ever down-weight."
    )
    # --- sequence-level weights (seq_tis, seq_mis, tbpo) ----------------------------------
    seq_weight_cap: float = _cap(
        "C_seq: seq_tis / seq_mis weight min(prod_t rho_t, C_seq) (veRL default 2.0); "
        "tbpo weight min(exp(mean_t l), C_seq) (QaRL seq_tis_imp_ratio_cap 2.0)."
    )
    batch_normalize: bool = Field(
        False,
        description="IS modes: divide the weights by their global batch mean (token mean, or "
        "sequence mean for seq_tis / seq_mis).",
    )
    bypass: bool = Field(
        False, description="pi_old := mu (rollout log-probs as prev_logprobs): rho = 1, PPO ratio pi_theta / mu."
    )
    # --- AIS diagnostics [reconstruction] --------------------------------------------------
    seq_weight: Literal["geometric", "product"] = Field(
        "geometric", description="Sequence weight W_i for the ESS: exp(mean_t l) (geometric) or exp(sum_t l)."
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
    variance_tolerance: float = Field(1.0, gt=0.0, description="kappa: g_var = 1 / (1 + CV^2 / kappa).")
    # --- mixer ----------------------------------------------------------------------------
    mixer: Literal["product", "constant"] = Field(
        "product", description="product: alpha = g_sev * g_rel * g_var; constant: alpha = constant_alpha."
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

    ``L = -sum w_hat * max-side-clipped(r * A) * m / N``, ``r = exp(logp_theta - logp_old)``
    clipped to ``[1 - ratio_clip_min, 1 + ratio_clip_max]`` (dual clip ``c`` for A < 0), plus
    ``reference_policy_kl_penalty * KL(pi_theta || pi_ref)``; CISPO, GSPO, the on-policy KL
    approximation and VAPO's NLL term as in NeMo-RL v0.7.0 (:mod:`nemo_ais.core.loss`).
    """

    ratio_clip_min: float = Field(0.2, ge=0.0, lt=1.0, description="eps_low of the ratio clip.")
    ratio_clip_max: float = Field(0.2, ge=0.0, le=FLOAT32_MAX, description="eps_high of the ratio clip.")
    ratio_clip_c: float | None = Field(
        None, gt=1.0, le=FLOAT32_MAX, description="Dual-clip constant c (> 1) for A < 0; None disables it."
    )
    reference_policy_kl_penalty: float = Field(
        0.0, ge=0.0, le=FLOAT32_MAX, description="Coefficient of the KL penalty to the reference policy."
    )
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator (http://joschu.net/blog/kl-approx.html)."
    )
    kl_input_clamp_value: float | None = Field(
        20.0, gt=0.0, le=FLOAT32_MAX, description="Clamp of log(pi_ref/pi_theta) before the KL estimator."
    )
    kl_output_clamp_value: float | None = Field(
        10.0, gt=0.0, le=FLOAT32_MAX, description="Clamp of each per-token KL value."
    )
    token_level_loss: bool = Field(
        True,
        description="True: normalise by global valid tokens; False: per-sequence mean, "
        "normalised by global valid sequences.",
    )
    disable_ppo_ratio: bool = Field(False, description="Use logp_theta * A (REINFORCE) instead of the clipped ratio.")
    use_cispo: bool = Field(
        False, description="CISPO: loss -A * sg(clip(r, 1 - eps_low, 1 + eps_high)) * logp_theta, without the PPO max."
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
        le=FLOAT32_MAX,
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
        rules = {  # field: the value CISPO needs (and as YAML), why
            "disable_ppo_ratio": (False, "false", "CISPO needs the ratio"),
            "sequence_level_importance_ratios": (False, "false", "CISPO uses token-level ratios"),
            "ratio_clip_c": (None, "null", "the dual clip would overwrite the CISPO loss"),
            "token_level_loss": (True, "true", "CISPO is token-level"),
        }
        for field, (needed, expected, why) in rules.items():
            if getattr(self, field) is not needed:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} is invalid with use_cispo=True: "
                    f"expected {expected} ({why}; NeMo-RL's ClippedPGLossFn asserts the same)"
                )
        return self


def surrogate_conflicts(config: CorrectionConfig, pg: PGLossConfig) -> list[str]:
    """One message per ``pg`` option that ``config.mode``'s own surrogate excludes (``surrogate_conflicts``)."""
    return [
        f"loss_fn.{field}=True is invalid with loss_fn.ais.mode={config.mode!r}: expected False ({why})"
        for field, why in MODES[config.mode].surrogate_conflicts.items()
        if getattr(pg, field)
    ]


def pg_loss_section(loss_fn: Mapping[str, Any]) -> PGLossConfig:
    """:class:`PGLossConfig` of a NeMo-RL ``loss_fn`` section (other keys, ``ais`` included, ignored).

    An absent field takes ``PGLossConfig``'s default; ``use_kl_in_reward: true`` sets ``reference_policy_kl_penalty``
    to 0 (KL in the reward, as in NeMo-RL's ``ClippedPGLossFn``). Raises ``ValueError`` naming ``loss_fn.<field>``.
    """
    fields = {k: loss_fn[k] for k in PGLossConfig.model_fields if k in loss_fn}
    if loss_fn.get("use_kl_in_reward", False):
        fields["reference_policy_kl_penalty"] = 0.0
    return validate_section(PGLossConfig, fields, "loss_fn")
