# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais analyze`` on logs written by NeMo-RL's real logger, against the float64 oracle.

The synthetic run's rollout mismatch grows step by step (tests/unit/test_analyze_logs.py);
every per-step ``ais/*`` value, alpha with its EMA carried across steps, and every mode's
weight summary is checked against ``tests/oracles.py`` (plain loops, no nemo_ais.core) on
the loss's alignment ``[:, 1:]`` x sample mask; the report must find the growing trend.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import oracles
import pytest
from plot_checks import assert_publishable
from test_analyze_logs import aligned, write_run

from nemo_ais.alarms import AlarmConfig
from nemo_ais.analyze import analyze_run, load_analysis_config
from nemo_ais.analyze.analysis import global_batches_per_step
from nemo_ais.analyze.replay import MODES
from nemo_ais.analyze.report import _DIAG_PANELS, PLOTS, build_figures, onset
from nemo_ais.analyze.trend import fit_trend, t_quantile
from nemo_ais.cli import main
from nemo_ais.config import CorrectionConfig
from nemo_ais.core import METRICS

REL = 1e-12  # float64 sums in another order than the oracle's loops
STEPS = list(range(1, 9))


def _close(got, want, key):
    assert math.isclose(got, want, rel_tol=REL, abs_tol=1e-15), (key, got, want)


def _oracle_weights(mode, old, roll, mask, cfg, alpha):
    w = oracles.weights(mode, old, roll, mask, cfg, alpha)
    vals = [w[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t] == 1]
    rho = [math.exp(old[i][t] - roll[i][t]) for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t] == 1]
    # capped as core's frac_capped: rho > C; tis also rho < floor (core: 0 when unset)
    floor = cfg.tis.floor if cfg.tis.floor is not None else 0.0
    if mode == "tis":
        hit = [r > cfg.weight_cap or r < floor for r in rho]
    elif mode == "ais":
        hit = [alpha > 0 and r > cfg.weight_cap for r in rho]
    else:
        hit = [x == 0 for x in vals]
    n, s, sq = len(vals), math.fsum(vals), math.fsum(x * x for x in vals)
    return {
        "mean": s / n,
        "max": max(vals),
        "frac_capped_or_masked": sum(hit) / n,
        "ess": s * s / (n * sq) if sq else 0.0,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    return log_dir, write_run(log_dir, STEPS)


@pytest.mark.parametrize(
    "cfg",
    [
        CorrectionConfig(ema=0.5),
        CorrectionConfig(weight_cap=1.05, seq_weight="product", icepop={"min": 0.97, "max": 1.03}),
    ],
    ids=["ema", "tight"],
)
def test_every_step_matches_the_float64_oracle(run, tmp_path, cfg):
    log_dir, data = run
    result = analyze_run(log_dir, tmp_path / "out", cfg, plots=False, chunk_tokens=40)
    assert [r["step"] for r in result.rows] == STEPS
    prev_alpha = None
    for row in result.rows:
        old, roll, mask = aligned(data[row["step"]])
        want = oracles.diagnostics(old, roll, mask, cfg, prev_alpha)
        prev_alpha = want["alpha"]
        for key, value in want.items():
            _close(row[f"ais/{key}"], value, key)
        _close(row["analysis/ess_tok"], 1 / (1 + want["cv2"]), "ess_tok")
        for mode in ("tis", "icepop", "seq_mask_geo", "ais"):
            for key, value in _oracle_weights(mode, old, roll, mask, cfg, want["alpha"]).items():
                _close(row[f"weights/{mode}/{key}"], value, f"{mode}/{key}")
    lines = (tmp_path / "out" / "analysis.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == result.rows
    metric_names = {m.name for m in METRICS if m.name.startswith("ais/")}
    assert metric_names <= set(result.rows[0])


def test_report_finds_the_growing_mismatch(run, tmp_path):
    log_dir, _ = run
    assert main(["analyze", str(log_dir), "--out", str(tmp_path), "--no-progress"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "analysis.jsonl").read_text().splitlines()]
    severity = [r["ais/severity"] for r in rows]
    assert severity == sorted(severity)  # the synthetic run's mismatch grows
    trend = fit_trend([r["step"] for r in rows], severity)
    assert trend.direction == "grows" and trend.lo > 0
    report = (tmp_path / "report.md").read_text()
    assert "| `ais/severity` (severity D (mean abs log-ratio)) |" in report
    line = next(x for x in report.splitlines() if x.startswith("| `ais/severity`"))
    assert line.rstrip().endswith("| grows |")
    assert "## Recommendation" in report and "alpha" in report
    for png in ("diagnostics.png", "alpha.png", "weights.png"):
        assert (tmp_path / png).stat().st_size > 1000
        assert f"]({png})" in report


def test_recommendation_states_the_alpha_onset():
    # from step 4 on would be 5 of 6 > 0.5 (83%), but alpha = 0.1 at step 4: the onset is
    # step 5, the first step where the condition holds (5 of 5)
    assert onset(list(range(10)), [0.1] * 5 + [0.9] * 5, lambda a: a > 0.5) == (5, 1.0, 5, 5)
    # from step 2 on: 6 of 8 > 0.5 (75% < 80%); from step 3 on: 6 of 7 (86%)
    values = [0.9, 0.1, 0.1, 0.9, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9]
    assert onset(list(range(10)), values, lambda a: a > 0.5) == (3, 6 / 7, 6, 7)
    assert onset([1, 2], [0.9, 0.9], lambda a: a > 0.5) is None  # fewer than 3 steps


def test_onset_step_itself_satisfies_the_condition():
    """The docs example once said "alpha > 0.5 from step 1" with alpha = 0.15 at step 1."""
    steps = list(range(1, 13))
    alpha = [0.15, 0.3, 0.45, 0.55, 0.62, 0.4, 0.7, 0.75, 0.8, 0.82, 0.85, 0.9]
    # by hand, suffix shares of alpha > 0.5: from step 1: 8 of 12 (67%); from step 4
    # (0.55): 8 of 9 (89%) -> the onset; steps 2, 3 (0.3, 0.45) would give 8/11, 8/10 < 80%
    step, share, k, m = onset(steps, alpha, lambda a: a > 0.5)
    assert (step, k, m) == (4, 8, 9) and share == pytest.approx(8 / 9)
    assert alpha[steps.index(step)] > 0.5
    # a low first step followed by 80% highs: the old rule named step 1 (0.15)
    alpha = [0.15] + [0.9] * 4 + [0.2] + [0.9] * 4
    step, share, k, m = onset(list(range(1, 11)), alpha, lambda a: a > 0.5)
    assert (step, k, m) == (2, 8, 9) and alpha[step - 1] > 0.5


def test_t_quantile_and_trend_ci():
    # Student-t table, 0.975 quantile
    for df, want in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281)):
        assert t_quantile(0.975, df) == pytest.approx(want, rel=1.3e-3)
    # y = 2 s exactly: slope 2, zero-width CI
    trend = fit_trend([1, 2, 3, 4], [2, 4, 6, 8])
    assert (trend.slope, trend.lo, trend.hi, trend.direction) == (2, 2, 2, "grows")
    # by hand: s = 1..4, y = 1, 3, 2, 4: S_xx = 5, S_xy = 4, b = 0.8, SSE = 1.8,
    # se = sqrt(1.8 / 2 / 5) = 0.42426, t(0.975, 2) = 4.3027 -> half width 1.8254
    trend = fit_trend([1, 2, 3, 4], [1, 3, 2, 4])
    assert trend.slope == pytest.approx(0.8)
    assert trend.hi - trend.slope == pytest.approx(4.302653 * math.sqrt(0.18), rel=1e-6)
    assert trend.direction == "flat"
    assert fit_trend([1, 2], [1, 2]) is None
    assert fit_trend([1, 2, 3, 4], [1, 1e300, 2, 3]) is None  # squares overflow: no trend


def test_config_file_and_overrides(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("loss_fn:\n  ais:\n    ema: 0.5\n    weight_cap: 3.0\nalarms:\n  window: 4\n")
    cfg, alarms = load_analysis_config(cfg_file, ["loss_fn.ais.ema=0.25", "alarms.jump_factor=5"])
    assert (cfg.ema, cfg.weight_cap, alarms.window, alarms.jump_factor) == (0.25, 3.0, 4, 5.0)
    # a NeMo-RL cluster config of this project (defaults: inheritance): its loss_fn.ais
    nemo_rl_cfg = Path(__file__).parents[2] / "configs" / "nemo_rl" / "qwen3_8b_2n8g_fp8.yaml"
    assert load_analysis_config(nemo_rl_cfg)[0].mode == "ais"
    # its alarms: the online guard's loss_fn.ais_alarms (without enabled), unless alarms: is set
    online = tmp_path / "online.yaml"
    online.write_text(
        f"defaults: {nemo_rl_cfg}\nloss_fn:\n  ais_alarms:\n    enabled: true\n"
        "    jump_factor: 20\n    fail_on_alarm: true\n"
    )
    alarms = load_analysis_config(online)[1]
    assert alarms.jump_factor == 20.0 and not alarms.fail_on_alarm  # the step's, not ours
    # an override fixes the run's own threshold before it is validated, which still names the run's key
    bad = tmp_path / "bad_online.yaml"
    bad.write_text(f"defaults: {nemo_rl_cfg}\nloss_fn:\n  ais_alarms:\n    enabled: true\n    jump_factor: -1\n")
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarms\.jump_factor=-1 is invalid"):
        load_analysis_config(bad)
    assert load_analysis_config(bad, ["alarms.jump_factor=7"])[1].jump_factor == 7.0
    with pytest.raises(ValueError, match=r"^alarms\.window=0 is invalid"):  # named where the bad value was set
        load_analysis_config(bad, ["alarms.jump_factor=7", "alarms.window=0"])
    # the run's fail_on_alarm is its training step's; the command line's is ours
    assert load_analysis_config(online, ["alarms.fail_on_alarm=true"])[1].fail_on_alarm
    bad.write_text(f"defaults: {nemo_rl_cfg}\nloss_fn:\n  ais_alarms: 3\n")
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarms: expected a mapping of fields, got int"):
        load_analysis_config(bad)
    online.write_text(online.read_text() + "alarms:\n  window: 4\n")
    assert load_analysis_config(online)[1].jump_factor == AlarmConfig().jump_factor
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.weight_cap=0\.5 is invalid"):
        load_analysis_config(None, ["loss_fn.ais.weight_cap=0.5"])
    with pytest.raises(ValueError, match=r"expected loss_fn\.ais\.<field>=value"):
        load_analysis_config(None, ["grpo.max_num_steps=3"])
    with pytest.raises(ValueError, match=r"alarms\.windw is not a known field"):
        load_analysis_config(None, ["alarms.windw=3"])
    # a mode's knob lives in its sub-section; the old flat key is refused with the new name
    cfg, _ = load_analysis_config(cfg_file, ["loss_fn.ais.icepop.min=0.7"])
    assert (cfg.icepop.min, cfg.icepop.max, cfg.ema) == (0.7, 5.0, 0.5)
    with pytest.raises(ValueError, match=r"icepop_min moved: use loss_fn\.ais\.icepop\.min"):
        load_analysis_config(None, ["loss_fn.ais.icepop_min=0.7"])


def test_cli_config_error_exits_2(run, tmp_path, capsys):
    log_dir, _ = run
    assert main(["analyze", str(log_dir), "--out", str(tmp_path), "loss_fn.ais.ema=2"]) == 2
    err = capsys.readouterr().err
    assert "loss_fn.ais.ema=2" in err and "Traceback" not in err
    # a section that is not a mapping, in any section analyze reads
    bad = tmp_path / "bad.yaml"
    for text, key, got in [
        ("loss_fn: foo\n", "loss_fn", "str"),
        ("loss_fn:\n  ais: 3\n", "loss_fn.ais", "int"),
        ("grpo: 5\n", "grpo", "int"),
        ("policy:\n  generation: 5\n", "policy.generation", "int"),
    ]:
        bad.write_text(text)
        assert main(["analyze", str(log_dir), "--out", str(tmp_path), "--config", str(bad)]) == 2
        assert f"invalid config: {key}: expected a mapping of fields, got {got}" in capsys.readouterr().err


def test_spilled_chunks_give_the_same_rows(run, tmp_path, monkeypatch):
    log_dir, _ = run
    monkeypatch.setenv("TMPDIR", str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    in_memory = analyze_run(log_dir, tmp_path / "a", plots=False)
    spilled = analyze_run(log_dir, tmp_path / "b", plots=False, chunk_tokens=40, memory_budget_bytes=0)
    for got, want in zip(spilled.rows, in_memory.rows, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, float):
                _close(got[key], value, key)
            else:
                assert got[key] == value, key
    assert list((tmp_path / "spill").iterdir()) == []  # the spill directories are removed


def test_plots_are_publishable(tmp_path):
    import matplotlib.pyplot as plt

    # two steps: a default locator would put ticks at 1.2, 1.4, ... between them
    write_run(tmp_path / "logs", [1, 2])
    rows = analyze_run(tmp_path / "logs", tmp_path / "out", plots=False).rows
    figures = build_figures(rows)
    assert tuple(figures) == PLOTS
    series = {
        "diagnostics.png": {key for keys, _, _ in _DIAG_PANELS for key in keys},
        "alpha.png": {"ais/alpha", "ais/alpha_raw", "ais/g_sev", "ais/g_rel", "ais/g_var"},
        "weights.png": set(MODES),
    }
    for name, fig in figures.items():
        assert_publishable(fig, series[name])
        plt.close(fig)


@pytest.mark.parametrize(("global_batch", "batches"), [(8, 4), (32, 1), (24, 1), (12, 2), ("null", 1)], ids=str)
def test_config_with_several_global_batches_per_step_says_alpha_differs(run, tmp_path, caplog, global_batch, batches):
    log_dir, _ = run
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(
        "grpo:\n  num_prompts_per_step: 4\n  num_generations_per_prompt: 8\n"
        f"policy:\n  train_global_batch_size: {global_batch}\n"
        "loss_fn:\n  ais:\n    ema: 0.5\n"
    )
    # 32 samples per step // gbs, as NeMo-RL's workers count (the 8 rows past 24 are not trained)
    assert global_batches_per_step(cfg_file) == batches
    out = tmp_path / "out"
    argv = ["analyze", str(log_dir), "--out", str(out), "--config", str(cfg_file)]
    assert main([*argv, "--no-progress", "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    if batches > 1:
        claim = "**The replayed alpha differs from the online one**: the run's config has "
        assert f"{claim}{batches} global batches per step" in report
        assert f"{batches} global batches per step" in warned and "differs" in warned
    else:
        assert "differs from the online one" not in report + warned


def test_a_run_directory_whose_name_is_not_utf8_gets_its_report(run, tmp_path):
    log_dir, _ = run
    odd = tmp_path / os.fsdecode(b"run\xff") / log_dir.name
    shutil.copytree(log_dir, odd)
    assert main(["analyze", str(odd), "--out", str(tmp_path / "out"), "--no-plots", "--no-progress"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Per-step values" in report and "run\\udcff" in report
    # the summary line names the path, on a strict UTF-8 stdout (an ordinary UTF-8 locale), as the console script
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    done = subprocess.run(
        [sys.executable, "-m", "nemo_ais", "analyze", str(odd), "--no-plots", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "run\\udcff" in done.stdout and "report.md" in done.stdout
    # a stdout that already writes such a path's own bytes (the C locale's surrogateescape) keeps doing so
    env["PYTHONIOENCODING"] = "utf-8:surrogateescape"
    done = subprocess.run(
        [sys.executable, "-m", "nemo_ais", "analyze", str(odd), "--no-plots", "--no-progress"],
        env=env,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0 and b"run\xff" in done.stdout
