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

Use :func:`validate_section` at a boundary (YAML, CLI, NeMo-RL adapter): it turns
pydantic's error into a ``ValueError`` that names the full field path, the value,
the allowed range and a hint, e.g.::

    loss_fn.ais.weight_cap=0.8 is invalid: expected > 1.0 (C caps rho; ...)

Functions that take a config OBJECT check its type with :func:`require_config`, so a
plain dict is a ``TypeError`` naming the parameter and how to build the object, not an
``AttributeError`` deep inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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

CorrectionMode = Literal[
    "none", "tis", "icepop", "seq_mask_geo", "ais", "seq_tis", "seq_mis", "kl_rs", "m2po", "tbpo"
]
# modes whose weight is an importance weight (batch_normalize divides it by its batch mean)
IS_MODES = ("tis", "icepop", "seq_mask_geo", "ais", "seq_tis", "seq_mis", "tbpo")

# float32 exp() overflows above ~88.7; the clamp bound must stay below that.
_MAX_LOG_RATIO_CLAMP = 80.0


class _Section(BaseModel):
    # strict: no silent coercion (True is not 1.0, "2" is not 2.0; ints are still floats);
    # allow_inf_nan=False: a non-finite constant never reaches the mixer.
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )


class CorrectionConfig(_Section):
    """The ``loss_fn.ais`` section: correction mode and AIS mixer constants.

    Modes (per-token weight multiplying the clipped actor loss, rho = pi_old/mu):

    ============== ===================================== =========================
    mode           weight                                bounds used
    ============== ===================================== =========================
    none           1                                     --
    tis            clamp(rho, floor, C)                  weight_cap, weight_floor
    icepop         rho * 1[lo <= rho <= hi]              icepop_min, icepop_max
    seq_mask_geo   rho * 1[lo <= rho_geo,i <= hi]        seq_mask_min, seq_mask_max
    ais            (1 - alpha) + alpha * min(rho, C)     weight_cap + mixer below
    seq_tis        min(prod_t rho_t, C_seq)              seq_weight_cap
    seq_mis        prod_t rho_t * 1[lo <= prod <= hi]    seq_mis_min/max, seq_weight_cap
    kl_rs          1[stat_i <= thr, no vetoed token]     rs_estimator, rs_aggregation,
                                                         rs_threshold, rs_veto_min_ratio
    m2po           1[l^2 < q*] (batch-level q*)          m2po_tau
    tbpo           min(rho_geo,i, C_seq), and the        seq_weight_cap, tbpo_clip_*
                   sequence-ratio trust-band surrogate   [reconstruction] of QaRL's TBPO
    ============== ===================================== =========================

    Switches: ``batch_normalize`` (IS modes: w / mean of w over the global batch) and
    ``bypass`` (pi_old := mu: rho = 1, the PPO ratio is pi_theta / mu).
    """

    mode: CorrectionMode = Field(
        "ais",
        description="Correction mode; one of none, tis, icepop, seq_mask_geo, ais, seq_tis, "
        "seq_mis, kl_rs, m2po, tbpo.",
    )
    # --- truncation (tis and ais) -------------------------------------------------------
    weight_cap: float = Field(
        2.0,
        gt=1.0,
        description="C: token weights are min(rho, C) in tis and ais (C <= 1 removes up-weighting).",
    )
    weight_floor: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Optional lower clamp of the tis weight (None = no floor, as NeMo-RL's tis).",
    )
    # --- masking modes --------------------------------------------------------------------
    icepop_min: float = Field(0.5, gt=0.0, description="icepop: lower bound lo of rho.")
    icepop_max: float = Field(5.0, gt=0.0, description="icepop: upper bound hi of rho.")
    seq_mask_min: float = Field(
        0.999, gt=0.0, description="seq_mask_geo: lower bound of the geometric-mean ratio."
    )
    seq_mask_max: float = Field(
        1.002, gt=0.0, description="seq_mask_geo: upper bound of the geometric-mean ratio."
    )
    # --- sequence-level IS and rejection (veRL rollout_corr) ----------------------------
    seq_weight_cap: float = Field(
        2.0,
        gt=1.0,
        description="C_seq: seq_tis / seq_mis weight min(prod_t rho_t, C_seq) (veRL default 2.0); "
        "tbpo weight min(exp(mean_t l), C_seq) (QaRL seq_tis_imp_ratio_cap 2.0).",
    )
    seq_mis_min: float = Field(
        0.5, gt=0.0, description="seq_mis: a sequence is kept iff lo <= prod_t rho_t <= hi."
    )
    seq_mis_max: float = Field(2.0, gt=0.0, description="seq_mis: upper bound hi of prod_t rho_t.")
    rs_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="kl_rs: per-token KL(mu || pi_old) estimate k1 = -l, k2 = l^2 / 2, "
        "k3 = rho - 1 - l.",
    )
    rs_aggregation: Literal["mean", "max"] = Field(
        "mean", description="kl_rs: per-sequence statistic abs(mean_t k) or max_t abs(k)."
    )
    rs_threshold: float = Field(
        0.01, gt=0.0, description="kl_rs: a sequence is rejected if its statistic > this."
    )
    rs_veto_min_ratio: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="kl_rs: also reject a sequence with any token rho < this (None: no veto).",
    )
    m2po_tau: float = Field(
        0.04,
        gt=0.0,
        description="m2po: bound of the batch second moment mean(l^2) of the kept tokens.",
    )
    # --- tbpo: trust band of the sequence ratio s_i = exp(mean_t log(pi_theta / pi_old)) --
    tbpo_clip_low: float = Field(
        3e-4, gt=0.0, lt=1.0, description="tbpo, A >= 0: s_i clipped below at 1 - this (GSPO)."
    )
    tbpo_clip_high: float = Field(
        4e-4, gt=0.0, description="tbpo, A >= 0: s_i clipped above at 1 + this (QaRL 4e-4)."
    )
    tbpo_neg_clip_low: float = Field(
        3e-4,
        gt=0.0,
        lt=1.0,
        description="tbpo, A < 0: lower edge 1 - this of the two-sided band (QaRL 3e-4).",
    )
    tbpo_neg_clip_high: float = Field(
        7e-4, gt=0.0, description="tbpo, A < 0: upper edge 1 + this of the band (QaRL 7e-4)."
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
        for lo_name, hi_name in (
            ("icepop_min", "icepop_max"),
            ("seq_mask_min", "seq_mask_max"),
            ("seq_mis_min", "seq_mis_max"),
        ):
            lo, hi = getattr(self, lo_name), getattr(self, hi_name)
            if not lo < hi:
                raise ValueError(
                    f"{lo_name}={lo} must be < {hi_name}={hi} (the kept interval [lo, hi] is empty)"
                )
        if self.batch_normalize and self.mode not in IS_MODES:
            raise ValueError(
                f"batch_normalize=True is invalid with mode={self.mode!r}: expected an "
                f"importance-sampling mode ({', '.join(IS_MODES)})"
            )
        if self.alpha_min > self.alpha_max:
            raise ValueError(f"alpha_min={self.alpha_min} must be <= alpha_max={self.alpha_max}")
        return self


class PGLossConfig(_Section):
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


# mode tbpo's own sequence-ratio surrogate replaces the token PPO surrogate these change
_TBPO_SURROGATE_CONFLICTS = {
    "disable_ppo_ratio": "tbpo's surrogate is built on the sequence ratio",
    "use_cispo": "tbpo has its own sequence-ratio surrogate, CISPO's replaces the PPO clip",
    "sequence_level_importance_ratios": "tbpo has its own sequence-ratio surrogate (its "
    "band is loss_fn.ais.tbpo_*)",
}


def surrogate_conflicts(config: CorrectionConfig, pg: PGLossConfig) -> list[str]:
    """One message per ``pg`` surrogate option that ``config.mode`` cannot combine with.

    Mode ``tbpo`` brings its own sequence-ratio surrogate, so NeMo-RL's alternatives to
    the token PPO surrogate (``disable_ppo_ratio``, ``use_cispo``,
    ``sequence_level_importance_ratios``) must stay off with it.

    Args:
        config: the validated ``loss_fn.ais`` section.
        pg: the validated clipped-surrogate knobs (``loss_fn``).

    Returns:
        ``loss_fn.<field>=True is invalid with loss_fn.ais.mode='tbpo': expected False
        (why)`` per conflict, in field order; empty for every other mode.
    """
    if config.mode != "tbpo":
        return []
    return [
        f"loss_fn.{field}=True is invalid with loss_fn.ais.mode={config.mode!r}: expected "
        f"False ({why})"
        for field, why in _TBPO_SURROGATE_CONFLICTS.items()
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


_M = TypeVar("_M", bound=BaseModel)


def validate_section(model: type[_M], data: Any, path: str) -> _M:
    """Validate ``data`` as ``model``; on failure raise one ``ValueError`` naming ``path.field``.

    Args:
        model: the pydantic model class (e.g. :class:`CorrectionConfig`).
        data: a mapping (dict, OmegaConf container converted to dict) or an instance.
        path: dotted prefix of the section in the user's config, e.g. ``"loss_fn.ais"``.

    Returns:
        The validated, frozen model instance.

    Raises:
        ValueError: one line per problem: ``path.field=value is invalid: reason (hint)``.
    """
    if isinstance(data, model):
        return data
    if data is None:
        data = {}
    if isinstance(data, Mapping) and not isinstance(data, dict):
        data = dict(data)  # e.g. an OmegaConf DictConfig section (flat: scalar values)
    if not isinstance(data, dict):
        raise TypeError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ValueError(_format_errors(model, err, path)) from None


def _format_errors(model: type[BaseModel], err: ValidationError, path: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        where = f"{path}.{field}" if field else path
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(model.model_fields))
            lines.append(f"{where} is not a known field (allowed: {allowed})")
            continue
        value = e.get("input")
        info = model.model_fields.get(field.split(".")[0]) if field else None
        hint = f" ({info.description})" if info is not None and info.description else ""
        reason = e["msg"].removeprefix("Value error, ").replace("Input should be ", "expected ")
        if field:
            lines.append(f"{where}={value!r} is invalid: {reason}{hint}")
        else:  # cross-field rule: the message starts with the offending field's name
            lines.append(f"{path}.{reason}")
    return "\n".join(lines)


def config_type_error(
    value: object, expected: type[BaseModel], where: str, *, optional: bool = False
) -> TypeError | None:
    """The ``TypeError`` :func:`require_config` raises for ``value``, or None if it is fine.

    For callers that must not raise at once (a distributed entry point that turns a local
    error into flags so that every rank raises together).
    """
    if isinstance(value, expected) or (optional and value is None):
        return None
    name = expected.__name__
    got = type(value).__name__
    accepted = f"{expected.__module__}.{name}" + (" or None" if optional else "")
    hint = ""
    if isinstance(value, Mapping):
        hint = f"; build one with {name}(**d) or {name}.model_validate(d)"
    elif isinstance(value, BaseModel):
        hint = f" ({got} is a different section)"
    return TypeError(f"{where}: got {got}, expected {accepted}{hint}")


def require_config(
    value: object, expected: type[BaseModel], where: str, *, optional: bool = False
) -> None:
    """Raise ``TypeError`` unless ``value`` is an ``expected`` instance (or None if ``optional``).

    Args:
        value: what the caller passed.
        expected: the config model class (subclasses are accepted).
        where: the parameter, prefixed by the function, e.g. ``"compute_statistics(config)"``.
        optional: None is accepted too.

    Raises:
        TypeError: e.g. ``compute_statistics(config): got dict, expected
            nemo_ais.config.CorrectionConfig; build one with CorrectionConfig(**d) or
            CorrectionConfig.model_validate(d)``.
    """
    error = config_type_error(value, expected, where, optional=optional)
    if error is not None:
        raise error
