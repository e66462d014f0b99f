# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Place an analysed run on the embedded dose-response study's tolerance curve.

The study's ``tolerance.json`` (``nemo-ais run --preset dose``, :mod:`nemo_ais.embedded.tolerance`) holds per level of
the mismatch dial the uncorrected arm's mismatch and every correction's paired Δ vs BF16; the report states what it
found at the level whose D is nearest the run's (default study: :data:`STUDY`, when shipped).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from nemo_ais.analyze.reader import BadInputError

STUDY = Path(__file__).with_name("tolerance_study.json")
_KEYS = {"D": "ais/severity", "gen_kl": "ais/kl_k3", "tmpe": "ais/token_mult_prob_error"}


def load_study(path: Path | None) -> list[dict[str, Any]] | None:
    """The levels of a ``tolerance.json`` (None: ``path`` is None and none is shipped).

    Raises:
        BadInputError: the file is missing (when named), unreadable or not a study table.
    """
    if path is None:
        if not STUDY.is_file():
            return None
        path = STUDY
    path = Path(path)
    try:
        levels = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadInputError(path, 0, f"cannot read the tolerance study ({err})") from None
    ok = isinstance(levels, list) and all(
        isinstance(lv, dict) and {"k", "mismatch", "delta"} <= lv.keys() for lv in levels
    )
    if not ok or not levels:
        raise BadInputError(path, 0, "not a tolerance study: expected the tolerance.json of a dose-response run")
    return levels


def _nearest(levels: list[dict[str, Any]], d: float) -> dict[str, Any] | None:
    usable = [lv for lv in levels if math.isfinite(lv["mismatch"]["D"]) and lv["mismatch"]["D"] > 0]
    if not usable or not d > 0:
        return None
    return min(usable, key=lambda lv: abs(math.log(lv["mismatch"]["D"] / d)))


def _ci(delta: list[float]) -> str:
    _, mean, half = delta
    if mean is None or math.isnan(mean):
        return "n/a"
    if half is None or math.isnan(half):
        return f"{mean:+.3f} (one seed)"
    if half == 0:  # the study's paired differences were all equal (embedded.stats.paired_ci): no interval
        return f"{mean:+.3f} (no spread over the pairs: no CI)"
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def placement_md(rows: list[dict[str, Any]], levels: list[dict[str, Any]] | None) -> list[str]:
    """The report section: the run's mismatch and the study's finding at the nearest level."""
    run = {
        name: statistics.fmean(v)
        for name, key in _KEYS.items()
        if (v := [float(r[key]) for r in rows if math.isfinite(float(r.get(key, math.nan)))])
    }
    means = ", ".join(f"{name} = {run[name]:.4g}" for name in _KEYS if name in run)
    md = ["## This run on the embedded tolerance curve", "", f"This run's mismatch, mean over its steps: {means}."]
    if levels is None:
        return [
            *md,
            "",
            "No dose-response study is recorded with this install: run `nemo-ais run --preset "
            "dose` and pass its `tolerance.json` with `--tolerance`.",
        ]
    level = _nearest(levels, run.get("D", math.nan))
    if level is None:
        return [*md, "", "The run's D is not positive: nothing to place."]
    d = level["mismatch"]["D"]
    md += [
        "",
        f"Nearest level of the study: k = {level['k']:g}, where the uncorrected arm measured "
        f"D = {d:.4g} ({d / run['D']:.2g}x this run's). What the study found there (paired "
        "Δ of held-out accuracy vs BF16, 95% interval):",
        "",
        "| arm | Δ vs bf16 |",
        "|---|---|",
        *(f"| {arm} | {_ci(delta)} |" for arm, delta in level["delta"].items()),
        "",
        "A small-model result (the embedded CPU study: a tiny Qwen2-style policy on a "
        "synthetic task), to read this run against; not a prediction for this run's model.",
    ]
    lo, hi = min(lv["mismatch"]["D"] for lv in levels), max(lv["mismatch"]["D"] for lv in levels)
    if not lo <= run["D"] <= hi:
        md.append(
            f"The run's D lies outside the study's range [{lo:.4g}, {hi:.4g}]: the nearest level is an extrapolation."
        )
    return md
