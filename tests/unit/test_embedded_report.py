# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Report: per-arm summary statistics from a hand-made metrics file, and the plots."""

import json
import statistics

import pytest

from nemo_ais.embedded.report import arm_summary, load_metrics, write_report


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut by a cra')


def _records():
    recs = []
    final = {("a", 0): 0.5, ("a", 1): 0.7, ("b", 0): 0.2, ("b", 1): 0.4}
    for (arm, seed), acc in final.items():
        recs.append({"kind": "val", "arm": arm, "seed": seed, "step": 0, "accuracy": 0.1})
        for step in (1, 2):
            recs.append(
                {
                    "kind": "train",
                    "arm": arm,
                    "seed": seed,
                    "step": step,
                    "reward": 0.25 * step,
                    "accuracy": 0.0,
                    "alpha": 0.5,
                    "ais/severity": 0.01,
                    "ais/ess_seq": 0.99,
                    "ais/cv_w": 0.1,
                    "ais/token_mult_prob_error": 1.01,
                    "time/step": 0.5,
                }
            )
        recs.append({"kind": "val", "arm": arm, "seed": seed, "step": 2, "accuracy": acc})
    return recs


def test_summary_is_mean_and_sample_std_over_seeds(tmp_path):
    _write(tmp_path / "metrics.jsonl", _records())
    recs = load_metrics(tmp_path)  # the truncated last line is skipped
    assert len(recs) == 16
    s = arm_summary(recs)
    assert s["a"]["final_accuracy"] == pytest.approx((0.6, statistics.stdev([0.5, 0.7])))
    assert s["b"]["final_accuracy"] == pytest.approx((0.3, 0.1414213562373095))
    assert s["a"]["initial_accuracy"] == pytest.approx((0.1, 0.0))
    assert s["a"]["reward_last10"] == pytest.approx(0.375)  # mean of 0.25, 0.5 over 2 seeds
    files = write_report(tmp_path)
    assert {f.name for f in files} == {
        "reward.png",
        "accuracy.png",
        "diagnostics.png",
        "summary.md",
    }
    text = (tmp_path / "summary.md").read_text()
    assert "| a | 2 | 0.100 ± 0.000 | **0.600 ± 0.141** |" in text


def test_empty_metrics_file_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no metrics record"):
        load_metrics(tmp_path)
