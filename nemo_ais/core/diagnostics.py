# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""AIS diagnostics and the mixing coefficient alpha, from GLOBAL sufficient statistics.

Algorithm box (**[reconstruction]** of arXiv 2605.13907; rho = pi_old / mu; sums from
:mod:`nemo_ais.core.stats`, already reduced over the data-parallel group):

1. reliability    R    = (sum_i W_i)^2 / (N * sum_i W_i^2)   in (0, 1]  (sequence ESS ratio)
2. severity       D    = sum |l_it| m_it / sum m_it                    (mean |log-ratio|)
3. amplification  CV^2 = (sum w^2 / n) / (sum w / n)^2 - 1             (w = min(rho, C))
4. gates          g_sev = 1 - exp(-D / tau)                            tau   = severity_scale
                  g_rel = clip((R - r_min) / (1 - r_min), 0, 1)        r_min = reliability_floor
                  g_var = 1 / (1 + CV^2 / kappa)                       kappa = variance_tolerance
5. mixer          alpha_raw = g_sev * g_rel * g_var (product) or constant_alpha (constant)
6. EMA + clamp    alpha_t = clamp(beta * alpha_{t-1} + (1 - beta) * alpha_raw, alpha_min,
                  alpha_max), beta = ``ema``; the first update takes alpha_raw.
7. other modes    from the same vector (the mode's record, :mod:`nemo_ais.modes`): the mode's batch statistic
                  (m2po's q*); w_bar = sum w_hat / n_w (batch_normalize; ais: (1 - alpha) + alpha w_mean);
                  mode_frac_masked, mode_frac_capped, mode_ess = (sum w_hat)^2 / (n_w sum w_hat^2)
8. tails          abs_log_ratio_p999, abs_log_ratio_peak, seq_kl_peak from the |l| and k3_i histograms (lower bin edges)

Also: KL(mu || pi_old) k1 = mean(-l), k3 = mean(exp(l) - 1 - l); w_mean, frac_capped,
token_mult_prob_error = mean exp|l|, raw_ratio_mean = mean exp(l).

The reduced float64 vector is read to the host ONCE and every formula runs in Python floats, so alpha is bit-identical
on every rank. A rank with bad input still joins the all-reduce with flags set; every rank then takes the failure path
together (one ``all_gather_object`` of the error texts) and raises the same ``ValueError`` naming each bad rank. An
empty global batch gives alpha = 0, empty_batch = 1 and finite neutral values (R = 1, D = 0, w_mean = 1, ...); the EMA
value is kept, its counter advances.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_ais.config import CorrectionConfig, config_type_error, require_config
from nemo_ais.core import validation
from nemo_ais.core.stats import (
    BAD_INPUT_SLOTS,
    NUM_SLOTS,
    TAIL_BINS,
    TAIL_QUANTILE,
    TAIL_START,
    AISStats,
    Slot,
    compute_statistics,
    num_slots,
    reduce_statistics,
    tail_bin_lower_edges,
)
from nemo_ais.modes import MODES, batch_values

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
    # batch-level values of the other modes (identical on every rank, like alpha)
    w_norm: float = 1.0  # batch_normalize: global mean of the mode's weight (1: off)
    mode_frac_masked: float = 0.0  # seq_mis / kl_rs / m2po: fraction whose weight is 0
    mode_frac_capped: float = 0.0  # seq_tis / seq_mis / tbpo: fraction of sequences at C_seq
    mode_ess: float = 1.0  # seq_tis / seq_mis / kl_rs / tbpo: (sum w)^2 / (n sum w^2)
    # tails (step 8): lower edges of histogram bins, a factor 2 wide
    abs_log_ratio_p999: float = 0.0  # the 99.9th percentile of |l| over valid tokens
    abs_log_ratio_peak: float = 0.0  # max |l| over valid tokens
    seq_kl_peak: float = 0.0  # max over sequences of k3_i, the sequence's mean k3
    # the modes' own global-batch values (``BatchValue``: m2po's q*), read as attributes; a read-only copy, unhashed
    mode_values: Mapping[str, float] = field(default_factory=lambda: _MODE_VALUES_OFF, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode_values", dict(self.mode_values))

    def __getattr__(self, name: str) -> float:
        """A mode's own value (``diagnostics.m2po_threshold``) from :attr:`mode_values`."""
        values = self.__dict__.get("mode_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def as_dict(self) -> dict[str, float]:
        """Name -> value; the modes' own values follow ``w_norm``, as in the metrics table."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name != "mode_values":
                out[f.name] = getattr(self, f.name)
            if f.name == "w_norm":
                out.update(self.mode_values)
        return out

    @property
    def ess_tok(self) -> float:
        """Token ESS ratio of the truncated weights: (sum w)^2 / (n sum w^2) = 1 / (1 + CV^2)."""
        return 1.0 / (1.0 + self.cv2)


@dataclass
class AISState:
    """EMA state of alpha (``alpha``: None before the first non-empty batch; ``num_updates``)."""

    alpha: float | None = None
    num_updates: int = 0

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state for a checkpoint."""
        return {"alpha": self.alpha, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.alpha = None if state["alpha"] is None else float(state["alpha"])
        self.num_updates = int(state["num_updates"])


def _check_mode_value_names() -> None:
    """A mode's own value may not hide a diagnostics name, nor repeat another mode's."""
    seen: dict[str, str] = {}
    for mode in MODES.values():
        for value in mode.batch_statistic.new_values if mode.batch_statistic else ():
            taken = hasattr(AISDiagnostics, value.name) or value.name in _FIELD_NAMES
            if taken or value.name in seen:
                owner = f"mode {seen[value.name]}" if value.name in seen else "AISDiagnostics"
                raise ValueError(
                    f"mode {mode.name}: batch_statistic.new_values name {value.name!r} is "
                    f"taken by {owner}: expected a name of its own (it becomes ais/<name>)"
                )
            seen[value.name] = mode.name


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(AISDiagnostics))
_check_mode_value_names()  # at import, as the registry is read (METRICS, the config Literal)
# every registered mode's own values at their "off" value: the same registry read as METRICS
_MODE_VALUES_OFF = {value.name: value.off for value in batch_values()}


def _reliability(n_seq: float, w_seq_sum: float, w_seq_sq_sum: float) -> float:
    """Step 1: R = (sum W)^2 / (N sum W^2), capped at 1 against rounding; 1 if N = 0."""
    if n_seq == 0 or w_seq_sq_sum == 0:
        return 1.0
    return min(1.0, w_seq_sum * w_seq_sum / (n_seq * w_seq_sq_sum))


def _severity(n_tok: float, abs_log_rho_sum: float) -> float:
    """Step 2: D = sum |l| / n; 0 if n = 0."""
    return abs_log_rho_sum / n_tok if n_tok > 0 else 0.0


def _cv2(n_tok: float, w_dev_sum: float, w_dev_sq_sum: float) -> float:
    """Step 3: CV^2 from u = w - 1 (n sum u^2 - (sum u)^2 avoids cancellation); 0 if n = 0."""
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
    """The one host sync per global batch: the reduced vector as floats (``tail``: mode slots)."""
    values = global_stats.vector.tolist()
    out = {slot: values[slot] for slot in Slot}
    out["tail"] = values[NUM_SLOTS:]
    out["tails"] = values[TAIL_START:NUM_SLOTS]
    return out


def _bin_of_rank(counts: list[float], rank: float) -> int:
    """The bin holding the ``rank``-th smallest value (1-based) of a histogram."""
    seen = 0.0
    for b, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return b
    return len(counts) - 1


def _tail_values(s) -> dict[str, float]:
    """Step 8: p99.9 and max of |l|, max of the sequences' k3, as lower bin edges."""
    abs_counts, k3_counts = s["tails"][:TAIL_BINS], s["tails"][TAIL_BINS:]
    edges = tail_bin_lower_edges()
    n_tok = sum(abs_counts)
    if n_tok == 0:  # no valid token (e.g. statistics built from sums alone)
        return {}
    top = lambda counts: max((b for b, c in enumerate(counts) if c > 0), default=0)  # noqa: E731
    return {
        "abs_log_ratio_p999": edges[_bin_of_rank(abs_counts, math.ceil(TAIL_QUANTILE * n_tok))],
        "abs_log_ratio_peak": edges[top(abs_counts)],
        "seq_kl_peak": edges[top(k3_counts)],
    }


def _mode_values(s, config: CorrectionConfig, alpha: float, w_mean: float) -> dict[str, float]:
    """Step 7: batch-level values of the modes other than ais, from the same reduced vector."""
    out = {}
    mode = MODES[config.mode]
    n_w, w_sum, w_sq = s[Slot.W_MODE_N], s[Slot.W_MODE_SUM], s[Slot.W_MODE_SQ_SUM]
    if config.batch_normalize:
        w_norm = mode.batch_mean(alpha, w_mean) if mode.batch_mean is not None else w_sum / max(n_w, 1)
        out["w_norm"] = w_norm if w_norm > 0 else 1.0  # every weight 0: nothing to normalise
    if n_w > 0 and mode.mode_stats:
        out["mode_frac_masked"] = s[Slot.W_MODE_ZERO] / n_w
        out["mode_frac_capped"] = s[Slot.W_MODE_CAPPED] / n_w
        out["mode_ess"] = w_sum * w_sum / (n_w * w_sq) if w_sq > 0 else 0.0
    if mode.batch_statistic is not None:
        values = mode.batch_statistic.values(s["tail"], s[Slot.N_TOK], config)
        own = {value.name for value in mode.batch_statistic.new_values}
        out.update({k: v for k, v in values.items() if k not in own})
        out["mode_values"] = _MODE_VALUES_OFF | {k: values[k] for k in own}
    return out


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


def _diagnostics_from_sums(s: dict[Slot, float], config: CorrectionConfig, state: AISState | None) -> AISDiagnostics:
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
    w_mean = 1 + s[Slot.W_TOK_DEV_SUM] / n_tok
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
        w_mean=w_mean,
        frac_capped=s[Slot.N_CAPPED] / n_tok,
        token_mult_prob_error=1 + s[Slot.EXP_ABS_DEV_SUM] / n_tok,
        raw_ratio_mean=1 + s[Slot.RHO_DEV_SUM] / n_tok,
        n_seq=s[Slot.N_SEQ],
        n_tok=n_tok,
        empty_batch=0.0,
        **_mode_values(s, config, alpha, w_mean),  # step 7
        **_tail_values(s),  # step 8
    )


# Bad-input flag -> how the agreed error's summary counts it (step 4 of stats).
_BAD_INPUT_LABELS = {
    Slot.N_MISSING_KEY: "rank(s) with a missing key",
    Slot.N_BAD_DTYPE: "rank(s) with a wrong type or dtype",
    Slot.N_BAD_SHAPE: "rank(s) with a wrong shape or device",
    Slot.N_BAD_LOGPROBS: "non-finite input value(s) at valid positions",
    Slot.N_BAD_MASK: "mask value(s) not in {0, 1}",
}


def _has_bad_input(s: dict[Slot, float]) -> bool:
    return any(s[slot] > 0 for slot in BAD_INPUT_SLOTS)


def _bad_input_summary(s: dict[Slot, float], group_size: int | None) -> str:
    """``AIS statistics: bad input on 1 of 2 ranks ... (1 rank(s) with a missing key)``."""
    kinds = ", ".join(f"{int(s[k])} {label}" for k, label in _BAD_INPUT_LABELS.items() if s[k])
    if group_size is None:
        return f"AIS statistics: bad input summed over the process group ({kinds})"
    where = f"{int(s[Slot.N_BAD_RANKS])} of {group_size} ranks of the process group"
    return f"AIS statistics: bad input on {where} ({kinds})"


def diagnostics_from_stats(
    global_stats: AISStats, config: CorrectionConfig, state: AISState | None = None
) -> AISDiagnostics:
    """Steps 1-6 from reduced statistics: R, D, CV^2, gates, alpha ([reconstruction]).

    Args:
        global_stats: statistics already summed over the data-parallel group.
        config: the ``loss_fn.ais`` section.
        state: EMA state; advanced once (an empty batch keeps its alpha).

    Raises:
        ValueError: a vector of the wrong length for ``config``, or flagged bad input (the same summary on every rank).
        TypeError: ``config`` is not a :class:`~nemo_ais.config.CorrectionConfig`.
    """
    require_config(config, CorrectionConfig, "diagnostics_from_stats(config)")
    size, expected = getattr(getattr(global_stats, "vector", None), "shape", None), num_slots(config)
    if size != (expected,):
        raise ValueError(
            f"global_stats: got a statistics vector of shape {list(size) if size is not None else size}, expected "
            f"[{expected}] for loss_fn.ais.mode={config.mode!r} (compute_statistics with the same config)"
        )
    s = _sums(global_stats)
    if _has_bad_input(s):
        raise ValueError(_bad_input_summary(s, None))
    return _diagnostics_from_sums(s, config, state)


def _local_statistics(logp_old, logp_rollout, mask, config, group, input_error):
    """Steps 1-4 on this rank; with a group, a structural error becomes flags, not a raise."""
    if input_error is None:
        try:
            return compute_statistics(logp_old, logp_rollout, mask, config), None
        except (TypeError, ValueError) as err:
            input_error = err
    if group is None:
        raise input_error
    device = logp_old.device if isinstance(logp_old, torch.Tensor) else None
    return AISStats.from_input_error(input_error, device, num_slots(config)), input_error


def _local_bad_values(logp_old, logp_rollout, mask) -> str | None:
    """Message naming the tensor, count and first index of this rank's bad values, if any."""
    try:
        validation.check_values({"prev_logprobs": logp_old, "generation_logprobs": logp_rollout}, mask)
    except ValueError as err:
        return str(err)
    return None


def _gather_error_texts(local_text: str | None, group) -> list[tuple[int, int, str]]:
    """Failure path only: ``(group rank, global rank, text)`` of every bad rank."""
    entries = [None] * torch.distributed.get_world_size(group)
    me = (torch.distributed.get_rank(group), torch.distributed.get_rank(), local_text)
    torch.distributed.all_gather_object(entries, me, group=group)
    return [entry for entry in entries if entry[2] is not None]


def _raise_bad_input(s, local_error, logp_old, logp_rollout, mask, group) -> None:
    """Raise on every rank: the local error (group None), else the SAME agreed message."""
    if isinstance(local_error, KeyError) and local_error.args:  # its message without the repr quotes
        local_text = str(local_error.args[0])
    elif local_error is not None:
        local_text = str(local_error)
    else:
        local_text = _local_bad_values(logp_old, logp_rollout, mask)
    if group is None:  # single process: the local message, as before
        raise ValueError(local_text or _bad_input_summary(s, None))
    bad = _gather_error_texts(local_text, group)  # same list on every rank
    size = torch.distributed.get_world_size(group)
    lines = [f"  rank {r}{'' if r == g else f' (global rank {g})'}: {text}" for r, g, text in bad]
    message = "\n".join([f"{_bad_input_summary(s, size)}; every rank raises this error:", *lines])
    raise ValueError(message) from local_error


def compute_diagnostics(
    prev_logprobs: torch.Tensor | None,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    group: torch.distributed.ProcessGroup | None = None,
    state: AISState | None = None,
    *,
    input_error: Exception | None = None,
) -> AISDiagnostics:
    """Statistics -> ONE all-reduce -> diagnostics, once per global batch on every rank.

    Args:
        prev_logprobs: ``[B, T]`` pi_old log-probs; ignored (may be None) with ``bypass``.
        generation_logprobs: ``[B, T]`` rollout-engine log-probs mu.
        mask: ``[B, T]`` bool or float in {0, 1}.
        config: the ``loss_fn.ais`` section.
        group: data-parallel group; None = single process, no collective.
        state: EMA state of alpha, advanced exactly once.
        input_error: an error met while building this rank's inputs (e.g. a missing key);
            with a group this rank joins flagged, else it is raised as is.

    Returns:
        :class:`AISDiagnostics` (python floats, bit-identical on every rank).

    Raises:
        TypeError, ValueError, KeyError: without a group, the local error.
        ValueError: with a group, bad input on ANY rank (``config`` of the wrong type
            included): the same message on every rank, naming each bad rank.
    """
    if input_error is None:  # a wrong config type joins the all-reduce flagged, like bad input
        input_error = config_type_error(config, CorrectionConfig, "compute_diagnostics(config)")
    if input_error is None and config.bypass:  # pi_old := mu
        prev_logprobs = generation_logprobs
    local_stats, local_error = _local_statistics(  # steps 1-4, never raises with a group
        prev_logprobs, generation_logprobs, mask, config, group, input_error
    )
    global_stats = reduce_statistics(local_stats, group)  # step 5: the ONE all-reduce
    s = _sums(global_stats)
    if _has_bad_input(s):  # identical on every rank: all take the failure path together
        _raise_bad_input(s, local_error, prev_logprobs, generation_logprobs, mask, group)
    return _diagnostics_from_sums(s, config, state)
