# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais run --preset dose-quick``: the dose-response study's smoke form, end to end.

The dial scales the rollout's mismatch (step 1: every arm rolls out from the same
warm-started policy), the run writes the tolerance curve (``summary.md`` section,
``tolerance.json``) whose numbers equal an independent computation from ``metrics.jsonl``,
and ``nemo-ais analyze --tolerance`` places one of the run's own logs at its level.
"""

import json
import math
import statistics

import pytest

from nemo_ais.cli import main

pytestmark = pytest.mark.timeout(300)


def test_dose_quick_writes_the_curve_and_analyze_places_a_run(tmp_path, cache_dir):
    argv = ["run", "--preset", "dose-quick", f"logger.run_dir={tmp_path}"]
    argv += [f"policy.warm_start.cache_dir={cache_dir}", "logger.progress_bar=false"]
    assert main(argv) == 0
    run_dir = tmp_path / "dose-quick"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    arms = ["bf16", "k1-none", "k1-ais", "k8-none", "k8-ais"]
    assert sorted({r["arm"] for r in train}) == sorted(arms) and len(train) == 5 * 2 * 3
    first = {(r["arm"], r["seed"]): r["ais/severity"] for r in train if r["step"] == 1}
    for seed in (0, 1):
        assert first[("bf16", seed)] < 1e-5
        assert first[("k8-none", seed)] > 4 * first[("k1-none", seed)] > 0, first
    # the curve, recomputed from metrics.jsonl
    study = json.loads((run_dir / "tolerance.json").read_text())
    assert [lv["k"] for lv in study] == [1.0, 8.0]

    def primary(arm, seed):
        val = {
            r["step"]: r["accuracy"] for r in records if r["kind"] == "val" and r["arm"] == arm and r["seed"] == seed
        }
        return statistics.fmean(v for s, v in val.items() if s >= max(val) / 2)

    for lv in study:
        none = f"k{lv['k']:g}-none"
        d = statistics.fmean(r["ais/severity"] for r in train if r["arm"] == none)
        assert lv["mismatch"]["D"] == pytest.approx(d, rel=1e-12)
        for c in ("none", "ais"):
            diffs = [primary(f"k{lv['k']:g}-{c}", s) - primary("bf16", s) for s in (0, 1)]
            pairs, mean, half = lv["delta"][c]
            assert pairs == 2 and mean == pytest.approx(statistics.fmean(diffs), abs=1e-12)
            # t(0.975, 1) = 12.706
            expected = 12.706 * statistics.stdev(diffs) / math.sqrt(2)
            assert half == pytest.approx(expected, rel=1e-9, abs=1e-12)
    summary = (run_dir / "summary.md").read_text()
    assert "**Smoke run, not evidence:**" in summary and "## Tolerance curve" in summary
    assert (run_dir / "tolerance.png").stat().st_size > 0
    # analyze places the k = 8 run's own log at k = 8 (its D is that level's, nearly)
    out = tmp_path / "analysis"
    log_dir = run_dir / "logs" / "k8-none_seed0"
    tol = str(run_dir / "tolerance.json")
    assert main(["analyze", str(log_dir), "--out", str(out), "--no-plots", "--tolerance", tol]) in (0, 3)
    report = (out / "report.md").read_text()
    assert "## This run on the embedded tolerance curve" in report
    assert "Nearest level of the study: k = 8," in report and "not a prediction" in report
