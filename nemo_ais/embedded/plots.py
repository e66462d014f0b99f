# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The plots of an embedded run: reward, accuracy, the diagnostics panels, D vs entropy."""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

from nemo_ais.embedded.stats import band, series
from nemo_ais.plotting import pyplot, series_style, style_axes


class Panel(NamedTuple):
    """One plotted metric: record kind and key, title, y label with unit, and its bounds.

    The seed band (mean +- sample std over seeds) is clipped to ``[lo, hi]`` (None: unbounded on that side).
    """

    kind: str
    key: str
    title: str
    ylabel: str
    lo: float | None = 0.0
    hi: float | None = None


PLOTS = {
    "reward.png": Panel("train", "reward", "rollout reward (mean over the batch)", "reward (0-1)", 0.0, 1.0),
    "accuracy.png": Panel("val", "accuracy", "held-out greedy accuracy", "exact-match accuracy (0-1)", 0.0, 1.0),
}
DIAGNOSTICS = (
    Panel("train", "ais/severity", "severity D = mean |log rho|", "D (nats / token)"),
    Panel("train", "ais/ess_seq", "sequence ESS ratio R", "R (fraction of sequences)", 0, 1),
    Panel("train", "ess_tok", "token ESS ratio (truncated weights)", "ESS / tokens", 0, 1),
    Panel("train", "ais/cv_w", "CV of the truncated token weights", "CV (std / mean)"),
    Panel("train", "ais/kl_k3", "KL k3 (rollout vs trainer)", "KL (nats / token)"),
    Panel("train", "alpha", "applied alpha", "alpha (0: uncorrected, 1: IS)", 0, 1),
    Panel("train", "entropy", "policy entropy", "entropy (nats / token)"),
    Panel(
        "train",
        "ais/token_mult_prob_error",
        "token_mult_prob_error (NeMo-RL's metric)",
        "mean exp(|log rho|) (1: no error)",
        lo=1.0,
    ),
)


def _clip(values: list[float], lo: float | None, hi: float | None) -> list[float]:
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    return [min(max(v, lo), hi) for v in values]


def _trailing_mean(values: list[float], k: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def _plot(ax, series, panel: Panel, arms: list[str], smooth: int = 1) -> None:
    """Mean over seeds per arm (the arm's own marker and line style), band +- 1 std clipped."""
    for arm, per_seed in series.items():
        steps, mean, std = band(per_seed)
        if smooth > 1 and len(mean) >= smooth:
            mean, std = _trailing_mean(mean, smooth), _trailing_mean(std, smooth)
        style = series_style(arms.index(arm), len(steps))
        ax.plot(steps, mean, label=arm, **style)
        lower = _clip([m - s for m, s in zip(mean, std, strict=True)], panel.lo, panel.hi)
        upper = _clip([m + s for m, s in zip(mean, std, strict=True)], panel.lo, panel.hi)
        ax.fill_between(steps, lower, upper, color=style["color"], alpha=0.15, linewidth=0)
    style_axes(ax, ylabel=panel.ylabel, title=panel.title)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty panel gets no empty legend
        ax.legend(title="arm", fontsize=8)


def build_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's matplotlib figures by file name (the caller saves and closes them); each arm keeps one style."""
    plt = pyplot()
    arms = list(dict.fromkeys(r["arm"] for r in records))
    figures = {}
    for name, panel in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        smooth = 5 if panel.kind == "train" else 1
        _plot(ax, series(records, panel.kind, panel.key), panel, arms, smooth=smooth)
        if smooth > 1:
            ax.set_title(f"{panel.title}, {smooth}-step moving mean", fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        _legend(ax)
        fig.tight_layout()
        figures[name] = fig
    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for ax, panel in zip(axes.flat, DIAGNOSTICS, strict=True):
        _plot(ax, series(records, panel.kind, panel.key), panel, arms)
    handles = {}  # one entry per arm, from whichever panel has it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()), list(handles), title="arm", loc="upper center", ncol=len(handles), fontsize=9
        )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    figures["diagnostics.png"] = fig
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, arm in enumerate(arms):
        pts = [
            (r["entropy"], r["ais/severity"])
            for r in records
            if r.get("kind") == "train" and r["arm"] == arm and "entropy" in r
        ]
        if pts:
            style = series_style(i, len(pts))
            ax.scatter(
                *zip(*pts, strict=True), s=12, alpha=0.6, label=arm, color=style["color"], marker=style["marker"]
            )
    style_axes(
        ax,
        xlabel="policy entropy (nats / token)",
        ylabel="severity D = mean |log rho| (nats / token)",
        title="mismatch against policy entropy (one point per step and seed)",
        steps=False,
    )
    _legend(ax)
    fig.tight_layout()
    figures["mismatch_vs_entropy.png"] = fig
    return figures
