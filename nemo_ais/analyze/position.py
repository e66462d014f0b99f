# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Per-quarter |log-ratio| profile of a step's long sequences: the ``kv_scale_position`` input.

Offline only: sums of |l| = |log pi_old - log mu| and valid tokens over each quarter of every long sequence's span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_ais.alarms import QUARTERS
from nemo_ais.core import log_ratio


@dataclass
class PositionProfile:
    """Per-quarter sums over valid tokens of long sequences: sum |l|, tokens, sequences.

    Quarter q holds the valid-span positions j with floor(4 (j - first) / span) = q; profiles add by :meth:`merge`.
    """

    abs_log_rho_sum: torch.Tensor
    n_tok: torch.Tensor
    n_seq: int = 0
    min_length: int = 0

    @classmethod
    def empty(cls, min_length: int = 0) -> PositionProfile:
        """A profile with no sequence."""
        zero = torch.zeros(QUARTERS, dtype=torch.float64)
        return cls(zero, zero.clone(), 0, min_length)

    def merge(self, other: PositionProfile) -> PositionProfile:
        """Sum of two profiles (built with the same ``min_length``)."""
        return PositionProfile(
            self.abs_log_rho_sum + other.abs_log_rho_sum,
            self.n_tok + other.n_tok,
            self.n_seq + other.n_seq,
            max(self.min_length, other.min_length),
        )

    def quarters(self) -> list[tuple[float, float]] | None:
        """[(mean |l|, tokens) per quarter]; None if no sequence was long enough."""
        if self.n_seq == 0:
            return None
        n = self.n_tok.tolist()
        s = self.abs_log_rho_sum.tolist()
        return [(s[q] / n[q] if n[q] > 0 else 0.0, n[q]) for q in range(QUARTERS)]


@torch.no_grad()
def position_profile(
    logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, *, min_length: int = 256
) -> PositionProfile:
    """Per-quarter sum |l| and token count of a ``[B, T]`` batch's long sequences (core ``log_ratio``).

    Each row's quarters are relative to its own valid span (first to last valid position).

    Args:
        logp_old: ``[B, T]`` ``prev_logprobs`` (aligned like the loss: ``[:, 1:]``).
        logp_rollout: ``[B, T]`` ``generation_logprobs``, same alignment.
        mask: ``[B, T]`` bool or {0, 1}; positions to count (non-finite ones excluded).
        min_length: shortest valid span counted (``AlarmConfig.kv_min_length``).

    Returns:
        :class:`PositionProfile` (float64 sums of length 4, on the CPU).
    """
    valid = (mask if mask.dtype == torch.bool else mask == 1).cpu()
    t = valid.shape[-1]
    has_tok = valid.any(dim=-1)
    first = valid.to(torch.int8).argmax(dim=-1)
    last = t - 1 - valid.flip(-1).to(torch.int8).argmax(dim=-1)
    span = torch.where(has_tok, last - first + 1, 0)
    long_seq = span >= min_length
    offset = torch.arange(t)[None, :] - first[:, None]
    quarter = (offset * QUARTERS).div(span.clamp(min=1)[:, None], rounding_mode="floor")
    used = valid & long_seq[:, None]
    index = quarter.clamp(0, QUARTERS - 1)[used]
    abs_log_rho = log_ratio(logp_old, logp_rollout, valid.to(logp_old.device)).abs().cpu()
    out = PositionProfile.empty(min_length)
    out.abs_log_rho_sum.index_add_(0, index, abs_log_rho[used].to(torch.float64))
    out.n_tok.index_add_(0, index, torch.ones(index.numel(), dtype=torch.float64))
    out.n_seq = int(long_seq.sum())
    return out
