# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Plots and ``summary.md`` of an embedded run (``nemo-ais report RUN_DIR``), from its ``metrics.jsonl`` alone.

A smoke run's summary opens by saying why it is not evidence and leaves out the tables the run is too short for.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nemo_ais.embedded.plots import DIAGNOSTICS as DIAGNOSTICS, PLOTS as PLOTS, build_figures
from nemo_ais.embedded.stats import (
    EARLY_LATE_STEPS,
    ERROR_TOKEN_KEYS,
    EVIDENCE_MIN_STEPS,
    Collapse,
    arm_summary,
    collapse_steps,
    early_metric,
    fmt_num as _num,
    fmt_paired,
    load_metrics,
    mean_std,
    paired_ci as paired_ci,
    paired_differences,
    plan_records,
    primary_metric as primary_metric,
    run_extent,
    smoke_reasons,
    t_quantile_975 as t_quantile_975,
)
from nemo_ais.embedded.tolerance import tolerance_md, tolerance_table, write_tolerance
from nemo_ais.plotting import save_figures


def _pm(mean: float, std: float, spec: str = ".3f") -> str:
    """``mean ± std`` by ``spec``; one "—" when the mean has no data."""
    return f"{_num(mean, spec)} ± {_num(std, spec)}" if math.isfinite(mean) else "—"


def _collapse_cells(collapse: dict[str, Collapse], arm: str, reference: str) -> str:
    """The collapse table's cells of ``arm``: "—" for the reference itself."""
    if arm == reference:
        return "— | — | —"
    c = collapse.get(arm)
    if c is None or not c.seeds:  # no seed shared with the reference
        return "n/a | n/a | n/a"
    steps = ", ".join(f"{seed}: {'none' if s is None else s}" for seed, s in c.per_seed.items())
    first = "none" if c.step is None else str(c.step)
    return f"{first} | {c.seeds_collapsed} / {c.seeds} | {steps or 'n/a'}"


def _delta_cell(diffs: dict[str, tuple[int, float, float]], arm: str, reference: str, seeds: tuple[int, int]) -> str:
    """The "Δ vs reference" cell of ``arm`` ("—" for the reference); ``seeds``: the arm's and the reference's."""
    if arm == reference:
        return "—"
    return fmt_paired(*diffs.get(arm, (0, math.nan, math.nan)), max(seeds))


def _fmt_corr(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def _summary_md(
    run_dir: Path, records: list[dict[str, Any]], reference: str = "bf16", not_started: Sequence[str] = ()
) -> str:
    summ = arm_summary(records)
    diffs = paired_differences(records, reference)
    seed_counts = {s["seeds"] for s in summ.values()}
    over = f"{next(iter(seed_counts))} seed(s)" if len(seed_counts) == 1 else "each arm's seeds (its seeds column)"
    n_steps = run_extent(records)[0]
    smoke = smoke_reasons(records)
    lines = [f"# Summary of `{run_dir}`", ""]
    if smoke:
        lines += [
            f"**Smoke run, not evidence:** {'; '.join(smoke)}. It checks that the pipeline runs end to end; "
            "differences between its arms are noise. Evidence: `nemo-ais run --preset evidence` (FP8) or `--preset "
            "fp4-evidence` (NVFP4), 60 steps x 8 seeds (docs/results.md).",
            "",
        ]
    lines += _caveats_md(summ, reference, not_started)
    lines += [
        "Computed from `metrics.jsonl` by `nemo_ais.embedded.report` (nothing edited by hand).",
        "",
        "**Primary metric (declared before the runs):** per arm and seed, the mean held-out greedy exact-match "
        "accuracy over the evaluations in the second half of training (steps >= last/2). **Comparison:** per-seed "
        f"paired difference to `{reference}`, mean and 95% confidence interval (Student t, seeds - 1 degrees of "
        f"freedom), one per arm, not adjusted for the {_count(max(len(summ) - 1, 0), 'comparison')} of the table: read an "
        "interval that only just excludes 0 as a hint, not a finding. **Collapse step:** per arm, the first evaluation "
        f"step at which its held-out accuracy falls below half of `{reference}`'s at the same step, on the mean over "
        f"seeds and per seed (paired with the same seed of `{reference}`); none if it never does.",
        "",
        f"| arm | seeds | initial acc. | final acc. | primary metric | Δ vs {reference} (paired, 95% CI) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        initial, final, primary = (_pm(*s[k]) for k in ("initial_accuracy", "final_accuracy", "primary"))
        delta = _delta_cell(diffs, arm, reference, (s["seeds"], summ.get(reference, {}).get("seeds", 0)))
        lines.append(f"| {arm} | {s['seeds']} | {initial} | {final} | **{primary}** | {delta} |")
    early = early_metric(records)
    early_diffs = paired_differences(records, reference, early_metric)
    lines += [
        "",
        f"(mean ± sample std over {over}.)",
        "",
        "Secondary: held-out accuracy at the first evaluation after step 0 (how fast an "
        f"arm learns), and its paired difference to `{reference}`:",
        "",
        f"| arm | early acc. | Δ vs {reference} (paired, 95% CI) |",
        "|---|---|---|",
    ]
    for arm in summ:
        em, es = mean_std(list(early.get(arm, {}).values()))
        delta = _delta_cell(early_diffs, arm, reference, (len(early.get(arm, {})), len(early.get(reference, {}))))
        lines.append(f"| {arm} | {_pm(em, es)} | {delta} |")
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
            f"| {arm} | {_num(s['severity'], '.2e')} | {_num(s['ess_seq'], '.4f')} / {_num(s['ess_seq_min'], '.4f')} | "
            f"{_num(s['ess_tok'], '.4f')} | {_num(s['kl_k3'], '.2e')} | {_num(s['token_mult_prob_error'], '.4f')} | "
            f"{_num(s['alpha'], '.3f')} | {_num(s['reward_last10'], '.3f')} | {_num(s['response_length'], '.1f')} | "
            f"{_num(s['step_time'], '.2f')} |"
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
    lines += [f"| {arm} | " + " | ".join(_num(s[k], ".4f") for k in ERROR_TOKEN_KEYS) + " |" for arm, s in summ.items()]
    lines += [
        "",
        "Plots: `reward.png`, `accuracy.png`, `diagnostics.png` (against the GRPO step), `mismatch_vs_entropy.png` "
        "(severity D against the policy entropy); bands: ± 1 std over seeds, clipped to each metric's range.",
    ]
    return "\n".join(lines) + "\n"


def _caveats_md(summ, reference: str, not_started: Sequence[str] = ()) -> list[str]:
    """Lines naming what the tables leave out: arms not started, unfinished seeds, a reference arm without evaluations."""
    lines = []
    if not_started:
        lines += [
            f"**Arms of the pinned config not started yet, absent from every table:** {', '.join(not_started)}; "
            "re-running the same command runs them (it resumes).",
            "",
        ]
    cut = [
        f"{arm} seed {seed} (last evaluation at step {step} of {s['last_evaluation']})"
        for arm, s in summ.items()
        for seed, step in s["unfinished"].items()
    ]
    if cut:
        lines += [
            f"**Unfinished seeds, left out of every accuracy statistic:** {', '.join(cut)}; re-running the same "
            "command finishes them (it resumes).",
            "",
        ]
    if reference not in summ or not summ[reference]["seeds"]:
        lines += [
            f"**No finished `{reference}` arm** (`experiment.reference_arm`): every Δ and collapse cell is n/a.",
            "",
        ]
    return lines


def _collapse_md(records, summ, reference: str, n_steps: int) -> list[str]:
    """The collapse table, or (a run shorter than EVIDENCE_MIN_STEPS) why it is left out."""
    if n_steps < EVIDENCE_MIN_STEPS:
        return [
            "",
            f"Collapse step: left out. A {n_steps}-step run has too few evaluations for a first drop below ½ × "
            f"`{reference}`'s accuracy to mean a collapse (computed for runs of >= {EVIDENCE_MIN_STEPS} steps).",
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
        f"Non-stationarity: first {k} steps → last {k} steps (all seeds pooled), and the Pearson correlation of D with "
        "the step and with the policy entropy over every (step, seed) (n/a: undefined, D or the entropy constant or "
        f"fewer than 3 points; —: no value, or an arm with fewer than {2 * k} steps):",
        "",
        "| arm | severity D | ESS seq | policy entropy (nats/token) | corr(D, step) | corr(D, entropy) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summ.items():
        windows = ("severity", "ess_seq", "entropy")
        (d0, d1), (e0, e1), (h0, h1) = (s[f"{m}_early_late"] for m in windows)
        lines.append(
            f"| {arm} | {_num(d0, '.2e')} → {_num(d1, '.2e')} | {_num(e0, '.4f')} → {_num(e1, '.4f')} | "
            f"{_num(h0, '.4f')} → {_num(h1, '.4f')} | "
            f"{_fmt_corr(s['corr_d_step'])} | {_fmt_corr(s['corr_d_entropy'])} |"
        )
    return lines


def write_report(run_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """(Re)draw ``summary.md`` and, unless ``plots=False`` (``logger.plots: false``), the PNGs; the files written.

    Raises:
        ValueError: the run's ``config.yaml`` cannot be read or is not a mapping (named, one line).
    """
    records = load_metrics(Path(run_dir))
    run_dir = Path(run_dir).parent if Path(run_dir).is_file() else Path(run_dir)
    cfg_file = run_dir / "config.yaml"  # the run's pinned config, read once
    try:
        pinned = (yaml.safe_load(cfg_file.read_text()) or {}) if cfg_file.is_file() else {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(
            f"{cfg_file}: cannot be read ({' '.join(str(err).split())}); the run's pinned config names its reference arm"
        ) from None
    if not isinstance(pinned, dict):
        raise ValueError(
            f"{cfg_file}: got a YAML {type(pinned).__name__}, expected the run's pinned config (a mapping)"
        )
    written = save_figures(build_figures(records), run_dir, dpi=110) if plots else []  # the config read first
    planned, not_started = _pinned_plan(pinned, {r["arm"] for r in records})
    records = records + plan_records(planned)
    reference = str((pinned.get("experiment") or {}).get("reference_arm") or "bf16")  # experiment.reference_arm
    levels = tolerance_table(records, reference)
    summary = _summary_md(run_dir, records, reference, not_started)
    if levels:  # a dose-response run: the tolerance curve (nemo_ais.embedded.tolerance)
        summary += "\n" + tolerance_md(levels, reference)
    (run_dir / "summary.md").write_text(summary)
    written.append(run_dir / "summary.md")
    return written + write_tolerance(run_dir, records, reference, plots=plots)


def _pinned_plan(pinned: dict[str, Any], recorded: set[str]) -> tuple[dict[str, int], list[str]]:
    """The run's plan from its pinned ``config.yaml`` (``({}, [])``: no pinned config readable).

    Returns:
        Each recorded arm's ``grpo.max_num_steps``, and the arms the config runs that have no record yet, in its order.
    """
    from nemo_ais.embedded.config import migrate_config, resolve_arm

    planned: dict[str, int] = {}
    if "max_num_steps" not in (pinned.get("grpo") or {}):  # not a pinned config (written whole): no plan
        return planned, []
    try:
        raw = migrate_config(pinned, warn=False)
        named = (raw.get("experiment") or {}).get("arms") or {}
        for arm in recorded & set(named):  # an arm the config does not name (a foreign run): the records' own extent
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                planned[arm] = resolve_arm(raw, arm).grpo.max_num_steps
        runs = resolve_arm(raw, None).experiment.arm_names
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return planned, []
    return planned, [arm for arm in runs if arm not in recorded]


def _count(n: int, noun: str) -> str:
    """``"1 comparison"``, ``"3 comparisons"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
