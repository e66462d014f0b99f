# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The record of a correction mode, and the tensor helpers its weight function uses.

The loss, statistics, diagnostics, config, recipe, replay and pre-flight checks read the record
(:data:`nemo_ais.modes.MODES`); none of them names a mode. Import-light: torch only where a tensor is formed, so the
torch-free pre-flight can validate ``loss_fn.ais``. rho = pi_old / mu, l = log pi_old - log mu.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import model_validator

from nemo_ais.sections import Section

if TYPE_CHECKING:
    import torch

# (logp_old, logp_rollout, valid, config, batch_value) -> [B, T] detached weight, 0 where invalid
WeightFn = Callable[..., "torch.Tensor"]


def fully_weighted(diagnostics: Mapping[str, float]) -> float:
    """``applied_alpha`` of a mode that applies its whole weight: 1 (every mode but none, ais)."""
    return 1.0


def uncorrected(diagnostics: Mapping[str, float]) -> float:
    """``applied_alpha`` of the uncorrected arm (none): 0."""
    return 0.0


class BatchValue(NamedTuple):
    """A global-batch value a mode adds to the diagnostics and to the ``ais/<name>`` metrics."""

    name: str
    off: float  # its value when the mode is not the one running, or the batch is empty
    formula: str  # the metrics table's formula column (docs/metrics.md)
    healthy: str


@dataclass(frozen=True)
class BatchStatistic:
    """A global-batch value beyond the fixed statistics (m2po's q*): ``size`` more reduced slots."""

    size: int
    # (log_rho_c [B, T] float64, ok [B, T] bool, n_tok 0-dim float64) -> [size] local sums
    sums: Callable[..., torch.Tensor]
    # (reduced slots as python floats, n_tok, config) -> {AISDiagnostics field or new value: value}
    values: Callable[[list[float], float, Any], dict[str, float]]
    new_values: tuple[BatchValue, ...] = ()  # values no AISDiagnostics field holds


@dataclass(frozen=True)
class Replay:
    """How ``analyze`` replays it: ``affected`` (masked or floored tokens), ``frac_capped``."""

    affected: Callable[..., torch.Tensor] | None = None
    frac_capped: Callable[[Any], float] | None = None


@dataclass(frozen=True)
class Mode:
    """Everything the package knows about one correction mode.

    Attributes:
        name: ``loss_fn.ais.mode`` value (and the name of its sub-section, if any).
        weight: ``(logp_old, logp_rollout, valid, config, batch_value) -> [B, T]`` detached w_hat, 0 where invalid.
        importance_weight: ``batch_normalize`` may divide w_hat by its batch mean.
        applied_alpha: diagnostics -> the position between the uncorrected (0) and the fully weighted (1) gradient.
        batch_field: the diagnostics value passed as ``batch_value`` (None: none).
        batch_statistic: extra global-batch sums ``batch_field`` is formed from.
        batch_mean: ``(alpha, w_mean) -> mean of w_hat`` in closed form (ais); None: summed.
        mode_stats: sum the weight in the statistics (``ais/mode_*``).
        seq_level: one weight per sequence.
        surrogate: the step-4 surrogate, ``"token"`` or ``"tbpo"``.
        surrogate_conflicts: ``loss_fn`` option -> why the surrogate excludes it.
        unused_options: ``loss_fn`` options the surrogate ignores (``unused_why``: the hint).
        config: the ``loss_fn.ais.<name>`` sub-section model, None if no knob.
        moved_keys: flat keys of the earlier layout -> the key in the sub-section.
        replay: how ``analyze`` replays it; None: not replayed.
    """

    name: str
    weight: WeightFn
    importance_weight: bool = True
    applied_alpha: Callable[[Mapping[str, float]], float] = fully_weighted
    batch_field: str | None = None
    batch_statistic: BatchStatistic | None = None
    batch_mean: Callable[[float, float], float] | None = None
    mode_stats: bool = False
    seq_level: bool = False
    surrogate: str = "token"
    surrogate_conflicts: Mapping[str, str] = field(default_factory=dict)
    unused_options: tuple[str, ...] = ()
    unused_why: str = ""
    config: type[Section] | None = None
    moved_keys: Mapping[str, str] = field(default_factory=dict)
    replay: Replay | None = None

    @property
    def needs_alpha(self) -> bool:
        """True if the weight needs a value of the global batch (alpha, the m2po threshold)."""
        return self.batch_field is not None


class Interval(Section):
    """A kept interval ``[min, max]`` of a ratio; ``min < max``."""

    @model_validator(mode="after")
    def _check_interval(self) -> Interval:
        if not self.min < self.max:
            raise ValueError(f"min={self.min} must be < max={self.max} (the kept interval [min, max] is empty)")
        return self


def flat_keys(prefix: str, *keys: str) -> dict[str, str]:
    """``moved_keys`` of a sub-section whose ``keys`` were flat ``<prefix><key>`` keys."""
    return {prefix + key: key for key in keys}


def masked(old, rollout, valid, config, w_hat):
    """Valid tokens whose weight the mode sets to 0 (``analyze``'s masked share)."""
    return valid & (w_hat == 0)


def interval_mode(name: str, weight: WeightFn, config: type[Interval], prefix: str, **fields) -> Mode:
    """A mode keeping a ratio in ``[min, max]`` (flat keys ``<prefix>min`` / ``max`` before); ``fields``: the rest."""
    fields = {"replay": Replay(affected=masked), **fields}
    return Mode(name, weight, config=config, moved_keys=flat_keys(prefix, "min", "max"), **fields)


# --- tensor helpers of the weight functions ---------------------------------------------


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 inputs are upcast)."""
    import torch  # a tensor exists, so torch does (this module imports without it)

    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def where_valid(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` where ``valid``, 0 elsewhere (drops masked inf / NaN; no multiply)."""
    return values.where(valid, values.new_zeros(()))


def log_ratio(logp_old: torch.Tensor, logp_rollout: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Step 1: l = log pi_old - log mu at ``valid`` positions, 0 elsewhere (detached, fp32/fp64)."""
    dtype = compute_dtype(logp_old, logp_rollout)
    log_rho = logp_old.detach().to(dtype) - logp_rollout.detach().to(dtype)
    return where_valid(valid, log_rho)


def seq_log_weight(logp_old, logp_rollout, valid):
    """S_i = sum_t l_it over valid tokens, ``[B, 1]`` (float64 for float64 input)."""
    return log_ratio(logp_old, logp_rollout, valid).sum(dim=-1, keepdim=True)


def capped_exp(log_w, config):
    """min(exp(log_w), C_s) = exp(clamp(log_w, -L, log C_s)), exactly C_s where capped."""
    log_cap = math.log(config.seq_weight_cap)
    w = log_w.clamp(min=-config.log_ratio_clamp, max=log_cap).exp()
    return w.masked_fill(log_w >= log_cap, config.seq_weight_cap)
