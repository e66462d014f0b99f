# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The tolerance curve of a dose-response run: paired Δ vs BF16 against the measured mismatch.

A dose-response run (``--preset dose``) names its arms ``k<level>-<correction>``: the rollout error scaled by
``rollout.error_scale = level``, trained with one correction (``none``, ``tis``, ``ais``, ...), next to the reference
arm (``bf16``: level 0). Per level, the x-axis is the mismatch the uncorrected arm measured (``ais/severity`` D,
``ais/kl_k3`` = NeMo-RL's ``gen_kl_error``, ``ais/token_mult_prob_error``); per correction, the paired Δ of the primary
metric to the reference with its 95% t-interval. "Significantly below BF16" at a level: the interval's upper end is
below 0. The statistics, declared before the runs: docs/results.md. ``tolerance.json`` is what ``nemo-ais analyze``
places a cluster run on (:mod:`nemo_ais.analyze.placement`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from nemo_ais.embedded.stats import arm_summary, below_zero, fmt_num, fmt_paired, paired_differences

ARM_NAME = re.compile(r"^k(?P<level>\d+(?:\.\d+)?)-(?P<correction>[a-z0-9_]+)$")
MISMATCH_KEYS = {"D": "severity", "gen_kl": "kl_k3", "tmpe": "token_mult_prob_error"}
UNCORRECTED = "none"


class Level(NamedTuple):
    """One level of the dial: the uncorrected arm's mismatch and every correction's Δ.

    Attributes:
        k: ``rollout.error_scale``.
        mismatch: ``{"D", "gen_kl", "tmpe"}`` of the uncorrected arm (nan: not run).
        delta: ``correction -> (pairs, mean, 95% half-width)`` of the paired Δ vs reference.
        seeds: ``correction -> seeds`` of the more-seeded of its arm and the reference (not in ``tolerance.json``).
    """

    k: float
    mismatch: dict[str, float]
    delta: dict[str, tuple[int, float, float]]
    seeds: dict[str, int] = {}  # noqa: RUF012 (read only)


def tolerance_table(records: list[dict[str, Any]], reference: str = "bf16") -> list[Level]:
    """Levels of the run's ``k<level>-<correction>`` arms, ascending (empty: no such arm)."""
    diffs = paired_differences(records, reference)
    summary = arm_summary(records)
    by_k: dict[float, dict[str, str]] = {}
    for arm in summary:
        m = ARM_NAME.match(arm)
        if m:
            by_k.setdefault(float(m["level"]), {})[m["correction"]] = arm
    levels = []
    for k in sorted(by_k):
        arms = by_k[k]
        none = summary.get(arms.get(UNCORRECTED, ""), {})
        mismatch = {x: float(none.get(key, math.nan)) for x, key in MISMATCH_KEYS.items()}
        delta = {c: diffs.get(arm, (0, math.nan, math.nan)) for c, arm in arms.items()}
        ref_seeds = summary.get(reference, {}).get("seeds", 0)
        seeds = {c: max(summary[arm]["seeds"], ref_seeds) for c, arm in arms.items()}
        levels.append(Level(k, mismatch, delta, seeds))
    return levels


def first_significant_level(levels: list[Level], correction: str) -> float | None:
    """The smallest ``k`` at which ``correction``'s Δ interval lies below 0 (None: none)."""
    for level in levels:
        _, mean, half = level.delta.get(correction, (0, math.nan, math.nan))
        if below_zero(mean, half):
            return level.k
    return None


def _corrections(levels: list[Level]) -> list[str]:
    seen = dict.fromkeys(c for lv in levels for c in lv.delta)
    return sorted(seen, key=lambda c: (c != UNCORRECTED, c))


def _cell(pairs: int, mean: float, half: float, seeds: int) -> str:
    """summary.md's Δ cell (:func:`~nemo_ais.embedded.stats.fmt_paired`), ``*`` below 0."""
    return fmt_paired(pairs, mean, half, seeds) + (" *" if below_zero(mean, half) else "")


def tolerance_md(levels: list[Level], reference: str = "bf16") -> str:
    """The section of ``summary.md``: the curve's table and the smallest significant levels."""
    if not levels:
        return ""
    corrections = _corrections(levels)
    head = ["k", "D (none)", "gen_kl k3 (none)", "token_mult_prob_error (none)"]
    lines = [
        "## Tolerance curve (dose-response)",
        "",
        "Per level k of the mismatch dial (`rollout.error_scale`): the uncorrected arm's measured mismatch (means over "
        f"its steps and seeds), and per correction the paired Δ of the primary metric vs `{reference}` with its 95% "
        "t-interval (`*`: the interval lies below 0; one interval per cell, not adjusted for the "
        f"{sum(len(lv.delta) for lv in levels)} cells of the table).",
        "",
        "| " + " | ".join(head + corrections) + " |",
        "|" + "---|" * (len(head) + len(corrections)),
    ]
    for lv in levels:
        m = lv.mismatch
        cells = [f"{lv.k:g}", fmt_num(m["D"], ".4f"), fmt_num(m["gen_kl"], ".2e"), fmt_num(m["tmpe"], ".4f")]
        cells += [_cell(*lv.delta.get(c, (0, math.nan, math.nan)), lv.seeds.get(c, 0)) for c in corrections]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Smallest level at which an arm is significantly below the reference (the statistic declared before the runs):",
        "",
        "| arm | smallest k below reference | D (none) there |",
        "|---|---|---|",
    ]
    for c in corrections:
        k = first_significant_level(levels, c)
        d = next((lv.mismatch["D"] for lv in levels if lv.k == k), math.nan)
        lines.append(f"| {c} | {'none of the levels run' if k is None else f'{k:g}'} | {fmt_num(d, '.4f')} |")
    return "\n".join(lines) + "\n"


def _plot(levels: list[Level], path: Path) -> None:
    from nemo_ais.plotting import pyplot, save_figures, series_style, style_axes

    fig, ax = pyplot().subplots(figsize=(6.4, 4.0))
    for i, c in enumerate(_corrections(levels)):
        pts = [
            (lv.mismatch["D"], *lv.delta[c][1:]) for lv in levels if c in lv.delta and not math.isnan(lv.delta[c][1])
        ]
        if pts:
            x, y, h = zip(*pts, strict=True)
            err = [0.0 if math.isnan(e) else e for e in h]
            style = series_style(i, len(x))
            style.pop("markevery", None)
            ax.errorbar(x, y, yerr=err, capsize=3, label=c, **style)
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    style_axes(
        ax,
        xlabel="mismatch D of the uncorrected arm (mean |log-ratio|)",
        ylabel="Δ primary metric vs bf16 (95% CI)",
        steps=False,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figures({path.name: fig}, path.parent, dpi=110)


def write_tolerance(
    run_dir: Path, records: list[dict[str, Any]], reference: str = "bf16", plots: bool = True
) -> list[Path]:
    """``tolerance.json`` (and ``tolerance.png``) of a dose-response run; [] for another run."""
    levels = tolerance_table(records, reference)
    if not levels:
        return []
    out = Path(run_dir) / "tolerance.json"
    out.write_text(json.dumps([{k: v for k, v in lv._asdict().items() if k != "seeds"} for lv in levels], indent=1))
    written = [out]
    if plots:
        _plot(levels, Path(run_dir) / "tolerance.png")
        written.append(Path(run_dir) / "tolerance.png")
    return written
