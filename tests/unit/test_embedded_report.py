# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Report: per-arm summary statistics from a hand-made metrics file, and the plots."""

import json
import math
import statistics

import pytest
import yaml
from plot_checks import assert_publishable
from scipy import stats

from nemo_ais.embedded.report import (
    arm_summary,
    early_metric,
    load_metrics,
    paired_ci,
    paired_differences,
    primary_metric,
    t_quantile_975,
    write_report,
)


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
        "mismatch_vs_entropy.png",
        "summary.md",
    }
    text = (tmp_path / "summary.md").read_text()
    # initial, final, primary metric (evals at steps >= 2/2: step 2 only), no bf16 arm
    assert "| a | 2 | 0.100 ± 0.000 | 0.600 ± 0.141 | **0.600 ± 0.141** | n/a |" in text


def test_empty_metrics_file_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no metrics record"):
        load_metrics(tmp_path)


@pytest.mark.parametrize("df", [*range(1, 41), 60, 120, 1000])
def test_t_quantile_matches_scipy(df):
    # the table holds 3 decimals; the expansion beyond df = 30 is closer than 1e-4
    tol = 5e-4 if df <= 30 else 1e-4
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=tol)
    with pytest.raises(ValueError, match="df=0"):
        t_quantile_975(0)


def test_paired_ci_against_scipy_float64():
    diffs = [0.12, -0.03, 0.07, 0.2, 0.01, 0.05, -0.02, 0.09]
    mean, half = paired_ci(diffs)
    lo, hi = stats.t.interval(
        0.95, len(diffs) - 1, loc=statistics.fmean(diffs), scale=stats.sem(diffs)
    )
    assert mean == pytest.approx(statistics.fmean(diffs), abs=1e-15)
    assert (mean - half, mean + half) == pytest.approx((lo, hi), abs=5e-4 * stats.sem(diffs))
    one = paired_ci([0.3])
    assert one[0] == 0.3 and math.isnan(one[1])
    assert all(math.isnan(v) for v in paired_ci([]))


def _val(arm, seed, step, acc):
    return {"kind": "val", "arm": arm, "seed": seed, "step": step, "accuracy": acc}


def test_primary_metric_is_the_second_half_mean_and_pairs_by_seed(tmp_path):
    recs = []
    accs = {  # step -> accuracy, evaluated at 0, 10, 20, 30, 40
        ("bf16", 0): [0.1, 0.2, 0.4, 0.5, 0.6],
        ("bf16", 1): [0.1, 0.3, 0.3, 0.4, 0.5],
        ("fp8", 0): [0.1, 0.2, 0.3, 0.3, 0.3],
        ("fp8", 1): [0.1, 0.1, 0.2, 0.4, 0.2],
        ("fp8", 2): [0.1, 0.1, 0.2, 0.4, 0.9],  # no bf16 partner: not paired
    }
    for (arm, seed), row in accs.items():
        recs += [_val(arm, seed, 10 * i, a) for i, a in enumerate(row)]
    prim = primary_metric(recs)  # steps >= 40 / 2: 20, 30, 40
    assert prim["bf16"][0] == pytest.approx(0.5) and prim["bf16"][1] == pytest.approx(0.4)
    assert prim["fp8"][0] == pytest.approx(0.3) and prim["fp8"][1] == pytest.approx(0.8 / 3)
    early = early_metric(recs)  # the first evaluation after step 0: step 10
    assert early["bf16"] == {0: 0.2, 1: 0.3} and early["fp8"] == {0: 0.2, 1: 0.1, 2: 0.1}
    n_e, mean_e, _ = paired_differences(recs, "bf16", early_metric)["fp8"]
    assert n_e == 2 and mean_e == pytest.approx((0.0 - 0.2) / 2)
    n, mean, half = paired_differences(recs, "bf16")["fp8"]
    diffs = [0.3 - 0.5, 0.8 / 3 - 0.4]
    assert n == 2 and mean == pytest.approx(statistics.fmean(diffs))
    assert half == pytest.approx(12.706 * statistics.stdev(diffs) / math.sqrt(2))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"experiment": {"reference_arm": "fp8"}}))
    write_report(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "Δ vs fp8" in text and "| fp8 | 3 |" in text and "| bf16 | 2 |" in text


def test_mismatch_correlations_with_step_and_entropy():
    recs = [
        {
            "kind": "train",
            "arm": "fp8",
            "seed": seed,
            "step": step,
            "ais/severity": 0.001 * step + 0.0001 * seed,
            "entropy": 0.1 - 0.001 * step,
        }
        for seed in (0, 1)
        for step in range(1, 21)
    ]
    s = arm_summary(recs)["fp8"]
    xs = [r["step"] for r in recs]
    ys = [r["ais/severity"] for r in recs]
    assert s["corr_d_step"] == pytest.approx(statistics.correlation(xs, ys))
    assert s["corr_d_step"] > 0.99 and s["corr_d_entropy"] < -0.99
    d0, d1 = s["severity_early_late"]  # steps 1-10 and 11-20, both seeds pooled
    assert d0 == pytest.approx(0.001 * 5.5 + 0.00005) and d1 == pytest.approx(
        0.001 * 15.5 + 0.00005
    )
    # a constant series has no correlation: nan, not an error
    assert math.isnan(arm_summary(_records())["a"]["corr_d_step"])


def _twin_arms_two_steps():
    """Two arms with identical values, 3 seeds, 2 steps; severity's mean - std < 0."""
    recs = []
    for arm in ("fp8-none", "fp8-tis"):
        for seed, sev in enumerate((0.0, 0.01, 0.0)):
            for step in (1, 2):
                recs.append(
                    {
                        "kind": "train",
                        "arm": arm,
                        "seed": seed,
                        "step": step,
                        "reward": (0.0, 0.5, 0.0)[seed],
                        "alpha": 0.0,
                        "ais/severity": sev,
                        "ais/ess_seq": 0.99,
                        "ess_tok": 0.98,
                        "ais/cv_w": (0.0, 0.2, 0.0)[seed],
                        "ais/kl_k3": sev / 10,
                        "entropy": 1.0 + 0.01 * seed,
                        "ais/token_mult_prob_error": 1.0 + sev,
                    }
                )
            recs += [_val(arm, seed, s, (0.0, 0.3, 0.0)[seed]) for s in (0, 2)]
    return recs


def test_figures_are_publishable_and_identical_arms_stay_visible():
    from nemo_ais.embedded.report import DIAGNOSTICS, PLOTS, build_figures

    figures = build_figures(_twin_arms_two_steps())
    assert set(figures) == {*PLOTS, "diagnostics.png", "mismatch_vs_entropy.png"}
    for fig in figures.values():
        assert_publishable(fig, {"fp8-none", "fp8-tis"})
    # seed bands (mean +- sample std) of metrics bounded below stay inside the bound
    panels = [*PLOTS.values(), *DIAGNOSTICS]
    axes = [figures["reward.png"].axes[0], figures["accuracy.png"].axes[0]]
    axes += list(figures["diagnostics.png"].axes)
    for panel, ax in zip(panels, axes, strict=True):
        assert ax.collections, panel.key
        for band in ax.collections:
            ys = band.get_paths()[0].vertices[:, 1]
            assert ys.min() >= panel.lo, (panel.key, ys.min())
            assert panel.hi is None or ys.max() <= panel.hi, (panel.key, ys.max())
    # the two arms' lines coincide; their markers differ, so both show
    ax = figures["diagnostics.png"].axes[0]
    lines = [x for x in ax.get_lines() if not x.get_label().startswith("_")]
    assert list(lines[0].get_ydata()) == list(lines[1].get_ydata())
    assert lines[0].get_marker() != lines[1].get_marker()
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def test_collapse_step_is_first_eval_below_half_of_reference(tmp_path):
    from nemo_ais.embedded.report import Collapse, collapse_steps

    accs = {  # evaluated at steps 0, 10, 20, 30, 40; bf16 holds 0.4 (half: 0.2), then 0
        ("bf16", 0): [0.4, 0.4, 0.4, 0.4, 0.0],
        ("bf16", 1): [0.4, 0.4, 0.4, 0.4, 0.0],
        ("bf16", 2): [0.4, 0.4, 0.4, 0.4, 0.0],
        # per seed: 0.1 < 0.2 at step 20 (seed 0) and at step 10 (seed 1); seed 2 never;
        # seed mean 0.400, 0.267, 0.233, 0.133 -> first below 0.2 at step 30
        ("fp4-none", 0): [0.4, 0.3, 0.1, 0.0, 0.0],
        ("fp4-none", 1): [0.4, 0.1, 0.3, 0.1, 0.0],
        ("fp4-none", 2): [0.4, 0.4, 0.3, 0.3, 0.0],
        ("fp4-none", 3): [0.0, 0.0, 0.0, 0.0, 0.0],  # no bf16 partner: not counted
        # exactly half is not below half; at step 40 bf16 is 0 and nothing is below 0
        ("fp4-ais", 0): [0.4, 0.3, 0.2, 0.2, 0.0],
        ("fp4-ais", 1): [0.4, 0.3, 0.2, 0.2, 0.0],
        ("fp4-ais", 2): [0.4, 0.3, 0.2, 0.2, 0.0],
    }
    recs = [
        _val(arm, seed, 10 * i, a) for (arm, seed), row in accs.items() for i, a in enumerate(row)
    ]
    got = collapse_steps(recs, "bf16")
    assert set(got) == {"fp4-none", "fp4-ais"}
    assert got["fp4-none"] == Collapse(30, 2, 3, {0: 20, 1: 10, 2: None})
    assert got["fp4-ais"] == Collapse(None, 0, 3, {0: None, 1: None, 2: None})
    assert collapse_steps(recs, "nope")["fp4-none"] == Collapse(None, 0, 0, {})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "**Collapse step:**" in text and "below half of `bf16`'s" in text
    assert "| bf16 | — | — | — |" in text
    assert "| fp4-none | 30 | 2 / 3 | 0: 20, 1: 10, 2: none |" in text
    assert "| fp4-ais | none | 0 / 3 | 0: none, 1: none, 2: none |" in text
