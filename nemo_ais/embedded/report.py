# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Plots and ``summary.md`` of an embedded run, from its ``metrics.jsonl`` alone.

``nemo-ais report RUN_DIR`` calls :func:`write_report`. Records: ``kind: train`` (one per
GRPO step: reward, loss, ``ais/*`` diagnostics, applied ``alpha``, timings) and
``kind: val`` (held-out greedy accuracy at step 0, every ``grpo.val_period`` steps and at
the end). Seed bands are mean +- std over seeds (sample std, ddof = 1).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["arm_summary", "load_metrics", "write_report"]

PLOTS = {
    "reward.png": ("train", "reward", "rollout reward (mean over the batch)"),
    "accuracy.png": ("val", "accuracy", "held-out greedy accuracy"),
}
DIAGNOSTICS = (
    ("alpha", "applied alpha (0: uncorrected, 1: full IS)"),
    ("ais/ess_seq", "sequence ESS ratio R"),
    ("ais/severity", "severity D = mean |log rho|"),
    ("ais/cv_w", "CV of the truncated token weights"),
)


def load_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` (a line cut by a crash is skipped).

    Raises:
        FileNotFoundError: no such file (named).
        ValueError: the file holds no record.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected a run directory of nemo-ais run")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not records:
        raise ValueError(f"{path} holds no metrics record")
    return records


def _series(records, kind: str, key: str) -> dict[str, dict[int, dict[int, float]]]:
    """Values by arm, then seed, then step."""
    out: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("kind") == kind and key in r and r[key] is not None:
            out[r["arm"]][r["seed"]][r["step"]] = float(r[key])
    return out


def _band(per_seed: dict[int, dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    steps = sorted(set.intersection(*(set(v) for v in per_seed.values())))
    mean, std = [], []
    for s in steps:
        vals = [per_seed[seed][s] for seed in per_seed]
        mean.append(statistics.fmean(vals))
        std.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return steps, mean, std


def _mean_std(vals: list[float]) -> tuple[float, float]:
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _plot(ax, series, title: str, smooth: int = 1) -> None:
    for arm, per_seed in series.items():
        steps, mean, std = _band(per_seed)
        if smooth > 1 and len(mean) >= smooth:
            k = smooth
            mean = [statistics.fmean(mean[max(0, i - k + 1) : i + 1]) for i in range(len(mean))]
            std = [statistics.fmean(std[max(0, i - k + 1) : i + 1]) for i in range(len(std))]
        (line,) = ax.plot(steps, mean, label=arm)
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            color=line.get_color(),
            alpha=0.2,
        )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("GRPO step")
    ax.grid(alpha=0.3)


def arm_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: final held-out accuracy (mean, std over seeds) and step averages."""
    val = _series(records, "val", "accuracy")
    out = {}
    arms = list(dict.fromkeys(r["arm"] for r in records))
    for arm in arms:
        seeds = val.get(arm, {})
        final = [v[max(v)] for v in seeds.values() if v]
        initial = [v[min(v)] for v in seeds.values() if v]
        train = [r for r in records if r.get("kind") == "train" and r["arm"] == arm]
        last_step = max((r["step"] for r in train), default=0)
        tail = [r for r in train if r["step"] > last_step - 10]

        def avg(key, rows=train):
            vals = [r[key] for r in rows if r.get(key) is not None]
            return statistics.fmean(vals) if vals else math.nan

        out[arm] = {
            "seeds": len(final),
            "final_accuracy": _mean_std(final),
            "initial_accuracy": _mean_std(initial),
            "final_steps": sorted({max(v) for v in seeds.values() if v}),
            "reward_last10": avg("reward", tail),
            "severity": avg("ais/severity"),
            "ess_seq": avg("ais/ess_seq"),
            "alpha": avg("alpha"),
            "token_mult_prob_error": avg("ais/token_mult_prob_error"),
            "step_time": avg("time/step"),
        }
    return out


def _summary_md(run_dir: Path, records: list[dict[str, Any]]) -> str:
    summ = arm_summary(records)
    lines = [
        f"# Summary of `{run_dir}`",
        "",
        "Final held-out greedy accuracy (mean ± std over seeds), from `metrics.jsonl`.",
        "",
        "| arm | seeds | initial acc. | final acc. | reward (last 10 steps) | severity D "
        "| ESS R | applied alpha | token_mult_prob_error | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        fm, fs = s["final_accuracy"]
        im, is_ = s["initial_accuracy"]
        lines.append(
            f"| {arm} | {s['seeds']} | {im:.3f} ± {is_:.3f} | **{fm:.3f} ± {fs:.3f}** | "
            f"{s['reward_last10']:.3f} | {s['severity']:.2e} | {s['ess_seq']:.4f} | "
            f"{s['alpha']:.3f} | {s['token_mult_prob_error']:.4f} | {s['step_time']:.2f} |"
        )
    lines += [
        "",
        "Plots: `reward.png`, `accuracy.png`, `diagnostics.png` (bands: ± 1 std over seeds).",
    ]
    return "\n".join(lines) + "\n"


def write_report(run_dir: str | Path) -> list[Path]:
    """(Re)draw ``reward.png``, ``accuracy.png``, ``diagnostics.png`` and ``summary.md``.

    Returns:
        The files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = load_metrics(run_dir)
    written = []
    for name, (kind, key, title) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        _plot(ax, _series(records, kind, key), title, smooth=5 if kind == "train" else 1)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(run_dir / name, dpi=110)
        plt.close(fig)
        written.append(run_dir / name)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, DIAGNOSTICS, strict=True):
        _plot(ax, _series(records, "train", key), title)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir / "diagnostics.png", dpi=110)
    plt.close(fig)
    written.append(run_dir / "diagnostics.png")
    (run_dir / "summary.md").write_text(_summary_md(run_dir, records))
    written.append(run_dir / "summary.md")
    return written
