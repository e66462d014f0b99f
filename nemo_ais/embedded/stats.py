# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The statistics of an embedded run's ``metrics.jsonl`` (what ``summary.md`` reports).

Records: ``kind: train`` (one per GRPO step: reward, loss, ``ais/*`` diagnostics, applied ``alpha``, timings) and
``kind: val`` (held-out greedy accuracy at step 0, every ``grpo.val_period`` steps and at the end). A run shorter than
:data:`EVIDENCE_MIN_STEPS` steps or with fewer than :data:`EVIDENCE_MIN_SEEDS` seeds is a smoke run.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

# The windows of the non-stationarity table: the first and the last EARLY_LATE_STEPS steps.
EARLY_LATE_STEPS = 10
# Below these, a run is a smoke run: the early and late windows overlap, the collapse step reads one or two
# evaluations, and one seed gives no paired interval.
EVIDENCE_MIN_STEPS = 2 * EARLY_LATE_STEPS
EVIDENCE_MIN_SEEDS = 2


_RECORD_KEYS = ("kind", "arm", "seed", "step")


def load_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` (``path`` may be its run directory).

    A last line cut by a crash (no newline at its end) is skipped; any other line that is not a record (a JSON object
    with ``kind``, ``arm``, ``seed`` and ``step``) is a ``ValueError`` naming ``file:line``, as is a file without one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected a run directory of nemo-ais run")
    text = path.read_text()
    lines = text.splitlines()
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            if lineno == len(lines) and not text.endswith("\n"):
                break  # the write a crash cut short
            raise ValueError(f"{path}:{lineno}: not a JSON record ({err})") from None
        if not isinstance(rec, dict) or (missing := [k for k in _RECORD_KEYS if k not in rec]):
            what = f"lacks {', '.join(missing)}" if isinstance(rec, dict) else "is not an object"
            raise ValueError(f"{path}:{lineno}: expected a record with {', '.join(_RECORD_KEYS)}; it {what}")
        for key in ("seed", "step"):  # the tables sort and pair by them
            if type(rec[key]) is not int:
                raise ValueError(f"{path}:{lineno}: {key}={rec[key]!r}, expected an integer")
        records.append(rec)
    if not records:
        raise ValueError(f"{path} holds no metrics record")
    return records


def series(records, kind: str, key: str) -> dict[str, dict[int, dict[int, float]]]:
    """Values by arm, then seed, then step."""
    out: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("kind") == kind and key in r and r[key] is not None:
            out[r["arm"]][r["seed"]][r["step"]] = float(r[key])
    return out


def band(per_seed: dict[int, dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """The steps every seed has, with the mean and sample std over seeds at each."""
    steps = sorted(set.intersection(*(set(v) for v in per_seed.values())))
    stats = [mean_std([v[s] for v in per_seed.values()]) for s in steps]
    return steps, [m for m, _ in stats], [sd for _, sd in stats]


def mean_std(vals: list[float]) -> tuple[float, float]:
    """Mean and sample std (nan for one value: undefined; both nan for none)."""
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else math.nan)


# two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (standard table values)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """Two-sided 95% t quantile ``t_{0.975, df}``, ``df >= 1``: table up to 30, then Cornish-Fisher (error < 1e-4)."""
    if df < 1:
        raise ValueError(f"df={df} is invalid: expected >= 1 (at least two seeds)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_ci(diffs: list[float]) -> tuple[float, float]:
    """Mean and 95% CI half-width of paired differences (Student t, n - 1 df).

    ``(mean, nan)`` for a single pair, ``(mean, 0.0)`` for equal differences (no spread), ``(nan, nan)`` for none.
    """
    if not diffs:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan
    if max(diffs) - min(diffs) <= 1e-12 * max(1.0, *map(abs, diffs)):  # equal up to rounding: no spread, no interval
        return mean, 0.0
    return mean, t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))


def unfinished_seeds(records: list[dict[str, Any]]) -> dict[str, dict[int, int]]:
    """``{arm: {seed: its last evaluated step}}`` of the seeds that stopped before their arm's last evaluation.

    Every accuracy statistic leaves such a seed out (its second half and final step are not its arm's), and
    ``summary.md`` names it. The arm's last evaluation is :func:`last_evaluations`'s; given ``kind: plan`` records
    (:func:`plan_records`, from the pinned config), an arm cut short on every seed is told apart too.
    """
    return _unfinished(series(records, "val", "accuracy"), records)


def plan_records(planned: dict[str, int]) -> list[dict[str, Any]]:
    """``kind: plan`` records of each arm's planned last step (``grpo.max_num_steps``, always evaluated)."""
    return [{"kind": "plan", "arm": arm, "seed": -1, "step": steps} for arm, steps in planned.items()]


def last_evaluations(records: list[dict[str, Any]]) -> dict[str, int]:
    """Each arm's last evaluation: its planned last step (``kind: plan``), else the last any of its seeds reached."""
    return _last_evaluations(series(records, "val", "accuracy"), records)


def _last_evaluations(val: dict[str, dict[int, dict[int, float]]], records: list[dict[str, Any]]) -> dict[str, int]:
    planned = {r["arm"]: r["step"] for r in records if r.get("kind") == "plan"}
    return {arm: max(planned.get(arm, 0), *(max(by_step) for by_step in seeds.values())) for arm, seeds in val.items()}


def _unfinished(
    val: dict[str, dict[int, dict[int, float]]], records: list[dict[str, Any]]
) -> dict[str, dict[int, int]]:
    """:func:`unfinished_seeds` of the held-out accuracy series ``val``."""
    lasts = _last_evaluations(val, records)
    cuts = {arm: {seed: max(v) for seed, v in seeds.items() if max(v) < lasts[arm]} for arm, seeds in val.items()}
    return {arm: cut for arm, cut in cuts.items() if cut}


def finished_accuracy(records: list[dict[str, Any]]) -> dict[str, dict[int, dict[int, float]]]:
    """Held-out accuracy by arm, seed and step, of the seeds evaluated up to their arm's last evaluation."""
    val = series(records, "val", "accuracy")
    cut = _unfinished(val, records)
    return {arm: {seed: v for seed, v in seeds.items() if seed not in cut.get(arm, {})} for arm, seeds in val.items()}


def primary_metric(records: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The primary metric (declared before any run), per arm and finished seed.

    The mean held-out greedy accuracy over the second half of training: the evaluations at steps ``s >= S / 2``, ``S``
    the arm's last evaluated step (``grpo.val_period = 10``, 60 steps: 30, 40, 50, 60). A seed evaluated last before
    ``S`` is left out (:func:`unfinished_seeds`).
    """
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for arm, seeds in finished_accuracy(records).items():
        for seed, by_step in seeds.items():
            last = max(by_step)
            vals = [v for step, v in by_step.items() if step >= last / 2]
            out[arm][seed] = statistics.fmean(vals)
    return out


def _avg(rows: list[dict[str, Any]], key: str) -> float:
    """Mean of ``key`` over the rows that hold a value (nan: none does)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else math.nan


def _early_late(train: list[dict[str, Any]], key: str, k: int = EARLY_LATE_STEPS) -> tuple[float, float]:
    """Mean of ``key`` over the first ``k`` and the last ``k`` steps (all seeds pooled); nan: under ``2 k`` steps."""
    steps = sorted({r["step"] for r in train})
    if len(steps) < 2 * k:  # the windows would overlap
        return math.nan, math.nan
    windows = (set(steps[:k]), set(steps[-k:]))
    first, last = ([r for r in train if r["step"] in w] for w in windows)
    return _avg(first, key), _avg(last, key)


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
ERROR_TOKEN_KEYS = ("repeat_frac", "invalid_frac", "error_frac")


def arm_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: held-out accuracy of its finished seeds (initial, final, primary metric) and step averages.

    ``unfinished``: ``{seed: last evaluated step}`` of the seeds the accuracy statistics leave out.
    """
    val = finished_accuracy(records)
    primary = primary_metric(records)
    unfinished, lasts = unfinished_seeds(records), last_evaluations(records)
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in records):
        seeds = val.get(arm, {})
        final = [v[max(v)] for v in seeds.values() if v]
        initial = [v[min(v)] for v in seeds.values() if v]
        train = [r for r in records if r.get("kind") == "train" and r["arm"] == arm]
        last_step = max((r["step"] for r in train), default=0)
        tail = [r for r in train if r["step"] > last_step - EARLY_LATE_STEPS]
        avg = functools.partial(_avg, train)
        out[arm] = {
            "seeds": len(final),
            "final_accuracy": mean_std(final),
            "initial_accuracy": mean_std(initial),
            "primary": mean_std(list(primary.get(arm, {}).values())),
            "final_steps": sorted({max(v) for v in seeds.values() if v}),
            "unfinished": unfinished.get(arm, {}),
            "last_evaluation": lasts.get(arm, 0),
            "reward_last10": _avg(tail, "reward"),
            "severity": avg("ais/severity"),
            "ess_seq": avg("ais/ess_seq"),
            "ess_seq_min": min((r["ais/ess_seq"] for r in train if "ais/ess_seq" in r), default=math.nan),
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
            **{k: avg(f"error_tokens/{k}") for k in ERROR_TOKEN_KEYS},
        }
    return out


def early_metric(records: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per arm and finished seed: the held-out accuracy at the first evaluation after step 0."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for arm, seeds in finished_accuracy(records).items():
        for seed, by_step in seeds.items():
            later = [s for s in by_step if s > 0]
            if later:
                out[arm][seed] = by_step[min(later)]
    return out


def paired_differences(
    records: list[dict[str, Any]], reference: str = "bf16", metric=None
) -> dict[str, tuple[int, float, float]]:
    """Per other arm, ``(pairs, mean, 95% CI half-width)`` of its per-seed differences to ``reference``.

    Differences ``arm - reference`` of ``metric(records)`` (default :func:`primary_metric`), over the seeds both ran.
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

    ``step``: on the mean over seeds (None: never); ``per_seed``: each seed paired with the reference's same seed
    (None: never); ``seeds_collapsed`` of ``seeds`` paired seeds.
    """

    step: int | None
    seeds_collapsed: int
    seeds: int
    per_seed: dict[int, int | None]


def _first_below_half(arm: dict[int, float], ref: dict[int, float]) -> int | None:
    """First step s (of both curves) with ``arm[s] < ref[s] / 2``; None if there is none."""
    return next((s for s in sorted(set(arm) & set(ref)) if arm[s] < ref[s] / 2), None)


def collapse_steps(records: list[dict[str, Any]], reference: str = "bf16") -> dict[str, Collapse]:
    """Collapse step of every other arm: held-out accuracy first below half of ``reference``'s.

    Declared before the runs: at evaluation step s an arm collapses iff ``acc_arm(s) < acc_reference(s) / 2``, on the
    mean over the seeds both arms ran and per seed (paired); a reference accuracy of 0 never counts; finished seeds
    only. No shared seed: ``Collapse(None, 0, 0, {})``.
    """
    val = finished_accuracy(records)
    ref = val.get(reference, {})
    out = {}
    for arm, per_seed in val.items():
        if arm == reference:
            continue
        seeds = sorted(set(per_seed) & set(ref))
        paired = {seed: _first_below_half(per_seed[seed], ref[seed]) for seed in seeds}
        mean_step = None
        if seeds:  # the seed-mean curves of both arms over the shared seeds
            arm_mean, ref_mean = (dict(zip(*band({s: v[s] for s in seeds})[:2], strict=True)) for v in (per_seed, ref))
            mean_step = _first_below_half(arm_mean, ref_mean)
        out[arm] = Collapse(
            step=mean_step,
            seeds_collapsed=sum(s is not None for s in paired.values()),
            seeds=len(paired),
            per_seed=paired,
        )
    return out


def run_extent(records: list[dict[str, Any]]) -> tuple[int, int]:
    """``(steps, seeds)``: the last step recorded, and the most seeds any arm ran."""
    recorded = [r for r in records if r.get("kind") != "plan"]
    steps = max((int(r["step"]) for r in recorded if "step" in r), default=0)
    seeds: dict[str, set[int]] = defaultdict(set)
    for r in recorded:
        if "arm" in r and "seed" in r:
            seeds[r["arm"]].add(r["seed"])
    return steps, max((len(v) for v in seeds.values()), default=0)


def smoke_reasons(records: list[dict[str, Any]]) -> list[str]:
    """Why the run is a smoke run, not evidence (empty: it is long enough to be evidence)."""
    steps, seeds = run_extent(records)
    reasons = []
    if steps < EVIDENCE_MIN_STEPS:
        reasons.append(f"{steps} GRPO steps (evidence: >= {EVIDENCE_MIN_STEPS})")
    if seeds < EVIDENCE_MIN_SEEDS:
        reasons.append(f"{seeds} seed (no paired confidence interval; evidence: >= 2)")
    return reasons


def fmt_ci(mean: float, half: float, digits: int = 3) -> str:
    """``mean [lo, hi]`` of a paired 95% interval ("n/a", "one seed: no CI", or "no spread: no CI")."""
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:+.{digits}f} (one seed: no CI)"
    if half == 0:  # every pair differs by the same amount: the t interval is undefined, not zero-width
        return f"{mean:+.{digits}f} (no spread over the pairs: no CI)"
    return f"{mean:+.{digits}f} [{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]"


def fmt_paired(pairs: int, mean: float, half: float, seeds: int) -> str:
    """:func:`fmt_ci` of a paired Δ, saying the pairs it rests on when fewer than ``seeds``.

    ``seeds``: the larger of the arm's and the reference's seed counts (a seed one of them did not finish is left
    out of the pairs, so the Δ is not the difference of the shown means).
    """
    return fmt_ci(mean, half) + (f" over {pairs} paired seed(s)" if 0 < pairs < seeds else "")


def below_zero(mean: float, half: float) -> bool:
    """The paired 95% interval lies below 0 (a real interval: not one pair, not zero spread)."""
    return half > 0 and mean + half < 0


def fmt_num(value: float, spec: str) -> str:
    """``value`` formatted by ``spec``; "—" if it is not finite (no data: a cut-short run)."""
    return format(value, spec) if math.isfinite(value) else "—"
