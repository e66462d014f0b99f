# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Report: per-arm summary statistics from a hand-made metrics file, and the plots."""

import json
import math
import statistics

import pytest
import yaml
from plot_checks import assert_publishable
from scipy import stats

from nemo_ais.embedded.config import CONFIG_DIR, load_config
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
from nemo_ais.embedded.stats import plan_records, run_extent, unfinished_seeds


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


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_run_cut_short_has_no_nan_in_its_tables(tmp_path, n):
    # only the step-0 evaluation, or a train step without an evaluation after step 0
    _write(tmp_path / "metrics.jsonl", _records()[:n])
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "nan" not in text.lower(), text
    assert "| a | 1 | 0.100 ± — |" in text  # what there is, is reported; one seed has no spread


@pytest.mark.parametrize(
    ("bad", "where", "why"),
    [
        ('{"kind": "train", "arm": "a"\n', 2, "not a JSON record"),  # a torn line, not last
        ("[1, 2]\n", 2, "it is not an object"),
        ('{"kind": "train", "arm": "a", "seed": 0}\n', 2, "it lacks step"),
        # the tables sort steps and pair seeds: a TypeError traceback before
        ('{"kind": "train", "arm": "a", "seed": 0, "step": "3"}\n', 2, "step='3', expected an"),
        ('{"kind": "train", "arm": "a", "seed": null, "step": 3}\n', 2, "seed=None, expected"),
    ],
)
def test_a_bad_line_other_than_a_cut_last_one_names_file_and_line(tmp_path, bad, where, why):
    """Only the last write a crash cut short is skipped; a report never drops records silently."""
    good = [json.dumps(r) + "\n" for r in _records()[:3]]
    (tmp_path / "metrics.jsonl").write_text(good[0] + bad + "".join(good[1:]))
    with pytest.raises(ValueError, match=rf"metrics\.jsonl:{where}: .*{why}"):
        load_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("".join(good) + good[0][:20])  # cut, no newline
    assert load_metrics(tmp_path) == _records()[:3]


def test_report_takes_the_metrics_file_as_its_help_says(tmp_path, capsys):
    _write(tmp_path / "metrics.jsonl", _records())
    from nemo_ais.cli import main

    assert main(["report", str(tmp_path / "metrics.jsonl")]) == 0
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "reward.png").is_file()
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train"}\n')
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl:1: expected a record with kind, arm, seed, step" in capsys.readouterr().err


@pytest.mark.parametrize(("pinned", "why"), [("a: [\n", "cannot be read"), ("- a list\n", "got a YAML list")])
def test_an_unreadable_pinned_config_is_one_named_line(tmp_path, capsys, pinned, why):
    from nemo_ais.cli import main

    _write(tmp_path / "metrics.jsonl", _records())
    (tmp_path / "config.yaml").write_text(pinned)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.yaml: " in err and why in err, err
    assert not list(tmp_path.glob("*.png"))  # refused before anything is drawn


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
    lo, hi = stats.t.interval(0.95, len(diffs) - 1, loc=statistics.fmean(diffs), scale=stats.sem(diffs))
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
    bf16_row = next(line for line in text.splitlines() if line.startswith("| bf16 | 2 |"))
    # both bf16 seeds are paired, but fp8's shown mean is over 3: the cell says it rests on 2 pairs
    assert bf16_row.endswith("] over 2 paired seed(s) |")
    assert "(mean ± sample std over each arm's seeds (its seeds column).)" in text
    # against bf16, fp8's third seed has no partner: the Δ cells say they rest on 2 of its 3 seeds
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"experiment": {"reference_arm": "bf16"}}))
    write_report(tmp_path, plots=False)
    rows = [line for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| fp8 | ")]
    assert rows[0].startswith("| fp8 | 3 |") and rows[0].endswith("] over 2 paired seed(s) |")
    assert rows[1].endswith("] over 2 paired seed(s) |")  # the early-accuracy table


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
    assert d0 == pytest.approx(0.001 * 5.5 + 0.00005) and d1 == pytest.approx(0.001 * 15.5 + 0.00005)
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
    recs = [_val(arm, seed, 10 * i, a) for (arm, seed), row in accs.items() for i, a in enumerate(row)]
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


def _run_records(steps, seeds, *, drop_at=None):
    """bf16 (D = 0, constant) and a W4A4 arm whose accuracy falls to 0 from ``drop_at``."""
    recs = []
    for arm in ("bf16", "nvfp4_w4a4-none"):
        for seed in seeds:
            for step in range(1, steps + 1):
                sev = 0.0 if arm == "bf16" else 0.03 + 0.001 * step
                recs.append(
                    {
                        "kind": "train",
                        "arm": arm,
                        "seed": seed,
                        "step": step,
                        "reward": 0.25,
                        "alpha": 0.0,
                        "ais/severity": sev,
                        "ais/ess_seq": 0.99,
                        "ess_tok": 0.98,
                        "ais/kl_k3": sev / 10,
                        "ais/token_mult_prob_error": 1.0 + sev,
                        "entropy": 0.5 - 0.001 * step,
                        "response_length": 4.0,
                        "time/step": 0.5,
                        **{f"error_tokens/{k}_frac": 0.0 for k in ("repeat", "invalid", "error")},
                    }
                )
            for step in range(0, steps + 1, 2):
                low = arm != "bf16" and drop_at is not None and step >= drop_at
                recs.append(_val(arm, seed, step, 0.0 if low else 0.1))
    return recs


def test_a_smoke_run_says_so_and_leaves_out_what_it_is_too_short_for(tmp_path):
    # --preset fp4-quick's shape: 4 steps, 1 seed; the W4A4 arm "collapses" at step 4
    recs = _run_records(4, [0], drop_at=4)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path)
    paragraphs = (tmp_path / "summary.md").read_text().split("\n\n")
    assert paragraphs[1] == (
        "**Smoke run, not evidence:** 4 GRPO steps (evidence: >= 20); 1 seed (no paired "
        "confidence interval; evidence: >= 2). It checks that the pipeline runs end to end; "
        "differences between its arms are noise. Evidence: `nemo-ais run --preset evidence` "
        "(FP8) or `--preset fp4-evidence` (NVFP4), 60 steps x 8 seeds (docs/results.md)."
    )
    text = "\n\n".join(paragraphs)
    assert "| nvfp4_w4a4-none | 4 |" not in text and "collapse step (seed mean)" not in text
    assert "Collapse step: left out. A 4-step run has too few evaluations" in text
    assert (
        "first 10 steps →" not in text
        and "Non-stationarity (first 10 → last 10 steps): left out, a 4-step run has no two disjoint 10-step windows."
        in text
    )
    assert "nan" not in text.lower() and "FP8 twin" not in text
    assert "| reward (all 4 steps) |" in text


def test_a_run_long_enough_is_not_a_smoke_run_and_marks_undefined_correlations(tmp_path):
    recs = _run_records(20, [0, 1], drop_at=12)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "Smoke run" not in text and "left out" not in text
    assert "| nvfp4_w4a4-none | 12 | 2 / 2 | 0: 12, 1: 12 |" in text
    assert "| reward (last 10) |" in text
    # bf16's D is 0 at every step: its correlations are undefined, written n/a (not nan)
    bf16 = next(line for line in text.splitlines() if line.startswith("| bf16 | 0.00e+00 →"))
    assert bf16.endswith("| n/a | n/a |"), bf16
    w4a4 = next(line for line in text.splitlines() if line.startswith("| nvfp4_w4a4-none | 3."))
    assert w4a4.endswith("| +1.00 | -1.00 |"), w4a4


@pytest.mark.parametrize(
    ("steps", "seeds", "reasons"),
    [
        (4, [0], ["4 GRPO steps (evidence: >= 20)", "1 seed (no paired confidence interval; evidence: >= 2)"]),
        (20, [0], ["1 seed (no paired confidence interval; evidence: >= 2)"]),
        (19, [0, 1], ["19 GRPO steps (evidence: >= 20)"]),
        (20, [0, 1], []),
    ],
)
def test_smoke_reasons(steps, seeds, reasons):
    from nemo_ais.embedded.report import smoke_reasons

    assert smoke_reasons(_run_records(steps, seeds)) == reasons


def _cut(recs, arm, seed, last):
    """``recs`` without the records of (``arm``, ``seed``) after step ``last`` (an interrupted run)."""
    return [r for r in recs if not (r["arm"] == arm and r["seed"] == seed and r["step"] > last)]


def test_an_unfinished_seed_is_left_out_of_the_accuracy_statistics_and_named(tmp_path):
    """Every arm and seed has the same curve (accuracy = step / 60); W4A4 seed 1 stopped at step 20 of 30. Its own
    "second half" (evaluations at steps 10..20, mean 0.25) is not the others' (16..30, mean 23 / 60): pairing it
    would invent a difference of -0.133 between identical arms."""
    recs = [dict(r, accuracy=r["step"] / 60) if r["kind"] == "val" else r for r in _run_records(30, [0, 1])]
    recs = _cut(recs, "nvfp4_w4a4-none", 1, 20)
    assert primary_metric(recs)["nvfp4_w4a4-none"] == {0: pytest.approx(23 / 60)}
    assert paired_differences(recs, "bf16")["nvfp4_w4a4-none"][:2] == (1, 0.0)
    assert arm_summary(recs)["nvfp4_w4a4-none"]["unfinished"] == {1: 20}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert (
        "**Unfinished seeds, left out of every accuracy statistic:** nvfp4_w4a4-none seed 1 (last evaluation at "
        "step 20 of 30); re-running the same command finishes them (it resumes)."
    ) in text
    assert "| nvfp4_w4a4-none | 1 | 0.000 ± — | 0.500 ± — | **0.383 ± —** |" in text
    assert "| nvfp4_w4a4-none | none | 0 / 1 | 0: none |" in text  # the collapse table: seed 0 only


def test_the_docs_copy_of_a_summary_keeps_its_caveats_and_footnotes(tmp_path):
    """benchmarks.results_tables copies tables into docs/results.md: a caveat or "± sample std" note must come too."""
    from benchmarks.results_tables import section_body

    run = tmp_path / "cut"
    run.mkdir()
    recs = _cut(_run_records(30, [0, 1]), "nvfp4_w4a4-none", 1, 20)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(run, plots=False)
    body = section_body(run)
    assert body.startswith("Caveat copied from `runs/cut/summary.md`: **Unfinished seeds, left out of every")
    assert "(mean ± sample std over" in body and body.count("Source: copied from `runs/cut/summary.md`") >= 2


def test_an_arm_with_its_own_shorter_run_is_not_unfinished():
    """An arm may set its own grpo.max_num_steps: every seed of it ending at step 20 of a 30-step run is finished."""
    recs = _cut(_cut(_run_records(30, [0, 1]), "nvfp4_w4a4-none", 0, 20), "nvfp4_w4a4-none", 1, 20)
    assert unfinished_seeds(recs) == {}
    assert set(primary_metric(recs)["nvfp4_w4a4-none"]) == {0, 1}


def test_an_arm_cut_short_on_every_seed_is_unfinished_by_its_pinned_plan(tmp_path):
    """Arms run one after another: an arm stopped on its first seed (a report mid-run, a divergence) must not read as
    an arm whose own grpo.max_num_steps is 20. The pinned config.yaml says it planned 30."""
    recs = [dict(r, accuracy=r["step"] / 60) if r["kind"] == "val" else r for r in _run_records(30, [0])]
    recs = _cut(recs, "nvfp4_w4a4-none", 0, 20)
    assert unfinished_seeds(recs) == {}  # the records alone cannot tell
    planned = recs + plan_records({"bf16": 30, "nvfp4_w4a4-none": 30})
    assert unfinished_seeds(planned) == {"nvfp4_w4a4-none": {0: 20}}
    assert "nvfp4_w4a4-none" not in primary_metric(planned) and run_extent(planned) == run_extent(recs)
    raw = load_config(CONFIG_DIR / "quick.yaml", ["grpo.max_num_steps=30"])
    raw["experiment"]["arms"] = {"bf16": raw["experiment"]["arms"]["bf16"], "nvfp4_w4a4-none": {}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "nvfp4_w4a4-none seed 0 (last evaluation at step 20 of 30)" in text


def test_an_arm_of_the_pinned_config_with_no_record_yet_is_named(tmp_path):
    """Interrupted before an arm's first record: the report names it instead of leaving it out silently."""
    recs = _run_records(30, [0])
    raw = load_config(CONFIG_DIR / "quick.yaml", ["grpo.max_num_steps=30"])
    raw["experiment"]["arms"] = {"bf16": raw["experiment"]["arms"]["bf16"], "nvfp4_w4a4-none": {}, "later-arm": {}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "not started yet, absent from every table:** later-arm;" in text
    del raw["experiment"]["arms"]["later-arm"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    write_report(tmp_path, plots=False)  # every arm of the plan has records
    assert "not started" not in (tmp_path / "summary.md").read_text()


def test_an_arm_too_short_for_two_windows_and_a_nan_entropy_print_a_dash(tmp_path):
    """A bypass arm logs entropy = NaN by design; an arm cut at step 12 of 30 has no two disjoint 10-step windows."""
    recs = _cut(_run_records(30, [0, 1]), "nvfp4_w4a4-none", 0, 12)
    recs = _cut(recs, "nvfp4_w4a4-none", 1, 12)
    recs = [dict(r, entropy=math.nan) if r["arm"] == "bf16" and "entropy" in r else r for r in recs]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "nan" not in text.lower()
    bf16 = next(line for line in text.splitlines() if line.startswith("| bf16 | 0.00e+00 →"))
    assert "| — → — |" in bf16
    short = next(line for line in text.splitlines() if line.startswith("| nvfp4_w4a4-none | — → — |"))
    assert short.startswith("| nvfp4_w4a4-none | — → — | — → — | — → — |"), short


def test_without_the_reference_arm_the_collapse_cells_are_na_not_never(tmp_path):
    recs = [r for r in _run_records(20, [0, 1], drop_at=12) if r["arm"] != "bf16"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(tmp_path, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "**No finished `bf16` arm** (`experiment.reference_arm`): every Δ and collapse cell is n/a." in text
    assert "| nvfp4_w4a4-none | n/a | n/a | n/a |" in text and "none | 0 / 0" not in text
