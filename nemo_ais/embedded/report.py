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
the end). Seed bands are mean +- std over seeds (sample std, ddof = 1), clipped to the
metric's range (a non-negative metric never shows a band below 0).

A run shorter than :data:`EVIDENCE_MIN_STEPS` GRPO steps or with fewer than
:data:`EVIDENCE_MIN_SEEDS` seeds (``--quick``, ``--preset fp4-quick``) is a smoke run: its
summary opens with a line saying it is not evidence and why (:func:`smoke_reasons`), and
leaves out the tables whose statistic the run is too short for (the collapse step, and the
first / last :data:`EARLY_LATE_STEPS` steps, which would overlap).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from nemo_ais.plotting import series_style, style_axes

__all__ = [
    "DIAGNOSTICS",
    "EARLY_LATE_STEPS",
    "EVIDENCE_MIN_SEEDS",
    "EVIDENCE_MIN_STEPS",
    "PLOTS",
    "Collapse",
    "Panel",
    "arm_summary",
    "build_figures",
    "collapse_steps",
    "early_metric",
    "load_metrics",
    "paired_ci",
    "paired_differences",
    "primary_metric",
    "run_extent",
    "smoke_reasons",
    "t_quantile_975",
    "write_report",
]


class Panel(NamedTuple):
    """One plotted metric: record kind and key, title, y label with unit, and its bounds.

    Seed bands (mean +- std) are clipped to ``[lo, hi]``: a non-negative metric never
    shows a band below 0 (None: unbounded on that side).
    """

    kind: str
    key: str
    title: str
    ylabel: str
    lo: float | None = 0.0
    hi: float | None = None


PLOTS = {
    "reward.png": Panel(
        "train", "reward", "rollout reward (mean over the batch)", "reward (0-1)", 0.0, 1.0
    ),
    "accuracy.png": Panel(
        "val", "accuracy", "held-out greedy accuracy", "exact-match accuracy (0-1)", 0.0, 1.0
    ),
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


# The windows of the non-stationarity table: the first and the last EARLY_LATE_STEPS steps.
EARLY_LATE_STEPS = 10
# Below these, a run is a smoke run (not evidence): the early and late windows overlap, the
# collapse step reads one or two evaluations, and one seed gives no paired interval.
EVIDENCE_MIN_STEPS = 2 * EARLY_LATE_STEPS
EVIDENCE_MIN_SEEDS = 2


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


def _clip(values: list[float], lo: float | None, hi: float | None) -> list[float]:
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    return [min(max(v, lo), hi) for v in values]


def _plot(ax, series, panel: Panel, arms: list[str], smooth: int = 1) -> None:
    """Mean over seeds per arm (the arm's own marker and line style), band +- 1 std clipped."""
    for arm, per_seed in series.items():
        steps, mean, std = _band(per_seed)
        if smooth > 1 and len(mean) >= smooth:
            k = smooth
            mean = [statistics.fmean(mean[max(0, i - k + 1) : i + 1]) for i in range(len(mean))]
            std = [statistics.fmean(std[max(0, i - k + 1) : i + 1]) for i in range(len(std))]
        style = series_style(arms.index(arm), len(steps))
        ax.plot(steps, mean, label=arm, **style)
        lower = _clip([m - s for m, s in zip(mean, std, strict=True)], panel.lo, panel.hi)
        upper = _clip([m + s for m, s in zip(mean, std, strict=True)], panel.lo, panel.hi)
        ax.fill_between(steps, lower, upper, color=style["color"], alpha=0.15, linewidth=0)
    style_axes(ax, ylabel=panel.ylabel, title=panel.title)


# two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (standard table values)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """The two-sided 95% Student-t quantile ``t_{0.975, df}``.

    Table values (3 decimals) for ``df <= 30``; beyond, the Cornish-Fisher expansion
    around the normal quantile (error < 1e-4 for df > 30).

    Raises:
        ValueError: ``df < 1``.
    """
    if df < 1:
        raise ValueError(f"df={df} is invalid: expected >= 1 (at least two seeds)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_ci(diffs: list[float]) -> tuple[float, float]:
    """Mean and 95% CI half-width of paired differences (Student t, n - 1 df).

    Returns ``(mean, nan)`` for a single pair (no interval) and ``(nan, nan)`` for none.
    """
    if not diffs:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan
    return mean, t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))


def primary_metric(records: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The primary metric (declared before any run), per arm and seed.

    The mean held-out greedy accuracy over the evaluations in the second half of training.
    "Second half": the evaluations at steps ``s >= S / 2``, ``S`` the run's last evaluated
    step (with ``grpo.val_period = 10`` and 60 steps: steps 30, 40, 50, 60).
    """
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for arm, seeds in _series(records, "val", "accuracy").items():
        for seed, by_step in seeds.items():
            last = max(by_step)
            vals = [v for step, v in by_step.items() if step >= last / 2]
            out[arm][seed] = statistics.fmean(vals)
    return out


def _early_late(
    train: list[dict[str, Any]], key: str, k: int = EARLY_LATE_STEPS
) -> tuple[float, float]:
    """Mean of ``key`` over the first ``k`` and the last ``k`` steps (all seeds pooled)."""
    steps = sorted({r["step"] for r in train})
    first, last = set(steps[:k]), set(steps[-k:])
    pick = lambda sel: [r[key] for r in train if r["step"] in sel and r.get(key) is not None]  # noqa: E731
    a, b = pick(first), pick(last)
    return (statistics.fmean(a) if a else math.nan), (statistics.fmean(b) if b else math.nan)


def _corr(train: list[dict[str, Any]], x: str, y: str) -> float:
    """Pearson correlation of ``x`` and ``y`` over the train records (nan if undefined)."""
    pts = [(r[x], r[y]) for r in train if r.get(x) is not None and r.get(y) is not None]
    if len(pts) < 3:
        return math.nan
    try:
        return statistics.correlation(*zip(*pts, strict=True))
    except statistics.StatisticsError:  # a constant series
        return math.nan


# error_tokens/<key> of every train record (nemo_ais.embedded.error_tokens)
_ERROR_TOKEN_KEYS = ("repeat_frac", "invalid_frac", "error_frac")


def arm_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: held-out accuracy (initial, final, primary metric) and step averages."""
    val = _series(records, "val", "accuracy")
    primary = primary_metric(records)
    out = {}
    arms = list(dict.fromkeys(r["arm"] for r in records))
    for arm in arms:
        seeds = val.get(arm, {})
        final = [v[max(v)] for v in seeds.values() if v]
        initial = [v[min(v)] for v in seeds.values() if v]
        train = [r for r in records if r.get("kind") == "train" and r["arm"] == arm]
        last_step = max((r["step"] for r in train), default=0)
        tail = [r for r in train if r["step"] > last_step - EARLY_LATE_STEPS]

        def avg(key, rows=train):
            vals = [r[key] for r in rows if r.get(key) is not None]
            return statistics.fmean(vals) if vals else math.nan

        out[arm] = {
            "seeds": len(final),
            "final_accuracy": _mean_std(final),
            "initial_accuracy": _mean_std(initial),
            "primary": _mean_std(list(primary.get(arm, {}).values())),
            "final_steps": sorted({max(v) for v in seeds.values() if v}),
            "reward_last10": avg("reward", tail),
            "severity": avg("ais/severity"),
            "ess_seq": avg("ais/ess_seq"),
            "ess_seq_min": min(
                (r["ais/ess_seq"] for r in train if "ais/ess_seq" in r), default=math.nan
            ),
            "ess_tok": avg("ess_tok"),
            "kl_k3": avg("ais/kl_k3"),
            "alpha": avg("alpha"),
            "token_mult_prob_error": avg("ais/token_mult_prob_error"),
            "response_length": avg("response_length"),
            "step_time": avg("time/step"),
            "severity_early_late": _early_late(train, "ais/severity"),
            "ess_seq_early_late": _early_late(train, "ais/ess_seq"),
            "entropy_early_late": _early_late(train, "entropy"),
            "corr_d_step": _corr(train, "step", "ais/severity"),
            "corr_d_entropy": _corr(train, "entropy", "ais/severity"),
            **{k: avg(f"error_tokens/{k}") for k in _ERROR_TOKEN_KEYS},
        }
    return out


def early_metric(records: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per arm and seed: the held-out accuracy at the first evaluation after step 0.

    A secondary metric (how fast an arm learns), reported next to the primary one.
    """
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for arm, seeds in _series(records, "val", "accuracy").items():
        for seed, by_step in seeds.items():
            later = [s for s in by_step if s > 0]
            if later:
                out[arm][seed] = by_step[min(later)]
    return out


def paired_differences(
    records: list[dict[str, Any]], reference: str = "bf16", metric=None
) -> dict[str, tuple[int, float, float]]:
    """Paired differences of the primary metric to ``reference``, per other arm.

    Returns:
        arm -> ``(pairs, mean, 95% CI half-width)`` of the per-seed differences
        ``arm - reference`` (seeds present in both arms) of ``metric(records)``
        (default :func:`primary_metric`).
    """
    primary = (metric or primary_metric)(records)
    ref = primary.get(reference, {})
    out = {}
    for arm, by_seed in primary.items():
        if arm == reference:
            continue
        diffs = [by_seed[s] - ref[s] for s in sorted(by_seed) if s in ref]
        out[arm] = (len(diffs), *paired_ci(diffs))
    return out


class Collapse(NamedTuple):
    """Where an arm's held-out accuracy first falls below half of the reference arm's.

    ``step``: on the mean over seeds (None: never); ``per_seed``: each seed paired with the
    reference's same seed (None: never); ``seeds_collapsed`` of ``seeds`` paired seeds.
    """

    step: int | None
    seeds_collapsed: int
    seeds: int
    per_seed: dict[int, int | None]


def _first_below_half(arm: dict[int, float], ref: dict[int, float]) -> int | None:
    """First step s (of both curves) with ``arm[s] < ref[s] / 2``; None if there is none."""
    return next((s for s in sorted(set(arm) & set(ref)) if arm[s] < ref[s] / 2), None)


def collapse_steps(records: list[dict[str, Any]], reference: str = "bf16") -> dict[str, Collapse]:
    """Collapse step of every other arm: accuracy first below half of ``reference``'s.

    Declared before the runs. At evaluation step s, arm collapses iff
    ``acc_arm(s) < acc_reference(s) / 2`` (held-out greedy accuracy, the primary metric's
    quantity), on the mean over the seeds both arms ran (at the steps every one of them
    evaluated) and, per seed, paired with the reference's same seed. A reference accuracy
    of 0 at s never counts (nothing is below 0). No seed shared with the reference (or no
    reference arm): ``Collapse(None, 0, 0, {})``.

    Returns:
        arm -> :class:`Collapse` (the reference arm itself is left out).
    """
    val = _series(records, "val", "accuracy")
    ref = val.get(reference, {})
    out = {}
    for arm, per_seed in val.items():
        if arm == reference:
            continue
        seeds = sorted(set(per_seed) & set(ref))
        paired = {seed: _first_below_half(per_seed[seed], ref[seed]) for seed in seeds}
        mean_step = None
        if seeds:
            arm_mean = dict(zip(*_band({s: per_seed[s] for s in seeds})[:2], strict=True))
            ref_mean = dict(zip(*_band({s: ref[s] for s in seeds})[:2], strict=True))
            mean_step = _first_below_half(arm_mean, ref_mean)
        out[arm] = Collapse(
            step=mean_step,
            seeds_collapsed=sum(s is not None for s in paired.values()),
            seeds=len(paired),
            per_seed=paired,
        )
    return out


def _collapse_cells(collapse: dict[str, Collapse], arm: str, reference: str) -> str:
    """The collapse table's cells of ``arm``: "—" for the reference itself."""
    if arm == reference:
        return "— | — | —"
    c = collapse.get(arm)
    if c is None:
        return "n/a | n/a | n/a"
    steps = ", ".join(f"{seed}: {'none' if s is None else s}" for seed, s in c.per_seed.items())
    first = "none" if c.step is None else str(c.step)
    return f"{first} | {c.seeds_collapsed} / {c.seeds} | {steps or 'n/a'}"


def _fmt_ci(mean: float, half: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:+.{digits}f} (one seed: no CI)"
    return f"{mean:+.{digits}f} [{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]"


def _delta_cell(diffs: dict[str, tuple[int, float, float]], arm: str, reference: str) -> str:
    """The "Δ vs reference" table cell of ``arm``: "—" for the reference itself."""
    if arm == reference:
        return "—"
    return _fmt_ci(*diffs.get(arm, (0, math.nan, math.nan))[1:])


def run_extent(records: list[dict[str, Any]]) -> tuple[int, int]:
    """``(steps, seeds)``: the last step recorded, and the most seeds any arm ran."""
    steps = max((int(r["step"]) for r in records if "step" in r), default=0)
    seeds: dict[str, set[int]] = defaultdict(set)
    for r in records:
        if "arm" in r and "seed" in r:
            seeds[r["arm"]].add(r["seed"])
    return steps, max((len(v) for v in seeds.values()), default=0)


def smoke_reasons(records: list[dict[str, Any]]) -> list[str]:
    """Why the run is a smoke run, not evidence (empty: it is long enough to be evidence).

    A run is a smoke run when it has fewer than :data:`EVIDENCE_MIN_STEPS` GRPO steps or
    fewer than :data:`EVIDENCE_MIN_SEEDS` seeds.
    """
    steps, seeds = run_extent(records)
    reasons = []
    if steps < EVIDENCE_MIN_STEPS:
        reasons.append(f"{steps} GRPO steps (evidence: >= {EVIDENCE_MIN_STEPS})")
    if seeds < EVIDENCE_MIN_SEEDS:
        reasons.append(f"{seeds} seed (no paired confidence interval; evidence: >= 2)")
    return reasons


def _fmt_corr(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def _summary_md(run_dir: Path, records: list[dict[str, Any]], reference: str = "bf16") -> str:
    summ = arm_summary(records)
    diffs = paired_differences(records, reference)
    n_seeds = max((s["seeds"] for s in summ.values()), default=0)
    n_steps = run_extent(records)[0]
    smoke = smoke_reasons(records)
    lines = [f"# Summary of `{run_dir}`", ""]
    if smoke:
        lines += [
            f"**Smoke run, not evidence:** {'; '.join(smoke)}. It checks that the pipeline "
            "runs end to end; differences between its arms are noise. Evidence: `nemo-ais run "
            "--preset evidence` (FP8) or `--preset fp4-evidence` (NVFP4), 60 steps x 8 seeds "
            "(docs/results.md).",
            "",
        ]
    lines += [
        "Computed from `metrics.jsonl` by `nemo_ais.embedded.report` (nothing edited by hand).",
        "",
        "**Primary metric (declared before the runs):** per arm and seed, the mean held-out "
        "greedy exact-match accuracy over the evaluations in the second half of training "
        f"(steps >= last/2). **Comparison:** per-seed paired difference to `{reference}`, "
        "mean and 95% confidence interval (Student t, seeds - 1 degrees of freedom). "
        "**Collapse step:** per arm, the first evaluation step at which its held-out "
        f"accuracy falls below half of `{reference}`'s at the same step, on the mean over "
        f"seeds and per seed (paired with the same seed of `{reference}`); none if it never "
        "does.",
        "",
        f"| arm | seeds | initial acc. | final acc. | primary metric | Δ vs {reference} "
        "(paired, 95% CI) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        fm, fs = s["final_accuracy"]
        im, is_ = s["initial_accuracy"]
        pm, ps = s["primary"]
        delta = _delta_cell(diffs, arm, reference)
        lines.append(
            f"| {arm} | {s['seeds']} | {im:.3f} ± {is_:.3f} | {fm:.3f} ± {fs:.3f} | "
            f"**{pm:.3f} ± {ps:.3f}** | {delta} |"
        )
    early = early_metric(records)
    early_diffs = paired_differences(records, reference, early_metric)
    lines += [
        "",
        f"(mean ± sample std over {n_seeds} seed(s).)",
        "",
        "Secondary: held-out accuracy at the first evaluation after step 0 (how fast an "
        f"arm learns), and its paired difference to `{reference}`:",
        "",
        f"| arm | early acc. | Δ vs {reference} (paired, 95% CI) |",
        "|---|---|---|",
    ]
    for arm in summ:
        em, es = _mean_std(list(early.get(arm, {}).values()))
        lines.append(
            f"| {arm} | {em:.3f} ± {es:.3f} | {_delta_cell(early_diffs, arm, reference)} |"
        )
    lines += _collapse_md(records, summ, reference, n_steps)
    tail = f"last {EARLY_LATE_STEPS}" if n_steps > EARLY_LATE_STEPS else f"all {n_steps} steps"
    lines += [
        "",
        "",
        "Mismatch diagnostics, averaged over all steps and seeds (`ais/*`: the log-probs of "
        "the arm's simulated rollout engine, in its rollout format, against the trainer's):",
        "",
        "| arm | severity D | ESS seq (mean / min) | ESS tok | KL k3 | token_mult_prob_error "
        f"| applied α | reward ({tail}) | response tokens | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        lines.append(
            f"| {arm} | {s['severity']:.2e} | {s['ess_seq']:.4f} / {s['ess_seq_min']:.4f} | "
            f"{s['ess_tok']:.4f} | {s['kl_k3']:.2e} | {s['token_mult_prob_error']:.4f} | "
            f"{s['alpha']:.3f} | {s['reward_last10']:.3f} | {s['response_length']:.1f} | "
            f"{s['step_time']:.2f} |"
        )
    lines += _non_stationarity_md(summ, n_steps)
    lines += [
        "",
        "Error tokens (QaRL's repetitive, garbled tokens; `nemo_ais.embedded.error_tokens`), "
        "fraction of response tokens before `<eos>`, averaged over all steps and seeds:",
        "",
        "| arm | repeated 3-gram | off-alphabet | either |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {arm} | " + " | ".join(f"{s[k]:.4f}" for k in _ERROR_TOKEN_KEYS) + " |"
        for arm, s in summ.items()
    ]
    lines += [
        "",
        "Plots: `reward.png`, `accuracy.png`, `diagnostics.png` (against the GRPO step), "
        "`mismatch_vs_entropy.png` (severity D against the policy entropy); bands: ± 1 std "
        "over seeds, clipped to each metric's range.",
    ]
    return "\n".join(lines) + "\n"


def _collapse_md(records, summ, reference: str, n_steps: int) -> list[str]:
    """The collapse table, or (a run shorter than EVIDENCE_MIN_STEPS) why it is left out."""
    if n_steps < EVIDENCE_MIN_STEPS:
        return [
            "",
            f"Collapse step: left out. A {n_steps}-step run has too few evaluations for a "
            f"first drop below ½ × `{reference}`'s accuracy to mean a collapse (computed "
            f"for runs of >= {EVIDENCE_MIN_STEPS} steps).",
        ]
    collapse = collapse_steps(records, reference)
    lines = [
        "",
        f"Collapse: the first evaluation step with held-out accuracy < ½ × `{reference}`'s "
        "at the same step (none: never):",
        "",
        "| arm | collapse step (seed mean) | seeds collapsed | collapse step per seed |",
        "|---|---|---|---|",
    ]
    return lines + [f"| {arm} | {_collapse_cells(collapse, arm, reference)} |" for arm in summ]


def _non_stationarity_md(summ, n_steps: int) -> list[str]:
    """First / last EARLY_LATE_STEPS steps and the correlations; left out if they overlap."""
    k = EARLY_LATE_STEPS
    if n_steps < 2 * k:
        return [
            "",
            f"Non-stationarity (first {k} → last {k} steps): left out, a {n_steps}-step run "
            f"has no two disjoint {k}-step windows.",
        ]
    lines = [
        "",
        f"Non-stationarity: first {k} steps → last {k} steps (all seeds pooled), and the "
        "Pearson correlation of D with the step and with the policy entropy over every "
        "(step, seed) (n/a: undefined, D or the entropy constant or fewer than 3 points):",
        "",
        "| arm | severity D | ESS seq | policy entropy (nats/token) | corr(D, step) "
        "| corr(D, entropy) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        (d0, d1), (e0, e1), (h0, h1) = (
            s["severity_early_late"],
            s["ess_seq_early_late"],
            s["entropy_early_late"],
        )
        lines.append(
            f"| {arm} | {d0:.2e} → {d1:.2e} | {e0:.4f} → {e1:.4f} | {h0:.4f} → {h1:.4f} | "
            f"{_fmt_corr(s['corr_d_step'])} | {_fmt_corr(s['corr_d_entropy'])} |"
        )
    return lines


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty panel gets no empty legend
        ax.legend(title="arm", fontsize=8)


def build_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's matplotlib figures by file name (the caller saves and closes them).

    ``reward.png``, ``accuracy.png`` (one panel each), ``diagnostics.png`` (the
    :data:`DIAGNOSTICS` panels, one legend for the figure) and ``mismatch_vs_entropy.png``
    (severity D against the policy entropy, one point per step and seed). Every arm keeps
    one colour, marker and line style in all of them, in the order the arms first appear.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(r["arm"] for r in records))
    figures = {}
    for name, panel in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        smooth = 5 if panel.kind == "train" else 1
        _plot(ax, _series(records, panel.kind, panel.key), panel, arms, smooth=smooth)
        if smooth > 1:
            ax.set_title(f"{panel.title}, {smooth}-step moving mean", fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        _legend(ax)
        fig.tight_layout()
        figures[name] = fig
    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for ax, panel in zip(axes.flat, DIAGNOSTICS, strict=True):
        _plot(ax, _series(records, panel.kind, panel.key), panel, arms)
    handles = {}  # one entry per arm, from whichever panel has it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            title="arm",
            loc="upper center",
            ncol=len(handles),
            fontsize=9,
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
                *zip(*pts, strict=True),
                s=12,
                alpha=0.6,
                label=arm,
                color=style["color"],
                marker=style["marker"],
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


def write_report(run_dir: str | Path) -> list[Path]:
    """(Re)draw the plots and ``summary.md`` of ``run_dir`` from its ``metrics.jsonl``.

    Plots (:func:`build_figures`): ``reward.png``, ``accuracy.png``, ``diagnostics.png``,
    ``mismatch_vs_entropy.png``.

    Returns:
        The files written.
    """
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = load_metrics(run_dir)
    written = []
    for name, fig in build_figures(records).items():
        fig.savefig(run_dir / name, dpi=110)
        plt.close(fig)
        written.append(run_dir / name)
    (run_dir / "summary.md").write_text(_summary_md(run_dir, records, _reference_arm(run_dir)))
    written.append(run_dir / "summary.md")
    return written


def _reference_arm(run_dir: Path) -> str:
    """``experiment.reference_arm`` of the run's pinned ``config.yaml`` (default ``bf16``)."""
    cfg_file = run_dir / "config.yaml"
    if cfg_file.is_file():
        import yaml

        cfg = yaml.safe_load(cfg_file.read_text()) or {}
        ref = (cfg.get("experiment") or {}).get("reference_arm")
        if ref:
            return str(ref)
    return "bf16"
