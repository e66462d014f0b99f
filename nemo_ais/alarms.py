# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Refit guard: per-step alarms on the rollout-training mismatch, offline and online.

Pure logic, torch-free (no I/O, no module state; imports pydantic and :mod:`nemo_ais.config` only).
:class:`AlarmMonitor` keeps the recent history of one run and :meth:`AlarmMonitor.observe` names every alarm of a step
with its evidence. ``nemo-ais analyze`` calls it once per ``train_data_step{N}.jsonl``; the AIS worker
(:mod:`nemo_ais.nemo_rl.workers`) once per global batch, logging :func:`alarm_metrics` and (``fail_on_alarm: true``)
failing the step with :class:`RefitAlarmError`. l = log pi_old - log mu (``prev_logprobs - generation_logprobs``).

The alarms (``nonfinite``, ``severity_jump`` / ``tmpe_jump``, ``tail_jump``, ``kv_scale_position``, ``refit_readback``),
their rules and the calibration of the :class:`AlarmConfig` defaults (``benchmarks/bench_alarm_calibration.py``) are
tabled in docs/analyze.md; a heuristic of this project, not of the AIS paper. ``tmpe_jump`` fires only with
``severity_jump``: one outlier token (|l| = 10 among 4096 adds 5.4 to the mean exp|l|) is a tail, not a bulk jump.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_ais.config import require_config

ALARM_KINDS = ("nonfinite", "tmpe_jump", "severity_jump", "tail_jump", "kv_scale_position", "refit_readback")
ALARM_PREFIX = "ais_alarm/"
QUARTERS = 4
"""Quarters each long sequence's valid span is cut into by the ``kv_scale_position`` check."""


class AlarmConfig(BaseModel):
    """Thresholds of the refit guard (``alarms.<field>=value`` on the command line)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    window: int = Field(10, ge=1, description="Steps in the recent baseline (median).")
    min_history: int = Field(3, ge=1, description="Earlier steps needed before a jump alarm can fire.")
    jump_factor: float = Field(48.0, gt=1.0, description="A jump: value > jump_factor x the recent median.")
    tail_jump_factor: float = Field(
        6.0,
        gt=1.0,
        description=(
            "tail_jump: p99.9 |l| > tail_jump_factor x the recent median (a histogram bin "
            "edge, bins a factor 2 apart: 6 means >= 8x, three bins)."
        ),
    )
    min_jump: float = Field(
        0.003, ge=0.0, description="...and value - median >= min_jump (tmpe excess or D; also the KV check)."
    )
    tail_min_tokens: int = Field(
        5000,
        ge=1,
        description=(
            "tail_jump: only on a global batch of >= this many valid tokens (below ~5000 the "
            "p99.9 is one of the batch's few largest tokens: a single-token statistic)."
        ),
    )
    kv_min_length: int = Field(
        256, ge=QUARTERS, description="KV check: only sequences whose valid span has >= this many positions."
    )
    kv_ratio: float = Field(
        2.0, gt=1.0, description="KV alarm: last- / first-quarter mean |l| (quarters of each sequence)."
    )
    kv_min_tokens: int = Field(256, ge=1, description="KV check: valid tokens needed in the first and last quarters.")
    readback_tol: float = Field(
        0.0,
        ge=0.0,
        description="refit_readback: largest relative readback error taken as healthy (an exact readback is 0).",
    )
    fail_on_alarm: bool = Field(False, description="Online: raise RefitAlarmError (fail the step) when an alarm fires.")

    @model_validator(mode="after")
    def _history_fits_the_window(self) -> AlarmConfig:
        if self.min_history > self.window:  # the baseline holds `window` steps: no jump alarm could fire
            raise ValueError(
                f"min_history={self.min_history} must be <= window={self.window} (the recent baseline holds "
                "window steps, so a jump alarm would never fire)"
            )
        return self


class AISAlarmsConfig(AlarmConfig):
    """``loss_fn.ais_alarms``: :class:`AlarmConfig` plus ``enabled``, for the AIS worker.

    Online only the diagnostics-based alarms run (identical on every rank: no collective);
    the ``kv_*`` thresholds are offline only (docs/analyze.md).
    """

    enabled: bool = Field(True, description="Observe every global batch and log ais_alarm/* (absent section: off).")


@dataclass(frozen=True)
class Alarm:
    """One fired alarm: its kind, the step and the evidence (one sentence)."""

    kind: str
    step: int
    evidence: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.kind}: {self.evidence}"


class RefitAlarmError(RuntimeError):
    """Raised by :meth:`AlarmMonitor.observe` when ``fail_on_alarm`` is set and alarms fired."""


class Readback(Protocol):
    """What the ``refit_readback`` check reads (:class:`nemo_ais.rollout.readback.RefitReadback`)."""

    weight_error: float | None
    weight_module: str | None
    kv_scale_error: float | None


class PositionQuarters(Protocol):
    """What ``kv_scale_position`` reads (:class:`nemo_ais.analyze.PositionProfile`)."""

    n_seq: int  # sequences long enough to be counted
    min_length: int  # the shortest valid span counted

    def quarters(self) -> list[tuple[float, float]] | None:
        """[(mean |l|, tokens) per quarter]; None if no sequence was long enough."""


# tail_jump's statistic (an AISDiagnostics field), also tmpe_jump's bulk check
_P999 = "abs_log_ratio_p999"


def _get(diagnostics: Any, name: str, default: float | None = None) -> float:
    """A diagnostic by name; ``default`` (if given) when it is absent (an older log)."""
    if isinstance(diagnostics, Mapping):
        return float(diagnostics[name] if default is None else diagnostics.get(name, default))
    return float(getattr(diagnostics, name) if default is None else getattr(diagnostics, name, default))


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.1f}x" if base > 0 else "from 0"


class AlarmMonitor:
    """Recent history of one run and the alarm rules; one :meth:`observe` per step."""

    def __init__(self, config: AlarmConfig | None = None) -> None:
        require_config(config, AlarmConfig, "AlarmMonitor(config)", optional=True)
        self.config = config if config is not None else AlarmConfig()
        self._history: dict[str, deque[float]] = {
            name: deque(maxlen=self.config.window) for name in ("tmpe_excess", "severity", _P999)
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain-python history (for a checkpoint)."""
        return {name: list(h) for name, h in self._history.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        for name, values in state.items():
            self._history[name] = deque(map(float, values), maxlen=self.config.window)

    def _jump(
        self, step: int, name: str, kind: str, value: float, label: str, factor: float | None = None
    ) -> Alarm | None:
        history = self._history[name]
        if len(history) < self.config.min_history:
            return None
        median = statistics.median(history)
        factor = self.config.jump_factor if factor is None else factor
        if value > factor * median and value - median >= self.config.min_jump:
            return Alarm(
                kind,
                step,
                f"{label} {value:.4g} vs {median:.4g} median of the previous {len(history)} "
                f"steps ({_ratio(value, median)}; threshold {factor}x)",
            )
        return None

    def _kv(self, step: int, profile: PositionQuarters | None) -> Alarm | None:
        quarters = profile.quarters() if profile is not None else None
        if quarters is None:
            return None
        (early, n0), (late, n3) = quarters[0], quarters[-1]
        if min(n0, n3) < self.config.kv_min_tokens:
            return None
        if late > self.config.kv_ratio * early and late - early >= self.config.min_jump:
            return Alarm(
                "kv_scale_position",
                step,
                f"mean |log-ratio| {late:.4g} in the last quarter of each sequence vs {early:.4g} "
                f"in the first ({_ratio(late, early)}; threshold {self.config.kv_ratio}x; "
                f"{profile.n_seq} sequences spanning >= {profile.min_length} positions, {int(n3)} and {int(n0)} "
                "tokens): mismatch grows with position, as with FP8 KV-cache scales left at 1.0",
            )
        return None

    def _readback(self, step: int, readback: Readback | None) -> Alarm | None:
        if readback is None:
            return None
        tol, bad = self.config.readback_tol, []
        if readback.weight_error is not None and not readback.weight_error <= tol:
            bad.append(f"weight {readback.weight_module} off by {readback.weight_error:.3g}")
        if readback.kv_scale_error is not None and not readback.kv_scale_error <= tol:
            bad.append(f"KV-cache scales off by {readback.kv_scale_error:.3g}")
        if not bad:
            return None
        return Alarm(
            "refit_readback",
            step,
            f"the engine read back after the refit differs from a correct refit of the sent "
            f"weights ({'; '.join(bad)}, relative; threshold {tol:g}): check the refit "
            "(scale layout, layers kept in BF16, KV-scale recalibration)",
        )

    def observe(
        self,
        step: int,
        diagnostics: Any,
        *,
        n_nonfinite: int = 0,
        nonfinite_where: str = "",
        profile: PositionQuarters | None = None,
        readback: Readback | None = None,
    ) -> list[Alarm]:
        """Check one step and add it to the history.

        Args:
            step: the step number (for the evidence).
            diagnostics: :class:`~nemo_ais.core.AISDiagnostics` (or a mapping of its fields) of the step's global batch.
            n_nonfinite: valid positions with a NaN / inf log-prob (excluded upstream).
            nonfinite_where: where the first one is.
            profile: per-quarter |l| sums of long sequences, or None (no ``kv_scale_position`` check, as online).
            readback: the step's refit readback, or None (no ``refit_readback`` check).

        Returns:
            The fired alarms, in :data:`ALARM_KINDS` order (empty if none).

        Raises:
            RefitAlarmError: ``fail_on_alarm`` is set and an alarm fired (the history is updated first).
        """
        alarms: list[Alarm | None] = []
        if n_nonfinite > 0:
            where = f"; first {nonfinite_where}" if nonfinite_where else ""
            what = f"{n_nonfinite} valid positions with a NaN/inf log-prob{where}"
            alarms.append(Alarm("nonfinite", step, what))
        empty = _get(diagnostics, "empty_batch") > 0
        tmpe_excess = _get(diagnostics, "token_mult_prob_error") - 1
        severity = _get(diagnostics, "severity")
        p999 = _get(diagnostics, _P999, math.nan)  # nan: absent (an older log)
        n_tok = _get(diagnostics, "n_tok", math.inf)
        if not empty:
            tmpe = self._jump(step, "tmpe_excess", "tmpe_jump", tmpe_excess, "token_mult_prob_error - 1")
            sev = self._jump(step, "severity", "severity_jump", severity, "severity D")
            if sev is None:
                tmpe = None  # the bulk (mean |l|) did not move: a few outlier tokens, a tail
            tail = None
            if math.isfinite(p999) and n_tok >= self.config.tail_min_tokens:
                factor = self.config.tail_jump_factor
                tail = self._jump(step, _P999, "tail_jump", p999, "p99.9 |log-ratio|", factor)
            alarms += [tmpe, sev, tail, self._kv(step, profile)]
            if math.isfinite(tmpe_excess) and math.isfinite(severity):
                self._history["tmpe_excess"].append(tmpe_excess)
                self._history["severity"].append(severity)
            if math.isfinite(p999):
                self._history[_P999].append(p999)
        fired = [a for a in (*alarms, self._readback(step, readback)) if a is not None]
        if fired and self.config.fail_on_alarm:
            raise RefitAlarmError("AIS refit guard (alarms.fail_on_alarm=true): " + "; ".join(map(str, fired)))
        return fired


def alarm_metrics(alarms: list[Alarm]) -> dict[str, float]:
    """``ais_alarm/<kind>`` -> 1.0 if that alarm fired, else 0.0, for every kind."""
    fired = {a.kind for a in alarms}
    return {ALARM_PREFIX + kind: float(kind in fired) for kind in ALARM_KINDS}
