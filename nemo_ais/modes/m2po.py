# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``m2po``: w_hat_it = 1[(l^c_it)^2 < q*], q* from the global batch (AReaL M2PO, binned).

Batch statistic: count and sum of q = (l^c)^2 in M2PO_BINS bins a factor sqrt 2 wide (from Q0, the last open above
L^2), in the same all-reduce; q* drops whole bins from the top until the kept mean q is <= tau.
"""

from __future__ import annotations

import math

from pydantic import Field

from nemo_ais.modes._base import BatchStatistic, BatchValue, Mode, log_ratio
from nemo_ais.sections import Section

M2PO_BINS = 64
M2PO_Q0 = 1e-6
M2PO_BIN_RATIO = 2**0.5
# threshold q* meaning "nothing masked": above L^2 for every allowed L (<= 80), finite
M2PO_OFF = 1e4


class M2poConfig(Section):
    """``loss_fn.ais.m2po``: the bound of the kept tokens' second moment."""

    tau: float = Field(0.04, gt=0.0, description="m2po: bound of the batch second moment mean(l^2) of the kept tokens.")


def bin_lower_edges() -> list[float]:
    """Lower edge of each bin (python floats, identical on every rank)."""
    return [0.0] + [M2PO_Q0 * M2PO_BIN_RATIO ** (b - 1) for b in range(1, M2PO_BINS)]


def histogram(log_rho_c, ok, n_tok):
    """Step 4c: counts then sums of q = (l^c)^2 per bin, ``[2 M2PO_BINS]`` (valid tokens only)."""
    q = log_rho_c.square().reshape(-1)
    index = (q / M2PO_Q0).log2().mul_(2).floor_().add_(1).clamp_(0, M2PO_BINS - 1)
    index = index.masked_fill(q < M2PO_Q0, 0).long()
    hist = q.new_zeros(2, M2PO_BINS)
    counts, sums = hist  # row views
    counts.index_add_(0, index, q.new_ones(q.shape))
    sums.index_add_(0, index, q)
    counts[0] -= ok.numel() - n_tok  # invalid positions (q = 0) are not tokens
    return hist.reshape(-1)


def threshold(tail: list[float], n_tok: float, config) -> dict[str, float]:
    """q* (lower edge of the last bin dropped) and the masked fraction, from the reduced histogram.

    Binned, so it may mask one bin more than AReaL's per-token sort; the kept second moment is <= tau either way.
    """
    counts, sums = tail[:M2PO_BINS], tail[M2PO_BINS:]
    kept_n, kept_q = n_tok, math.fsum(sums)
    q_star = M2PO_OFF
    edges = bin_lower_edges()
    for b in reversed(range(M2PO_BINS)):
        if kept_n <= 0 or kept_q <= config.m2po.tau * kept_n:
            break
        if counts[b] > 0:
            kept_n, kept_q = kept_n - counts[b], kept_q - sums[b]
            q_star = edges[b]
    return {"m2po_threshold": q_star, "mode_frac_masked": (n_tok - kept_n) / n_tok}


def weight(logp_old, logp_rollout, valid, config, q_star):
    """w_hat_it = 1[clamp(l_it, +-L)^2 < q*] (AReaL M2PO, binned; q* = 1e4 > L^2: none masked)."""
    c = config.log_ratio_clamp
    log_rho = log_ratio(logp_old, logp_rollout, valid).clamp_(min=-c, max=c)
    return (valid & (log_rho.square() < q_star)).to(log_rho.dtype)


MODE = Mode(
    name="m2po",
    weight=weight,
    importance_weight=False,
    batch_field="m2po_threshold",
    batch_statistic=BatchStatistic(
        size=2 * M2PO_BINS,
        sums=histogram,
        values=threshold,
        new_values=(
            BatchValue(
                "m2po_threshold",
                M2PO_OFF,
                "m2po: q*, tokens with l^2 >= q* masked (1e4 when nothing is masked / not m2po)",
                "> 0",
            ),
        ),
    ),
    config=M2poConfig,
    moved_keys={"m2po_tau": "tau"},
)
