# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every number ``summary.md`` prints, against statistics computed here independently
(issue 27, item 12).

A hand-made ``metrics.jsonl`` (3 arms x 3 seeds, 5 evaluations, 24 train steps, random
values) is rendered by ``write_report``; each table is parsed back and each cell compared
with the value computed from the records with ``statistics`` / ``scipy.stats`` (means,
sample standard deviations, paired Student-t 95% intervals, Pearson correlations), to half
a unit of the printed last digit. A CI printed as mean ± 2·half, an early column that shows
the primary Δ, or a swapped column fails here.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics

import pytest
from scipy import stats

from nemo_ais.embedded.report import write_report

ARMS, SEEDS, EVALS, TRAIN_STEPS = ("bf16", "fp8", "ais"), (0, 1, 2), (0, 10, 20, 30, 40), 24
NUMBER = r"[+-]?(?:\d+\.\d+(?:e[+-]\d+)?|nan)"


def _records():
    rng = random.Random(27)
    recs = []
    for arm in ARMS:
        for seed in SEEDS:
            for step in range(1, TRAIN_STEPS + 1):
                recs.append(
                    {
                        "kind": "train", "arm": arm, "seed": seed, "step": step,
                        "reward": rng.random(), "alpha": rng.random(),
                        "ais/severity": rng.uniform(1e-3, 5e-2) * (1 + step / 10),
                        "ais/ess_seq": rng.uniform(0.9, 1.0), "ess_tok": rng.uniform(0.9, 1.0),
                        "ais/kl_k3": rng.uniform(1e-5, 1e-3),
                        "ais/token_mult_prob_error": rng.uniform(1.0, 1.1),
                        "entropy": rng.uniform(0.2, 1.5), "response_length": rng.uniform(5, 60),
                        "time/step": rng.uniform(0.1, 2.0),
                        "error_tokens/repeat_frac": rng.random() / 10,
                        "error_tokens/invalid_frac": rng.random() / 10,
                        "error_tokens/error_frac": rng.random() / 5,
                    }
                )  # fmt: skip
            for step in EVALS:
                acc = rng.uniform(0.0, 0.8)
                recs.append({"kind": "val", "arm": arm, "seed": seed, "step": step, "accuracy": acc})
    return recs


def _acc(recs, arm, seed, step):
    (value,) = [
        r["accuracy"] for r in recs if r["kind"] == "val" and (r["arm"], r["seed"], r["step"]) == (arm, seed, step)
    ]
    return value


def _train(recs, arm):
    return [r for r in recs if r["kind"] == "train" and r["arm"] == arm]


def _expected(recs):
    """Every table's numbers per arm, computed here (not by nemo_ais.embedded.report)."""
    out = {}
    for arm in ARMS:
        initial = [_acc(recs, arm, s, EVALS[0]) for s in SEEDS]
        final = [_acc(recs, arm, s, EVALS[-1]) for s in SEEDS]
        primary = [statistics.fmean(_acc(recs, arm, s, e) for e in EVALS if e >= 20) for s in SEEDS]
        early = [_acc(recs, arm, s, EVALS[1]) for s in SEEDS]
        train = _train(recs, arm)
        mean = lambda key, rows=train: statistics.fmean(r[key] for r in rows)  # noqa: E731
        first = [r for r in train if r["step"] <= 10]
        last = [r for r in train if r["step"] > TRAIN_STEPS - 10]
        out[arm] = {
            "initial": (statistics.fmean(initial), statistics.stdev(initial)),
            "final": (statistics.fmean(final), statistics.stdev(final)),
            "primary": (statistics.fmean(primary), statistics.stdev(primary)),
            "early": (statistics.fmean(early), statistics.stdev(early)),
            "primary_by_seed": primary,
            "early_by_seed": early,
            "diag": [
                mean("ais/severity"), mean("ais/ess_seq"), min(r["ais/ess_seq"] for r in train),
                mean("ess_tok"), mean("ais/kl_k3"), mean("ais/token_mult_prob_error"),
                mean("alpha"), mean("reward", last), mean("response_length"), mean("time/step"),
            ],
            "drift": [
                mean("ais/severity", first), mean("ais/severity", last),
                mean("ais/ess_seq", first), mean("ais/ess_seq", last),
                mean("entropy", first), mean("entropy", last),
                _pearson(train, "step", "ais/severity"), _pearson(train, "entropy", "ais/severity"),
            ],
            "errors": [mean(f"error_tokens/{k}") for k in ("repeat_frac", "invalid_frac", "error_frac")],
        }  # fmt: skip
    return out


def _paired(arm_values, ref_values):
    """(mean, lo, hi) of the paired differences' 95% Student-t interval (scipy)."""
    diffs = [a - b for a, b in zip(arm_values, ref_values, strict=True)]
    m = statistics.fmean(diffs)
    lo, hi = stats.t.interval(0.95, len(diffs) - 1, loc=m, scale=stats.sem(diffs))
    return m, lo, hi


def _table_rows(text, header_start):
    """Rows (cells) of the markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return {row[0]: row[1:] for row in rows}


def _numbers(cell):
    return [float(x) for x in re.findall(NUMBER, cell.replace("*", ""))]


def _close(printed, expected, digits=3):
    """Each printed number within half a unit of its last digit (``digits`` decimals)."""
    assert len(printed) == len(expected), (printed, expected)
    for p, e in zip(printed, expected, strict=True):
        assert abs(p - e) <= 0.5 * 10.0**-digits + 1e-12, (printed, expected)


def _pearson(rows, x, y):
    return stats.pearsonr([r[x] for r in rows], [r[y] for r in rows])[0]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    recs = _records()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(run_dir)
    return (run_dir / "summary.md").read_text(), _expected(recs)


def test_primary_table_numbers(rendered):
    text, exp = rendered
    rows = _table_rows(text, "| arm | seeds | initial acc.")
    assert list(rows) == list(ARMS)
    for arm, cells in rows.items():
        assert cells[0] == str(len(SEEDS))
        _close(_numbers(cells[1]), exp[arm]["initial"])
        _close(_numbers(cells[2]), exp[arm]["final"])
        _close(_numbers(cells[3]), exp[arm]["primary"])
        if arm == "bf16":
            assert cells[4] == "—"
            continue
        _close(_numbers(cells[4]), _paired(exp[arm]["primary_by_seed"], exp["bf16"]["primary_by_seed"]))


def test_early_table_numbers_are_the_early_metric_not_the_primary(rendered):
    text, exp = rendered
    rows = _table_rows(text, "| arm | early acc.")
    assert list(rows) == list(ARMS)
    for arm, cells in rows.items():
        _close(_numbers(cells[0]), exp[arm]["early"])
        if arm == "bf16":
            assert cells[1] == "—"
            continue
        early = _paired(exp[arm]["early_by_seed"], exp["bf16"]["early_by_seed"])
        primary = _paired(exp[arm]["primary_by_seed"], exp["bf16"]["primary_by_seed"])
        assert abs(early[0] - primary[0]) > 0.01  # the two columns are distinguishable here
        _close(_numbers(cells[1]), early)


def test_diagnostics_drift_and_error_token_tables(rendered):
    text, exp = rendered
    diag = _table_rows(text, "| arm | severity D | ESS seq (mean / min)")
    drift = _table_rows(text, "| arm | severity D | ESS seq | policy entropy")
    errors = _table_rows(text, "| arm | repeated 3-gram")
    for arm in ARMS:
        printed = [n for cell in diag[arm] for n in _numbers(cell)]
        digits = [None, 4, 4, 4, None, 4, 3, 3, 1, 2]  # None: 3 significant digits (:.2e)
        for p, e, d in zip(printed, exp[arm]["diag"], digits, strict=True):
            if d is None:  # :.2e: three significant digits
                assert p == pytest.approx(e, rel=5e-3)
            else:
                _close([p], [e], d)
        printed = [n for cell in drift[arm] for n in _numbers(cell)]
        digits = [None, None, 4, 4, 4, 4, 2, 2]
        for p, e, d in zip(printed, exp[arm]["drift"], digits, strict=True):
            if d is None:  # :.2e: three significant digits
                assert p == pytest.approx(e, rel=5e-3)
            else:
                _close([p], [e], d)
        _close([n for cell in errors[arm] for n in _numbers(cell)], exp[arm]["errors"], 4)
    assert math.isfinite(exp["fp8"]["drift"][6])
