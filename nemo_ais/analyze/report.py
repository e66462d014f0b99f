# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``report.md`` and the PNG plots of an analysis, from its ``analysis.jsonl`` rows alone.

Every statement of the report is a number read off these rows: the fitted trend of the mismatch (:mod:`.trend`), the
alarms and the recommendation ("alpha > 0.5 on 85% of steps from step 120 on").
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from nemo_ais.analyze.placement import placement_md
from nemo_ais.analyze.reader import format_steps
from nemo_ais.analyze.replay import MODES
from nemo_ais.analyze.trend import Trend, fit_trend
from nemo_ais.modes import MODES as ALL_MODES, masked
from nemo_ais.plotting import pyplot, save_figures, series_style, style_axes

REPORT_FILE = "report.md"
PLOTS = ("diagnostics.png", "alpha.png", "weights.png")
TREND_KEYS = (
    ("ais/severity", "severity D (mean abs log-ratio)"),
    ("ais/token_mult_prob_error", "token_mult_prob_error"),
    ("ais/kl_k3", "KL(mu ‖ pi_old), k3"),
    ("ais/ess_seq", "sequence ESS ratio R"),
    ("ais/alpha", "alpha"),
)
SUMMARY_KEYS = (
    "ais/alpha",
    "ais/severity",
    "ais/token_mult_prob_error",
    "ais/ess_seq",
    "analysis/ess_tok",
    "ais/cv_w",
    "ais/kl_k1",
    "ais/kl_k3",
    "ais/frac_capped",
)
# (keys, title, y label with unit) of the diagnostics.png panels
_DIAG_PANELS = (
    (("ais/severity",), "severity D", "D = mean |log rho| (nats / token)"),
    (("ais/token_mult_prob_error",), "token_mult_prob_error", "mean exp(|log rho|) (1: none)"),
    (("ais/ess_seq", "analysis/ess_tok"), "ESS ratio (sequence, token)", "ESS / samples (0-1)"),
    (("ais/cv_w",), "CV of w = min(rho, C)", "CV (std / mean)"),
    (("ais/kl_k1", "ais/kl_k3"), "KL(mu || pi_old): k1, k3", "KL (nats / token)"),
    (("ais/frac_capped",), "fraction rho > C", "fraction of valid tokens (0-1)"),
)
_MAX_ALARM_ROWS = 50
ALPHA_HIGH, ALPHA_LOW, ESS_LOW, SHARE = 0.5, 0.1, 0.7, 0.8


def _col(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def onset(
    steps: list[int], values: list[float], test, share: float = SHARE, min_steps: int = 3
) -> tuple[int, float, int, int] | None:
    """Earliest step where ``test(v)`` holds, and holds on >= ``share`` of the steps from it on.

    Returns:
        (step, achieved share, steps where it holds, remaining steps), or None if no such step leaves at least
        ``min_steps`` steps.
    """
    hits = [1 if test(v) else 0 for v in values]
    suffix, best = 0, None
    for i in range(len(values) - 1, -1, -1):
        suffix += hits[i]
        remaining = len(values) - i
        if hits[i] and remaining >= min_steps and suffix / remaining >= share:
            best = (steps[i], suffix / remaining, suffix, remaining)
    return best


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _trend_line(label: str, trend: Trend | None) -> str:
    if trend is None:
        return f"| {label} | - | - | too few steps |"
    pct = round(trend.level * 100)
    return f"| {label} | {_fmt(trend.slope)} | [{_fmt(trend.lo)}, {_fmt(trend.hi)}] ({pct}%) | {trend.direction} |"


def recommendations(rows: list[dict[str, Any]], alarms: list[str]) -> list[str]:
    """Data-stated recommendation lines (each a fact from the rows and what it implies)."""
    steps = [int(r["step"]) for r in rows]
    alpha = _col(rows, "ais/alpha")
    out = []
    high = onset(steps, alpha, lambda a: a > ALPHA_HIGH)
    low_share = sum(a < ALPHA_LOW for a in alpha) / len(alpha)
    if high is not None:
        step, share, k, m = high
        out.append(
            f"alpha > {ALPHA_HIGH} on {share:.0%} of steps from step {step} on ({k} of {m}): "
            "the mismatch is large enough that AIS applies mostly the importance-weighted "
            "gradient; run this FP8 configuration with AIS (or TIS), not uncorrected."
        )
    elif low_share >= SHARE:
        out.append(
            f"alpha < {ALPHA_LOW} on {low_share:.0%} of steps: the mismatch stays small; "
            "uncorrected FP8 is close to what AIS would apply."
        )
    else:
        out.append(
            f"alpha is mixed: median {statistics.median(alpha):.2f}, > {ALPHA_HIGH} on "
            f"{sum(a > ALPHA_HIGH for a in alpha) / len(alpha):.0%} of steps, < {ALPHA_LOW} on "
            f"{low_share:.0%}: the correction matters on part of the run; keep AIS on."
        )
    ess = onset(steps, _col(rows, "ais/ess_seq"), lambda r: r < ESS_LOW)
    if ess is not None:
        step, share, k, m = ess
        out.append(
            f"ess_seq < {ESS_LOW} on {share:.0%} of steps from step {step} on ({k} of {m}): the uncorrected rollout's "
            "sequence weights are degenerate there (the AIS paper reports this decay for uncorrected FP8 runs)."
        )
    for mode in (m for m in MODES if ALL_MODES[m].replay.affected is masked):  # they discard
        frac = _col(rows, f"weights/{mode}/frac_capped_or_masked")
        worst = max(range(len(frac)), key=frac.__getitem__)
        out.append(
            f"{mode} would mask a median {statistics.median(frac):.1%} of the valid tokens per "
            f"step (max {frac[worst]:.1%} at step {steps[worst]})"
            + (": a large share of the batch would be discarded." if frac[worst] > 0.2 else ".")
        )
    return out + _alarm_advice(alarms)


def _alarm_advice(alarms: list[str]) -> list[str]:
    if not alarms:
        return []
    return [
        f"{len(alarms)} alarm(s), the first: {alarms[0]}. Check the FP8 refit (weights and KV-cache scales) around "
        "that step."
    ]


def _plot_series(ax, steps: list[int], series: dict[str, list[float]]) -> None:
    for i, (label, values) in enumerate(series.items()):
        ax.plot(steps, values, label=label, **series_style(i, len(steps)))


def build_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The analysis' matplotlib figures by file name (:data:`PLOTS`); the caller saves them.

    Every panel has a y label with its unit, integer step ticks, a legend and a red dashed line at each alarm's step.
    """
    plt = pyplot()
    steps = [int(r["step"]) for r in rows]
    alarm_steps = [int(r["step"]) for r in rows if r.get("alarms")]

    def finish(ax, ylabel: str, title: str) -> None:
        for s in alarm_steps:
            ax.axvline(s, color="tab:red", ls="--", lw=0.8, alpha=0.6)
        style_axes(ax, ylabel=ylabel, title=title)
        ax.legend(fontsize=7)

    figures = {}
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (keys, title, ylabel) in zip(axes.flat, _DIAG_PANELS, strict=True):
        _plot_series(ax, steps, {key: _col(rows, key) for key in keys})
        finish(ax, ylabel, title)
    fig.suptitle("AIS diagnostics per step (red dashes: alarms)")
    fig.tight_layout()
    figures[PLOTS[0]] = fig

    fig, ax = plt.subplots(figsize=(8, 4.5))
    gates = ("ais/alpha", "ais/alpha_raw", "ais/g_sev", "ais/g_rel", "ais/g_var")
    _plot_series(ax, steps, {key: _col(rows, key) for key in gates})
    ax.set_ylim(-0.05, 1.05)
    finish(ax, "alpha and gates (0-1)", "alpha and its gates per step")
    fig.tight_layout()
    figures[PLOTS[1]] = fig

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    _plot_series(axes[0], steps, {m: _col(rows, f"weights/{m}/ess") for m in MODES})
    _plot_series(axes[1], steps, {m: _col(rows, f"weights/{m}/frac_capped_or_masked") for m in MODES})
    finish(axes[0], "ESS / valid tokens (0-1)", "token ESS ratio of each mode's weights")
    finish(axes[1], "fraction of valid tokens (0-1)", "fraction of valid tokens capped or masked")
    fig.tight_layout()
    figures[PLOTS[2]] = fig
    return figures


def _summary_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| metric | first | median | last | min | max |", "|---|---|---|---|---|---|"]
    for key in SUMMARY_KEYS:
        v = _col(rows, key)
        lines.append(
            f"| `{key}` | {_fmt(v[0])} | {_fmt(statistics.median(v))} | {_fmt(v[-1])} | "
            f"{_fmt(min(v))} | {_fmt(max(v))} |"
        )
    return lines


def _modes_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| mode | mean w (median over steps) | max w (max) | capped or masked (median) | ESS ratio (median, last) |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        p = f"weights/{mode}/"
        ess = _col(rows, p + "ess")
        lines.append(
            f"| `{mode}` | {_fmt(statistics.median(_col(rows, p + 'mean')))} | {_fmt(max(_col(rows, p + 'max')))} | "
            f"{statistics.median(_col(rows, p + 'frac_capped_or_masked')):.2%} | {_fmt(statistics.median(ess))}, "
            f"{_fmt(ess[-1])} |"
        )
    return lines


def _warnings(meta: dict[str, Any], steps: list[int]) -> list[str]:
    lines = []
    launches = meta.get("launches") or []
    if len(launches) > 1:
        rolled_back = "; ".join(meta.get("rolled_back") or []) or "none"
        lines.append(
            f"- **A resumed run**: {len(launches)} launches joined ({', '.join(f'`{d}`' for d in launches)}). Each "
            "replaces the steps the launches before it logged from its first step on (rolled back by the resume, not "
            f"analysed: {rolled_back}); the EMA of alpha and the alarm history carry across, as the AIS worker's "
            "checkpoint carries them."
        )
    if gaps := meta.get("missing_steps"):
        lines.append(
            f"- **Missing step files**: {len(gaps)} between steps {steps[0]} and {steps[-1]} "
            f"(steps {format_steps(gaps)}); the {len(steps)} steps present are analysed, "
            "the EMA of alpha and the alarm windows run over them as if consecutive."
        )
    if empty := meta.get("empty_steps"):
        lines.append(
            f"- **Steps skipped** (`--skip-bad-rows`: no row to analyse, or the file cut off mid-row): {len(empty)}, "
            f"first {empty[0]}; the EMA of alpha and the alarm windows run over the others."
        )
    if masked := meta.get("masked_steps"):
        lines.append(
            f"- **Steps whose every sequence was masked** (`sample_loss_mask` or `token_loss_mask` 0 at every row: "
            f"NeMo-RL's `grpo.seq_logprob_error_threshold` drops the sequences whose mismatch exceeds it, which a "
            f"broken refit can make all of them; also overlong filtering): {len(masked)}, first {masked[0]}. Each is "
            "analysed as the loss saw it, an empty global batch (alpha 0, `ais/empty_batch` 1)."
        )
    if bad_readback := meta.get("bad_readback"):
        lines.append(
            f"- **Bad refit readback rows, skipped** (`--skip-bad-rows`): {len(bad_readback)}, first "
            f"`{bad_readback[0]}`; the `refit_readback` check does not run at their steps."
        )
    if meta.get("filtered_sampling"):
        n_filtered = meta.get("filtered_placeholders", 0)
        lines.append(
            "- **Top-k / top-p sampling** (the run config's `policy.generation`): a valid token whose `prev_logprobs` "
            "is 0 while the rollout's is below 0 is NeMo-RL's placeholder for a token the trainer's filtered "
            f"distribution excludes; its loss gives it ratio 1 and no gradient, and the replay leaves it out: "
            f"{n_filtered} such token(s) (`analysis/filtered_placeholders`)."
        )
    batches = meta.get("global_batches_per_step", 1)
    if batches > 1:
        lines.append(
            f"- **The replayed alpha differs from the online one**: the run's config has {batches} global batches per "
            "step (grpo.num_prompts_per_step x grpo.num_generations_per_prompt > policy.train_global_batch_size). "
            "Online, AIS forms alpha (and its EMA update) once per global batch; this replay forms it once per step "
            "file, from the statistics of all its global batches together."
        )
    return lines


def write_report(out_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any], *, plots: bool = True) -> list[Path]:
    """Write ``report.md`` (and the PNG plots) for the analysed rows; return the files.

    Args:
        rows: the ``analysis.jsonl`` rows, ordered by step (at least one).
        meta: ``log_dir``, ``files``, ``rows_read``, ``bad_rows``, ``bad_examples``, ``config`` and ``alarm_config``
            (dicts of the fields not at their default); optionally ``launches`` and ``rolled_back`` (a resumed run),
            ``missing_steps``, ``global_batches_per_step`` and ``tolerance`` (the study levels the run is placed on).
    """
    out_dir = Path(out_dir)
    steps = [int(r["step"]) for r in rows]
    alarms = [a for r in rows for a in r.get("alarms", [])]
    # a step without a usable token (every sequence masked, or every valid log-prob non-finite) has stand-in values
    # (D 0, alpha 0, R 1): no measurement
    measured = [r for r in rows if not float(r.get("ais/empty_batch", 0.0))]
    n_empty = len(rows) - len(measured)
    jumps = {int(r["step"]) for r in rows for a in r.get("alarms", []) if "_jump: " in a}
    fit_rows = [r for r in measured if int(r["step"]) not in jumps]
    written = save_figures(build_figures(rows), out_dir, dpi=100) if plots else []
    md = [
        "# AIS analysis of a NeMo-RL run",
        "",
        f"- Logs: `{meta['log_dir']}` ({len(rows)} steps, {steps[0]}..{steps[-1]}; "
        f"{meta['rows_read']} rows, {sum(int(r['ais/n_tok']) for r in rows)} valid tokens)",
        *_warnings(meta, steps),
        f"- Bad rows skipped: {meta['bad_rows']}"
        + (f" (e.g. `{meta['bad_examples'][0]}`)" if meta["bad_examples"] else ""),
        f"- `loss_fn.ais` (fields not at their default): `{meta['config'] or 'none'}`",
        f"- Alarm thresholds (not at their default): `{meta['alarm_config'] or 'none'}`",
        "- Formulas: docs/metrics.md; the AIS diagnostics and alpha are a [reconstruction] of arXiv 2605.13907 "
        "(docs/method.md). Each step file is one global batch; alpha carries the EMA state from step to step.",
        "",
        "## Trend of the mismatch",
        "",
        "Least-squares slope per step; `grows`/`falls` when the confidence interval excludes 0"
        + (f". Steps with a jump alarm ({', '.join(map(str, sorted(jumps)))}) are left out of the fit" if jumps else "")
        + (
            f". The {n_empty} step(s) without a usable token (every sequence masked, or every valid log-prob "
            "non-finite) are left out of every statistic below"
            if n_empty
            else ""
        )
        + f" ({len(fit_rows)} of {len(rows)} steps fitted).",
        "",
        "| metric | slope / step | CI | trend |",
        "|---|---|---|---|",
    ]
    fit_steps = [int(r["step"]) for r in fit_rows]
    for key, label in TREND_KEYS:
        md.append(_trend_line(f"`{key}` ({label})", fit_trend(fit_steps, _col(fit_rows, key))))
    nothing = ["No step had a usable token: nothing was measured."]
    md += ["", "## Per-step values", "", *(_summary_table(measured) if measured else nothing), "", "## Alarms", ""]
    if alarms:
        md += ["| step | alarm | evidence |", "|---|---|---|"]
        shown = [(r["step"], a) for r in rows for a in r.get("alarms", [])][:_MAX_ALARM_ROWS]
        for step, alarm in shown:
            _, kind, evidence = alarm.split(": ", 2)
            md.append(f"| {step} | {kind} | {evidence} |")
        if len(alarms) > _MAX_ALARM_ROWS:
            md.append(f"\n... {len(alarms)} alarms in all; every one is in analysis.jsonl.")
    else:
        md.append("No alarm fired.")
    md += ["", "## What each correction mode would have applied", ""]
    md += _modes_table(measured) if measured else nothing
    md += ["", *placement_md(measured, meta.get("tolerance"))] if measured else []
    md += ["", "## Recommendation", ""]
    advice = recommendations(measured, alarms) if measured else [*nothing, *_alarm_advice(alarms)]
    md += [f"- {line}" for line in advice]
    if written:
        md += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in written]
    report = out_dir / REPORT_FILE
    report.write_text("\n".join(md) + "\n", encoding="utf-8", errors="backslashreplace")  # a non-UTF-8 path
    return [report, *written]
