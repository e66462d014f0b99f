# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The tolerance curve of a dose-response run and its placement of an analysed run.

An independent oracle (scipy's Student t, numpy means) for the paired Δ and its interval,
the x-axes taken from the uncorrected arm only, the smallest significant level, the
``summary.md`` section's rendered numbers, and ``nemo-ais analyze``'s placement section.
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
from scipy import stats

from nemo_ais.analyze.placement import load_study, placement_md
from nemo_ais.analyze.reader import BadInputError
from nemo_ais.embedded.report import write_report
from nemo_ais.embedded.tolerance import first_significant_level, tolerance_md, tolerance_table

SEEDS = range(6)
LEVELS = {1.0: 0.0, 4.0: -0.05, 16.0: -0.3}  # true effect of the uncorrected arm
AIS_GAIN = {1.0: 0.0, 4.0: 0.05, 16.0: 0.1}  # restores BF16 at k = 4, not at 16


def _accuracy(arm: str, seed: int, step: int) -> float:
    rng = np.random.default_rng(zlib.crc32(f"{arm}/{seed}/{step}".encode()))
    base = 0.4 + 0.02 * seed + 0.001 * step + float(rng.normal(0, 0.01))
    if arm == "bf16":
        return base
    k = float(arm.split("-")[0][1:])
    return base + LEVELS[k] + (AIS_GAIN[k] if arm.endswith("ais") else 0.0)


def _records() -> list[dict]:
    arms = ["bf16"] + [f"k{k:g}-{c}" for k in LEVELS for c in ("none", "ais")]
    out = []
    for arm in arms:
        k = 0.0 if arm == "bf16" else float(arm.split("-")[0][1:])
        for seed in SEEDS:
            for step in (0, 10, 20, 30, 40):
                out.append(dict(kind="val", arm=arm, seed=seed, step=step, accuracy=_accuracy(arm, seed, step)))
            for step in range(1, 41):
                sev = 0.01 * k * (1 + 0.1 * seed) + (0.001 if arm.endswith("ais") else 0.0)
                out.append(
                    {
                        "kind": "train",
                        "arm": arm,
                        "seed": seed,
                        "step": step,
                        "reward": 0.5,
                        "ais/severity": sev,
                        "ais/kl_k3": sev**2 / 2,
                        "ais/token_mult_prob_error": 1 + sev,
                    }
                )
    return out


def _oracle(records, arm):
    def primary(a, s):
        vals = [r["accuracy"] for r in records if r["kind"] == "val" and r["arm"] == a and r["seed"] == s]
        steps = [r["step"] for r in records if r["kind"] == "val" and r["arm"] == a and r["seed"] == s]
        return np.mean([v for v, st in zip(vals, steps, strict=True) if st >= max(steps) / 2])

    d = np.array([primary(arm, s) - primary("bf16", s) for s in SEEDS])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean(), half


def test_table_matches_an_independent_oracle():
    records = _records()
    levels = tolerance_table(records)
    assert [lv.k for lv in levels] == [1.0, 4.0, 16.0]
    for lv in levels:
        # the x-axes come from the uncorrected arm only (the ais arm's severity is offset)
        d = np.mean([0.01 * lv.k * (1 + 0.1 * s) for s in SEEDS])
        assert lv.mismatch["D"] == pytest.approx(d, rel=1e-12)
        assert lv.mismatch["gen_kl"] == pytest.approx(
            np.mean([(0.01 * lv.k * (1 + 0.1 * s)) ** 2 / 2 for s in SEEDS]), rel=1e-12
        )
        assert lv.mismatch["tmpe"] == pytest.approx(1 + d, rel=1e-12)
        for c in ("none", "ais"):
            pairs, mean, half = lv.delta[c]
            o_mean, o_half = _oracle(records, f"k{lv.k:g}-{c}")
            assert pairs == 6 and mean == pytest.approx(o_mean, abs=1e-12)
            assert half == pytest.approx(o_half, rel=2e-3)  # the t table has 3 decimals
    assert first_significant_level(levels, "none") == 4.0
    assert first_significant_level(levels, "ais") == 16.0


def test_summary_section_renders_the_numbers(tmp_path):
    records = _records()
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    written = write_report(tmp_path)
    assert {p.name for p in written} >= {"summary.md", "tolerance.json", "tolerance.png"}
    summary = (tmp_path / "summary.md").read_text()
    section = summary[summary.index("## Tolerance curve") :]
    levels = tolerance_table(records)
    for lv in levels:
        _, mean, half = lv.delta["none"]
        row = next(line for line in section.splitlines() if line.startswith(f"| {lv.k:g} |"))
        assert f"{lv.mismatch['D']:.4f}" in row
        assert f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]" in row
        cell = f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]" + (" *" if mean + half < 0 else "")
        assert f"| {cell} |" in row
    assert "| none | 4 |" in section and "| ais | 16 |" in section
    assert tolerance_md([]) == ""
    study = json.loads((tmp_path / "tolerance.json").read_text())
    assert [lv["k"] for lv in study] == [1.0, 4.0, 16.0]


def test_plots_off_writes_the_tolerance_table_but_no_png(tmp_path):
    records = _records()
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    written = write_report(tmp_path, plots=False)  # logger.plots: false
    assert {p.name for p in written} == {"summary.md", "tolerance.json"}
    assert not list(tmp_path.glob("*.png"))


def test_a_run_without_levels_gets_no_tolerance_section(tmp_path):
    records = [r for r in _records() if not r["arm"].startswith("k")]
    records += [dict(r, arm="fp8-none") for r in records]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    written = write_report(tmp_path)
    assert "Tolerance curve" not in (tmp_path / "summary.md").read_text()
    assert not any(p.name.startswith("tolerance") for p in written)


def test_placement_names_the_nearest_level(tmp_path):
    records = _records()
    study_file = tmp_path / "tolerance.json"
    study_file.write_text(json.dumps([lv._asdict() for lv in tolerance_table(records)]))
    study = load_study(study_file)
    rows = [{"ais/severity": 0.05, "ais/kl_k3": 1e-3, "ais/token_mult_prob_error": 1.05}] * 3
    md = "\n".join(placement_md(rows, study))
    # D = 0.05 is nearest (log scale) to k = 4 (D = 0.05 x 1.25)
    assert "This run's mismatch, mean over its steps: D = 0.05, gen_kl = 0.001, tmpe = 1.05." in md
    assert "k = 4, where the uncorrected arm measured D = 0.05" in md
    low = "\n".join(placement_md([{"ais/severity": 0.04}], study))  # still nearest to k = 4
    assert "k = 4, where the uncorrected arm measured D = 0.05 (1.2x this run's)" in low
    none = study[1]["delta"]["none"]
    assert f"| none | {none[1]:+.3f} [{none[1] - none[2]:+.3f}, {none[1] + none[2]:+.3f}] |" in md
    assert "not a prediction" in md and "extrapolation" not in md
    far = "\n".join(placement_md([{"ais/severity": 5.0}], study))
    assert "k = 16" in far and "outside the study's range" in far
    assert "No dose-response study is recorded" in "\n".join(placement_md(rows, None))


@pytest.mark.parametrize("content", ["not json", "[]", '[{"k": 1}]', '{"a": 1}'])
def test_a_bad_study_file_is_named(tmp_path, content):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(BadInputError, match=r"t\.json:0: "):
        load_study(path)
    with pytest.raises(BadInputError, match=r"missing\.json:0: cannot read"):
        load_study(tmp_path / "missing.json")


def test_the_shipped_study_is_the_default_and_a_dose_run():
    """``nemo_ais/analyze/tolerance_study.json``: the recorded dose run (docs/results.md)."""
    from nemo_ais.analyze.placement import STUDY

    assert STUDY.is_file(), "the recorded study ships with the package"
    levels = load_study(None)
    assert levels == json.loads(STUDY.read_text())
    assert [lv["k"] for lv in levels] == [1.0, 4.0, 8.0]  # dose.yaml's levels
    d = [lv["mismatch"]["D"] for lv in levels]
    assert d == sorted(d) and d[0] > 0  # the dial raises the uncorrected arm's mismatch
    for lv in levels:
        assert set(lv["delta"]) == {"none", "tis", "ais", "const", "qarl"}
        assert all(pairs == 6 for pairs, _, _ in lv["delta"].values())  # 6 paired seeds


def test_zero_spread_and_unpaired_seeds_are_said_in_the_cell_and_never_starred():
    from nemo_ais.embedded.stats import below_zero, fmt_ci, paired_ci
    from nemo_ais.embedded.tolerance import Level

    mean, half = paired_ci([-1 / 64, -1 / 64])  # identical pairs: t = -inf, no interval
    assert (mean, half) == (-1 / 64, 0.0) and not below_zero(mean, half)
    # equal up to rounding (a mean over 3 evaluations, each 4 / 256 below): the same, not a starred [x, x]
    seeds = ([0.03515625, 0.08203125, 0.078125], [0.41015625, 0.515625, 0.62890625])
    rounded = [np.mean([v - 4 / 256 for v in b]) - np.mean(b) for b in seeds]
    assert rounded[0] != rounded[1] and paired_ci(rounded)[1] == 0.0
    from nemo_ais.analyze.placement import _ci  # analyze's copy of a tolerance.json cell reads it the same way

    assert _ci([2, mean, half]) == "-0.016 (no spread over the pairs: no CI)"
    assert fmt_ci(mean, half) == "-0.016 (no spread over the pairs: no CI)"
    nan = {"D": math.nan, "gen_kl": math.nan, "tmpe": math.nan}  # no uncorrected arm at this level
    levels = [
        Level(1.0, nan, {"tis": (2, mean, half), "ais": (2, -0.3, 0.1)}, {"tis": 2, "ais": 3}),
        Level(4.0, nan, {"tis": (3, -0.2, 0.1), "ais": (3, -0.2, 0.3)}, {"tis": 3, "ais": 3}),
    ]
    md = tolerance_md(levels)
    assert (
        "| 1 | — | — | — | -0.300 [-0.400, -0.200] over 2 paired seed(s) * | -0.016 (no spread over the pairs: no CI) |"
        in md
    )
    assert "nan" not in md and "not adjusted for the 4 cells of the table" in md
    assert first_significant_level(levels, "tis") == 4.0 and first_significant_level(levels, "ais") == 1.0
