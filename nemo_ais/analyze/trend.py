# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Least-squares trend of a metric over steps, with a Student-t confidence interval.

y_s = a + b s + e_s; b = S_xy / S_xx, se(b) = sqrt(SSE / (n - 2) / S_xx), and the two-sided CI is
b +- t_{(1+level)/2, n-2} se(b). The t quantile needs only the standard library: exact for 1 and 2 degrees of freedom,
the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5) above (relative error 1.2e-3 at 3, < 1.1e-4 from 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom at probability ``p`` (0.5 < p < 1)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Trend:
    """Fitted slope per step, its CI, and the direction the CI supports."""

    slope: float
    lo: float
    hi: float
    n: int
    level: float

    @property
    def direction(self) -> str:
        """``grows`` (CI above 0), ``falls`` (CI below 0) or ``flat`` (CI contains 0)."""
        if self.lo > 0:
            return "grows"
        if self.hi < 0:
            return "falls"
        return "flat"


def fit_trend(steps: list[float], values: list[float], level: float = 0.95) -> Trend | None:
    """OLS slope of ``values`` over ``steps`` with its ``level`` CI; None if n < 3, S_xx = 0 or overflow."""
    pairs = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    n = len(pairs)
    if n < 3:
        return None
    mean_s = math.fsum(s for s, _ in pairs) / n
    mean_v = math.fsum(v for _, v in pairs) / n
    s_xx = math.fsum((s - mean_s) ** 2 for s, _ in pairs)
    if s_xx == 0:
        return None
    try:
        slope = math.fsum((s - mean_s) * (v - mean_v) for s, v in pairs) / s_xx
        sse = math.fsum((v - mean_v - slope * (s - mean_s)) ** 2 for s, v in pairs)
    except OverflowError:  # values near float64's limit: no trend to report
        return None
    se = math.sqrt(sse / (n - 2) / s_xx)
    half = t_quantile((1 + level) / 2, n - 2) * se
    if not math.isfinite(slope - half) or not math.isfinite(slope + half):
        return None
    return Trend(slope, slope - half, slope + half, n, level)
