# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NeMo-RL loss adapter (v0.7.0 and main): ``AISLossConfig`` and ``AISClippedPGLossFn`` (no loss math).

* mode ``none``: ``ClippedPGLossFn.__call__`` unchanged (bit-identical), plus ``ais/*`` telemetry once prepared.
* other modes: :func:`nemo_ais.core.clipped_pg_loss` on the diagnostics of the call's global batch (no collective).

Metrics come in one host sync, in GRPO's summable form (NeMo-RL's keys and definitions, a test checks them against
``ClippedPGLossFn``). Global counts NaN, inf or below the call's own are refused; main's split train-step placeholder
counts of 1 pass unless the weight needs a global-batch statistic.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from pydantic import Field, ValidationInfo, field_validator, model_validator

from nemo_ais.alarms import ALARM_KINDS, ALARM_PREFIX, AISAlarmsConfig
from nemo_ais.config import CorrectionConfig, PGLossConfig, pg_loss_section, surrogate_conflicts, validate_section
from nemo_ais.core import AISDiagnostics, metric_normalizations, validation
from nemo_ais.core.metrics import AIS_METRIC_NAMES, ais_values
from nemo_ais.core.weights import compute_dtype
from nemo_ais.nemo_rl import compat
from nemo_ais.nemo_rl.seam import (
    GLOBAL_BATCH_KEY,
    LOSS_KEYS,
    UNUSED_ROW,
    VALID_TOKENS_KEY,
    checked_index,
    global_batch_index,
    loss_from_prepared,
    row_valid_tokens,
)
from nemo_ais.rules.loss_conflicts import (
    AIS_CONFLICTS,
    ais_conflicts,
    bypass_kl_in_reward_problems,
    unknown_ais_sections,
)

# Keys core computes in AIS mode (NeMo-RL's definitions); the others are NeMo-RL's.
_CORE_KEYS = ("loss", "probs_ratio", "probs_ratio_clamped", "kl_penalty", "sampling_importance_ratio")
# ClippedPGLossFn's keys (v0.7.0 and main; no truncated IS): what grpo_train may read.
NEMO_RL_METRIC_KEYS = (
    "loss",
    "probs_ratio",
    "probs_ratio_clamped",
    "probs_ratio_min",
    "probs_ratio_max",
    "probs_ratio_clamped_min",
    "probs_ratio_clamped_max",
    "kl_penalty",
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "sampling_importance_ratio",
    "num_valid_samples",
    "approx_entropy",
    "positive_nll_loss",
)


# ``ais_alarm/<kind>``: 1 if the refit guard fired on the global batch (tokens normaliser).
ALARM_METRIC_KEYS = tuple(ALARM_PREFIX + kind for kind in ALARM_KINDS)
# ais/alpha averages a train()'s global batches; ais/alpha_gb<g> keeps each one's (emitted when there are > 1)
PER_GLOBAL_BATCH_ALPHA = "ais/alpha_gb{}"


# Float64 products of float32-rounded values, rounded once, equal float32 torch's (53 >= 2*24+2).
_ROUND: dict[torch.dtype, Callable[[Sequence[float]], list[float]]] = {
    torch.float32: lambda values: array("f", values).tolist(),
    torch.float64: list,
}


def _metric_dtype(next_token_logprobs: torch.Tensor, data: Mapping[str, Any]) -> torch.dtype:
    """Core's compute dtype of a call: the summable metrics are rounded to it."""
    return compute_dtype(next_token_logprobs, data["prev_logprobs"], data["advantages"])


class _CallCounts(NamedTuple):
    """What a loss call reads in its one host sync (python floats)."""

    n_tok_local: float  # valid tokens of this call
    global_toks: float  # global_valid_toks, checked
    index: int | None  # global batch of the call's rows (None: untagged, -1: no rows)


# our loss_fn sections -> (model, the section when absent: off, not the model's default)
_SECTIONS = {"ais": (CorrectionConfig, {"mode": "none"}), "ais_alarms": (AISAlarmsConfig, {"enabled": False})}


def _validate_section(key: str, value: Any) -> CorrectionConfig | AISAlarmsConfig:
    """``loss_fn.<key>`` validated; absent (None) means off."""
    model, off = _SECTIONS[key]
    return model(**off) if value is None else validate_section(model, value, f"loss_fn.{key}")


class AISLossConfig(ClippedPGLossConfig):
    """NeMo-RL's ``ClippedPGLossConfig`` plus the validated ``loss_fn.ais`` / ``ais_alarms``.

    Modes other than ``none`` also validate the surrogate knobs and the mode's conflicts
    (:data:`~nemo_ais.rules.loss_conflicts.AIS_CONFLICTS`).
    """

    ais: CorrectionConfig = Field(
        default_factory=lambda: _validate_section("ais", None),
        description="AIS correction (nemo_ais.config.CorrectionConfig); absent = mode none.",
    )
    ais_alarms: AISAlarmsConfig = Field(
        default_factory=lambda: _validate_section("ais_alarms", None),
        description="Refit guard in the AIS worker (AISAlarmsConfig); absent = off.",
    )

    @field_validator("ais", "ais_alarms", mode="before")
    @classmethod
    def _validate_sections(cls, value: Any, info: ValidationInfo) -> Any:
        return _validate_section(info.field_name, value)

    @model_validator(mode="after")
    def _check_conflicts(self) -> AISLossConfig:
        problems = unknown_ais_sections(self.model_extra or {})  # NeMo-RL keeps extra keys
        problems += ais_conflicts({f: getattr(self, f) for f in AIS_CONFLICTS}, self.ais.mode)
        if self.ais.bypass and self.ais.mode == "none":  # none is ClippedPGLossFn, unchanged
            problems.append(
                "loss_fn.ais.bypass=True is invalid with loss_fn.ais.mode='none': mode none "
                "delegates to NeMo-RL's ClippedPGLossFn, which reads prev_logprobs (use "
                "mode: tis; with pi_old := mu every IS mode's weight is 1)"
            )
        problems += bypass_kl_in_reward_problems(
            {f: getattr(self, f) for f in ("ais", "use_kl_in_reward", "reference_policy_kl_penalty")}
        )
        if self.ais.mode != "none":  # core's loss: its knobs, and those the mode excludes
            try:
                problems += surrogate_conflicts(self.ais, pg_loss_config(self))
            except ValueError as err:
                problems.append(str(err))
        if problems:
            raise ValueError("\n".join(problems))
        return self


def validate_loss_config(loss_fn: Mapping[str, Any] | ClippedPGLossConfig) -> AISLossConfig:
    """Validate ``loss_fn`` as :class:`AISLossConfig` (ValueError: one line a problem; TypeError: not a mapping)."""
    if isinstance(loss_fn, AISLossConfig):
        return loss_fn
    if not isinstance(loss_fn, Mapping | ClippedPGLossConfig):
        raise TypeError(f"loss_fn: expected a mapping of fields, got {type(loss_fn).__name__}")
    data = loss_fn.model_dump() if isinstance(loss_fn, ClippedPGLossConfig) else dict(loss_fn)
    for key in _SECTIONS:
        data[key] = _validate_section(key, data.get(key))
    try:
        return AISLossConfig.model_validate(data)
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        errors = getattr(err, "errors", None)
        if errors is None:
            raise
        lines = []
        for e in errors():
            where = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"loss_fn.{where}={e.get('input')!r} is invalid: {msg}" if where else msg)
        raise ValueError("\n".join(lines)) from None


def pg_loss_config(cfg: ClippedPGLossConfig) -> PGLossConfig:
    """NeMo-RL's loss config as core's :class:`PGLossConfig` (``use_kl_in_reward``: KL penalty 0).

    Raises:
        ValueError: naming ``loss_fn.<field>``.
    """
    fields = {f: getattr(cfg, f) for f in PGLossConfig.model_fields}
    return pg_loss_section({**fields, "use_kl_in_reward": cfg.use_kl_in_reward})


def core_metric_keys(token_level_loss: bool = True) -> dict[str, str]:
    """Keys core contributes in AIS mode -> normaliser (``tokens``/``sequences``/``none``)."""
    norms = metric_normalizations(token_level_loss)
    return {k: v for k, v in norms.items() if k in _CORE_KEYS or k.startswith("ais/")}


class AISClippedPGLossFn(ClippedPGLossFn):
    """``ClippedPGLossFn`` whose actor loss is weighted by the AIS correction of core.

    Args:
        cfg: an :class:`AISLossConfig`, or anything :func:`validate_loss_config` accepts.
        **upstream_flags: passed to ``ClippedPGLossFn.__init__`` (main: ``use_fused_linear_logprobs``).
    """

    def __init__(self, cfg: AISLossConfig | Mapping[str, Any] | ClippedPGLossConfig, **upstream_flags: Any):
        cfg = validate_loss_config(cfg)
        super().__init__(cfg, **upstream_flags)
        self.ais = cfg.ais
        # mode none must construct whatever ClippedPGLossFn constructs: no core checks then
        self.pg = pg_loss_config(cfg) if cfg.ais.mode != "none" else None
        inherited = dict(getattr(self, "metric_normalizations", None) or {})
        ours = {k: compat.normalizer(v) for k, v in core_metric_keys(cfg.token_level_loss).items()}
        first, last = (inherited, ours) if self.enabled else (ours, inherited)
        self.metric_normalizations = {**first, **last}
        self.ais_alarms = cfg.ais_alarms
        if self.ais_alarms.enabled:  # global scalars, emitted like ais/alpha
            tokens = compat.normalizer("tokens")
            self.metric_normalizations.update(dict.fromkeys(ALARM_METRIC_KEYS, tokens))
        # the keys core gives in AIS mode, in output order (NeMo-RL's first)
        self._core_metric_order = tuple(
            k
            for k in (*NEMO_RL_METRIC_KEYS, *self.metric_normalizations)
            if k not in ("num_valid_samples", "positive_nll_loss")
            and (k in NEMO_RL_METRIC_KEYS or k.startswith("ais/"))
        )
        self._diagnostics: tuple[AISDiagnostics, ...] = ()
        self._telemetry_values: tuple[list[float], ...] = ()  # ais_values, per global batch
        self._alarms: tuple[Mapping[str, float], ...] = ()

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """``[B, S]`` data keys the prepare step checks for this loss (seam.LOSS_KEYS, + KL's)."""
        kl = self.reference_policy_kl_penalty > 0  # upstream's: 0 with use_kl_in_reward
        return (*LOSS_KEYS, "reference_policy_logprobs") if kl else LOSS_KEYS

    @property
    def enabled(self) -> bool:
        """True when ``loss_fn.ais.mode`` is not ``none`` (core weights the loss)."""
        return self.ais.mode != "none"

    def attach_diagnostics(self, diagnostics: Sequence[AISDiagnostics]) -> None:
        """Store the prepared diagnostics, one per global batch of this ``train()`` call."""
        self._diagnostics = tuple(diagnostics)
        # the global scalars behind ais/*, read once per global batch, not once per call
        self._telemetry_values = tuple(ais_values(d) for d in self._diagnostics)
        self._alarms = ()

    def attach_alarms(self, alarms: Sequence[Mapping[str, float]]) -> None:
        """Store the refit guard's ``ais_alarm/<kind>`` values (0/1), one dict per global batch."""
        self._alarms = tuple(dict(a) for a in alarms)

    def __getstate__(self) -> dict[str, Any]:
        # The driver pickles the loss to the workers at every train(): ship no stale state.
        return {**self.__dict__, "_diagnostics": (), "_telemetry_values": (), "_alarms": ()}

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """NeMo-RL's loss contract: ``(loss, metrics)`` with float metrics (module doc)."""
        if not self.enabled:
            counts = self._call_counts(data, global_valid_seqs, global_valid_toks)
            loss, metrics = super().__call__(next_token_logprobs, data, global_valid_seqs, global_valid_toks)
            dtype = _metric_dtype(next_token_logprobs, data)
            metrics = {**metrics, **self._telemetry(dtype, counts)}
            return loss, {**metrics, **self._per_global_batch_alpha(metrics, counts.index)}
        index = global_batch_index(data)  # one host sync; read once for the loss and alpha_gb
        out = loss_from_prepared(
            next_token_logprobs,
            data,
            self._diagnostics,
            self.ais,
            self.pg,
            global_valid_seqs=global_valid_seqs,
            global_valid_toks=global_valid_toks,
            rollout_metrics=True,
            index=index,
        )
        # the refit guard's values need this call's counts (one more sync)
        counts = self._call_counts(data, global_valid_seqs, global_valid_toks) if self._alarms else None
        metrics = self._ais_metrics(out.metrics, next_token_logprobs, data, counts)
        metrics.update(self._per_global_batch_alpha(metrics, index))
        return out.loss, metrics

    def _per_global_batch_alpha(self, metrics: Mapping[str, Any], index: int | None) -> dict:
        """``ais/alpha_gb<g>``: n x alpha in the calls of global batch g, else 0; {} for one."""
        n = len(self._diagnostics)
        if n < 2 or "ais/alpha" not in metrics:
            return {}
        value = n * metrics["ais/alpha"]
        return {PER_GLOBAL_BATCH_ALPHA.format(g): value if g == index else 0.0 for g in range(n)}

    def _ais_metrics(
        self, core: Mapping[str, torch.Tensor], next_token_logprobs: torch.Tensor, data, counts
    ) -> dict[str, Any]:
        """NeMo-RL's metric dict in AIS mode from core's 0-dim tensors, in ONE host sync."""
        sample_mask = data["sample_mask"]
        keys = [k for k in self._core_metric_order if k in core]
        extra = ["positive_nll_loss"] if "positive_nll_loss" in core else []  # VAPO on
        n_valid = sample_mask.sum().to(core["loss"])
        *values, n_valid = torch.stack([*(core[k] for k in keys + extra), n_valid]).tolist()
        metrics = dict(zip(keys + extra, values, strict=True))
        metrics["num_valid_samples"] = n_valid if sample_mask.is_floating_point() else int(n_valid)
        metrics.setdefault("positive_nll_loss", 0.0)
        ordered = {k: metrics[k] for k in NEMO_RL_METRIC_KEYS}
        ordered.update(metrics)
        if counts is not None:
            ordered.update(self._alarm_telemetry(_metric_dtype(next_token_logprobs, data), counts))
        return ordered

    def _call_counts(self, data: Mapping[str, Any], global_valid_seqs: Any, global_valid_toks: Any) -> _CallCounts:
        """This call's valid tokens and global batch, global counts checked, in ONE host sync."""
        row_toks = data.get(VALID_TOKENS_KEY)  # prepared once per train() call by the seam
        if row_toks is None:  # not prepared: one pass over the masks
            row_toks = row_valid_tokens(data)
        validation.check_scalar_count("global_valid_toks", global_valid_toks)
        validation.check_scalar_count("global_valid_seqs", global_valid_seqs)
        scalars = [row_toks.sum(dtype=torch.float64), torch.count_nonzero(row_toks)]
        scalars += [
            v.reshape(()) if isinstance(v, torch.Tensor) else torch.as_tensor(v, device=row_toks.device)
            for v in (global_valid_toks, global_valid_seqs)
        ]
        tags = data.get(GLOBAL_BATCH_KEY)
        if tags is not None and tags.numel() > 0:
            scalars += torch.aminmax(tags)
        values = torch.stack(scalars).tolist()  # float64 by type promotion: one vector, one read
        n_tok_local, n_seq_local, global_toks, global_seqs, *tag_range = values
        # mode none needs no statistic of the global batch: the split-API placeholder 1 passes
        validation.check_global_count("global_valid_toks", global_toks, n_tok_local, "tokens")
        validation.check_global_count("global_valid_seqs", global_seqs, n_seq_local, "sequences")
        index = None
        if tags is not None:
            index = checked_index(*map(int, tag_range)) if tag_range else UNUSED_ROW
        return _CallCounts(n_tok_local, global_toks, index)

    @staticmethod
    def _summable(dtype: torch.dtype, counts: _CallCounts, values: Sequence[float]) -> list:
        """Global scalars s -> s * local / global toks (0 if empty), in core's dtype, on floats."""
        if counts.global_toks == 0:
            return [0.0] * len(values)
        rounded = _ROUND[dtype]
        n_tok_local, global_toks = rounded((counts.n_tok_local, counts.global_toks))
        (scale,) = rounded((n_tok_local / global_toks,))
        return rounded([value * scale for value in rounded(values)])

    @staticmethod
    def _at_batch(per_batch: Sequence[Any], counts: _CallCounts) -> Any:
        """The entry of the call's global batch in ``per_batch`` (None: untagged or unprepared)."""
        index = counts.index
        return per_batch[index] if index is not None and 0 <= index < len(per_batch) else None

    def _telemetry(self, dtype: torch.dtype, counts: _CallCounts) -> dict[str, float]:
        """``ais/*`` and ``ais_alarm/*`` of the call's global batch, summable; {} if unprepared."""
        values = self._at_batch(self._telemetry_values, counts)
        if values is None:
            return {}
        out = dict(zip(AIS_METRIC_NAMES, self._summable(dtype, counts, values), strict=True))
        if counts.global_toks == 0:  # the documented empty-batch result (core/metrics.py)
            out["ais/empty_batch"] = self._diagnostics[counts.index].empty_batch
        return {**out, **self._alarm_telemetry(dtype, counts)}

    def _alarm_telemetry(self, dtype: torch.dtype, counts: _CallCounts) -> dict[str, float]:
        """``ais_alarm/*`` of the call's global batch as s * local / global toks; {} if none."""
        alarms = self._at_batch(self._alarms, counts) or {}
        return dict(zip(alarms, self._summable(dtype, counts, list(alarms.values())), strict=True))
