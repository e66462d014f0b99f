# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Sufficient statistics of the AIS diagnostics: one fixed-size float64 vector per rank.

Algorithm box (**[reconstruction]** of arXiv 2605.13907; rho = pi_old / mu):

1. l_it = log pi_old,it - log mu_it; l^c_it = clamp(l_it, -L, L), L = ``log_ratio_clamp``.
2. Sequence sums over the N sequences with a valid token:
       log W_i = clamp(mean_t l^c_it, -L, L) (geometric) or clamp(sum_t l^c_it, -L, L) (product)
       n_seq = N,  sum W_i,  sum W_i^2
3. Token sums over valid tokens, w_it = min(exp l_it, C) (the weight tis and ais apply):
       n_tok, sum |l|, sum l, sum l^c, n_capped = #{l > log C},
       sum (w - 1), sum (w - 1)^2, sum expm1(l^c), sum expm1(|l^c|)
   Every summand vanishes at l = 0 (masked positions drop out without a multiply, and the small differences CV^2 and
   k3 keep float64 precision).
4. Bad-input flags (non-finite l at a valid position, mask not in {0, 1}, a structural error of a kind), so every rank
   raises together after step 5; :meth:`AISStats.from_input_error` is a bad rank's vector.
4b. the mode's own sums (``mode_stats``, or batch_normalize without a closed form; over sequences for a ``seq_level``
   mode): n, sum w, sum w^2, #{w = 0}, #{w = C_seq}.
4c. two log-spaced tail histograms (factor-2 bins from 2^-14 to 256), |l| over tokens and the sequences'
   k3_i = mean_t (expm1(l^c) - l^c); a SUM gives global quantiles to a bin.
4d. the mode's ``batch_statistic`` slots (m2po's histogram of (l^c)^2), appended.
5. ONE ``all_reduce(SUM)`` over ``group`` (``NUM_SLOTS`` float64 = ``STATS_BYTES``).

A rank with no valid tokens contributes zeros and still joins the collective.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from nemo_ais.config import CorrectionConfig, require_config
from nemo_ais.core import validation
from nemo_ais.modes import MODES


class Slot(enum.IntEnum):
    """Index of each sufficient statistic in :attr:`AISStats.vector`."""

    N_SEQ = 0
    W_SEQ_SUM = enum.auto()
    W_SEQ_SQ_SUM = enum.auto()
    N_TOK = enum.auto()
    ABS_LOG_RHO_SUM = enum.auto()
    LOG_RHO_SUM = enum.auto()
    LOG_RHO_CLAMPED_SUM = enum.auto()
    N_CAPPED = enum.auto()
    W_TOK_DEV_SUM = enum.auto()
    W_TOK_DEV_SQ_SUM = enum.auto()
    RHO_DEV_SUM = enum.auto()
    EXP_ABS_DEV_SUM = enum.auto()
    N_BAD_LOGPROBS = enum.auto()
    N_BAD_MASK = enum.auto()
    N_BAD_RANKS = enum.auto()
    N_MISSING_KEY = enum.auto()
    N_BAD_DTYPE = enum.auto()
    N_BAD_SHAPE = enum.auto()
    W_MODE_N = enum.auto()
    W_MODE_SUM = enum.auto()
    W_MODE_SQ_SUM = enum.auto()
    W_MODE_ZERO = enum.auto()
    W_MODE_CAPPED = enum.auto()


# Slots that flag bad input; any of them > 0 after the all-reduce fails the global batch.
BAD_INPUT_SLOTS = (
    Slot.N_BAD_LOGPROBS,
    Slot.N_BAD_MASK,
    Slot.N_BAD_RANKS,
    Slot.N_MISSING_KEY,
    Slot.N_BAD_DTYPE,
    Slot.N_BAD_SHAPE,
)
# Structural error type -> its flag, first match wins; a ValueError (or any other type) flags a shape, rank or device
_ERROR_KIND_SLOTS = ((KeyError, Slot.N_MISSING_KEY), (TypeError, Slot.N_BAD_DTYPE), (ValueError, Slot.N_BAD_SHAPE))
# tails: two histograms of TAIL_BINS counts after the Slot scalars; bin 0 = [0, TAIL_Q0),
# bin b = [TAIL_Q0 2^(b-1), TAIL_Q0 2^b), the last open above 256
TAIL_BINS = 24
TAIL_Q0 = 2.0**-14
TAIL_QUANTILE = 0.999  # ais/abs_log_ratio_p999: the quantile read from the |l| histogram
TAIL_START = len(Slot)  # the |l| histogram; the k3 histogram follows it
NUM_SLOTS = len(Slot) + 2 * TAIL_BINS  # a mode's batch_statistic appends its own slots
STATS_BYTES = NUM_SLOTS * torch.finfo(torch.float64).bits // torch.iinfo(torch.uint8).bits
STATS_DTYPE = torch.float64


def num_slots(config: CorrectionConfig) -> int:
    """Length of the statistics vector for ``config``: NUM_SLOTS + its mode's batch statistic."""
    mode = MODES.get(getattr(config, "mode", None))
    extra = mode.batch_statistic if mode is not None else None
    return NUM_SLOTS + (extra.size if extra is not None else 0)


def tail_bin_lower_edges() -> list[float]:
    """Lower edge of each tail bin (python floats, identical on every rank)."""
    return [0.0] + [TAIL_Q0 * 2.0 ** (b - 1) for b in range(1, TAIL_BINS)]


@dataclass(frozen=True)
class AISStats:
    """Float64 vector ``[NUM_SLOTS]`` of sums (local, or global after :func:`reduce_statistics`)."""

    vector: torch.Tensor

    def __getitem__(self, slot: Slot) -> torch.Tensor:
        """0-dim float64 tensor of one slot."""
        return self.vector[slot]

    @property
    def nbytes(self) -> int:
        """Bytes moved by the all-reduce."""
        return self.vector.numel() * self.vector.element_size()

    @classmethod
    def from_sums(
        cls,
        *,
        n_seq: float,
        w_seq_sum: float,
        w_seq_sq_sum: float,
        n_tok: float,
        abs_log_rho_sum: float = 0,
        w_tok_sum: float | None = None,
        w_tok_sq_sum: float | None = None,
        log_rho_sum: float = 0,
        log_rho_clamped_sum: float = 0,
        n_capped: float = 0,
        rho_sum: float | None = None,
        exp_abs_log_rho_sum: float | None = None,
    ) -> AISStats:
        """Statistics from textbook sums (tests, tools): no-mismatch defaults, empty tails."""
        w_tok_sum = n_tok if w_tok_sum is None else w_tok_sum
        w_tok_sq_sum = n_tok if w_tok_sq_sum is None else w_tok_sq_sum
        rho_sum = n_tok if rho_sum is None else rho_sum
        exp_abs_log_rho_sum = n_tok if exp_abs_log_rho_sum is None else exp_abs_log_rho_sum
        values = {
            Slot.N_SEQ: n_seq,
            Slot.W_SEQ_SUM: w_seq_sum,
            Slot.W_SEQ_SQ_SUM: w_seq_sq_sum,
            Slot.N_TOK: n_tok,
            Slot.ABS_LOG_RHO_SUM: abs_log_rho_sum,
            Slot.LOG_RHO_SUM: log_rho_sum,
            Slot.LOG_RHO_CLAMPED_SUM: log_rho_clamped_sum,
            Slot.N_CAPPED: n_capped,
            Slot.W_TOK_DEV_SUM: w_tok_sum - n_tok,  # sum (w - 1)
            Slot.W_TOK_DEV_SQ_SUM: w_tok_sq_sum - 2 * w_tok_sum + n_tok,  # sum (w - 1)^2
            Slot.RHO_DEV_SUM: rho_sum - n_tok,
            Slot.EXP_ABS_DEV_SUM: exp_abs_log_rho_sum - n_tok,
        }
        vector = torch.zeros(NUM_SLOTS, dtype=STATS_DTYPE)
        for slot, value in values.items():
            vector[slot] = value
        return cls(vector)

    @classmethod
    def from_input_error(
        cls, error: Exception, device: torch.device | str | None = None, size: int = NUM_SLOTS
    ) -> AISStats:
        """Step 4 for a rank whose input failed a check: zeros plus its flags.

        ``error``: a :class:`~nemo_ais.core.validation.BadValuesError` adds its count, another error its kind's flag
        (``_ERROR_KIND_SLOTS``); ``size``: :func:`num_slots` of the config; ``device``: reduction device (None: CPU).
        """
        vector = torch.zeros(size, dtype=STATS_DTYPE, device=device)
        vector[Slot.N_BAD_RANKS] = 1
        if isinstance(error, validation.BadValuesError):  # values of a loss input, counted
            vector[Slot.N_BAD_MASK if error.in_mask else Slot.N_BAD_LOGPROBS] = error.count
            return cls(vector)
        vector[next((slot for t, slot in _ERROR_KIND_SLOTS if isinstance(error, t)), Slot.N_BAD_SHAPE)] = 1
        return cls(vector)


def _log_rho64(logp_old, logp_rollout, valid):
    """Step 1: float64 raw l (0 where invalid or non-finite) and the valid-and-finite mask."""
    log_rho = logp_old.detach().to(STATS_DTYPE, copy=True).sub_(logp_rollout.detach())
    ok = torch.isfinite(log_rho).logical_and_(valid)
    return log_rho.masked_fill_(ok.logical_not(), 0.0), ok


def _sequence_sums(log_rho_c, n_tok_seq, config):
    """Step 2: n_seq, sum W, sum W^2 over sequences with a valid token."""
    has_tok_seq = n_tok_seq > 0
    log_w_seq = log_rho_c.sum(dim=-1)
    if config.seq_weight == "geometric":
        log_w_seq = log_w_seq / n_tok_seq.clamp(min=1)
    log_w_seq = log_w_seq.clamp(min=-config.log_ratio_clamp, max=config.log_ratio_clamp)
    w_seq = torch.exp(log_w_seq) * has_tok_seq
    return [has_tok_seq.sum().to(STATS_DTYPE), w_seq.sum(), w_seq.square().sum()]


def _token_sums(log_rho, log_rho_c, n_tok, config):
    """Step 3: token sums (every summand 0 where l = 0); two float64 temporaries reused in place."""
    cap_dev = config.weight_cap - 1
    abs_log_rho = log_rho.abs()
    abs_sum = abs_log_rho.sum()
    exp_abs_dev = abs_log_rho.clamp_(max=config.log_ratio_clamp).expm1_()  # reuses |l|
    rho_dev = torch.expm1(log_rho_c)
    rho_dev_sum = rho_dev.sum()
    # the weights the loss applies: min(exp(l), C) of the RAW l (inf above ~709 is capped)
    w_dev = torch.expm1(log_rho, out=rho_dev)  # reuses rho - 1
    n_capped = torch.count_nonzero(w_dev > cap_dev).to(STATS_DTYPE)
    w_dev = w_dev.clamp_(max=cap_dev).reshape(-1)
    return [
        n_tok,
        abs_sum,
        log_rho.sum(),
        log_rho_c.sum(),
        n_capped,
        w_dev.sum(),
        torch.dot(w_dev, w_dev),
        rho_dev_sum,
        exp_abs_dev.sum(),
    ]


def _mode_sums(logp_old, logp_rollout, ok, n_tok_seq, config):
    """Step 4b: n, sum w, sum w^2, #{w = 0}, #{w = C_seq} of w_hat (zeros if not needed)."""
    mode = MODES[config.mode]
    needed = mode.mode_stats or (config.batch_normalize and mode.batch_mean is None)
    if not needed:
        return [torch.zeros((), dtype=STATS_DTYPE, device=ok.device)] * 5
    w = mode.weight(logp_old, logp_rollout, ok, config, None).to(STATS_DTYPE)
    kept = ok
    if mode.seq_level:
        kept = n_tok_seq > 0
        w = w.amax(dim=-1) if w.shape[-1] > 0 else w.sum(dim=-1)  # w_i (0 if no token)
    capped = (w >= config.seq_weight_cap) if mode.seq_level else torch.zeros_like(kept)
    return [
        kept.sum().to(STATS_DTYPE),
        w.sum(),
        w.square().sum(),
        ((w == 0) & kept).sum().to(STATS_DTYPE),
        (capped & kept).sum().to(STATS_DTYPE),
    ]


def _tail_bin(x):
    """Tail bin of each x >= 0: 0 below TAIL_Q0, else floor(log2(x / TAIL_Q0)) + 1, capped."""
    index = torch.log2(x / TAIL_Q0).floor_().add_(1).clamp_(0, TAIL_BINS - 1)
    return torch.where(x < TAIL_Q0, 0, index).long()


def _tail_histograms(log_rho, log_rho_c, n_tok_seq):
    """Step 4c: |l| and k3_i counts per tail bin (invalid positions in bin 0: caller drops)."""
    abs_log_rho = log_rho.abs().reshape(-1)
    k3_seq = (torch.expm1(log_rho_c) - log_rho_c).sum(dim=-1) / n_tok_seq.clamp(min=1)
    counts = torch.zeros(2, TAIL_BINS, dtype=STATS_DTYPE, device=log_rho.device)
    counts[0].index_add_(0, _tail_bin(abs_log_rho), torch.ones_like(abs_log_rho))
    counts[1].index_add_(0, _tail_bin(k3_seq), torch.ones_like(k3_seq))
    return counts


def _bad_counts(valid, n_tok, mask):
    """Step 4: #non-finite l at valid positions, #mask values not in {0, 1}, rank flags."""
    n_bad_logprobs = valid.sum().to(STATS_DTYPE) - n_tok
    zero = torch.zeros_like(n_bad_logprobs)
    n_bad_mask = zero if mask.dtype == torch.bool else torch.count_nonzero(mask * (1 - mask)).to(STATS_DTYPE)
    n_bad_ranks = (n_bad_logprobs + n_bad_mask > 0).to(STATS_DTYPE)
    return [n_bad_logprobs, n_bad_mask, n_bad_ranks, zero, zero, zero]  # no structural error


@torch.no_grad()
def compute_statistics(
    logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, config: CorrectionConfig
) -> AISStats:
    """Steps 1-4: this rank's sufficient statistics (no communication, no host sync).

    Args:
        logp_old: ``[B, T]`` trainer log-probs (``prev_logprobs``), any float dtype.
        logp_rollout: ``[B, T]`` rollout log-probs (``generation_logprobs``).
        mask: ``[B, T]`` bool or float in {0, 1}.
        config: the ``loss_fn.ais`` section.

    Returns:
        :class:`AISStats` (float64 on ``logp_old.device``); zeros for an empty batch; bad
        values at valid positions counted in the ``N_BAD_*`` slots, masked ones ignored.

    Raises:
        TypeError, ValueError: wrong type, shape, device or ``config`` (a distributed caller
            sends :meth:`AISStats.from_input_error` instead).
    """
    require_config(config, CorrectionConfig, "compute_statistics(config)")
    validation.check_ratio_inputs(logp_old, logp_rollout, mask)
    valid = validation.valid_positions(mask)
    log_rho, ok = _log_rho64(logp_old, logp_rollout, valid)  # step 1
    clamp = config.log_ratio_clamp
    log_rho_c = log_rho.clamp(min=-clamp, max=clamp)
    n_tok_seq = ok.sum(dim=-1).to(STATS_DTYPE)
    n_tok = n_tok_seq.sum()
    seq_sums = _sequence_sums(log_rho_c, n_tok_seq, config)  # step 2
    tok_sums = _token_sums(log_rho, log_rho_c, n_tok, config)  # step 3
    bad = _bad_counts(valid, n_tok, mask)  # step 4
    norm = _mode_sums(logp_old, logp_rollout, ok, n_tok_seq, config)  # step 4b
    tails = _tail_histograms(log_rho, log_rho_c, n_tok_seq)  # step 4c
    tails[0, 0] -= ok.numel() - n_tok  # invalid positions (l = 0) are not tokens
    tails[1, 0] -= n_tok_seq.numel() - seq_sums[0]  # nor are empty sequences
    vector = torch.cat([torch.stack(seq_sums + tok_sums + bad + norm), tails.reshape(-1)])
    extra = MODES[config.mode].batch_statistic
    if extra is not None:  # step 4d
        vector = torch.cat([vector, extra.sums(log_rho_c, ok, n_tok)])
    return AISStats(vector)


def reduce_statistics(stats: AISStats, group: torch.distributed.ProcessGroup | None = None) -> AISStats:
    """Step 5: global :class:`AISStats` by ONE ``all_reduce(SUM)`` over ``group`` (None: a copy)."""
    if group is None:
        return stats
    vector = stats.vector.clone()
    torch.distributed.all_reduce(vector, op=torch.distributed.ReduceOp.SUM, group=group)
    return AISStats(vector)
