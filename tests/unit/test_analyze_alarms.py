# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The refit guard: each alarm rule by hand, online (as the AIS worker calls it) and offline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from test_analyze_logs import write_run
from torch_free import torch_free_env

from nemo_ais import alarms
from nemo_ais.analyze import (
    ALARM_KINDS,
    AlarmConfig,
    AlarmMonitor,
    RefitAlarmError,
    alarm_metrics,
    analyze_run,
    position_profile,
)
from nemo_ais.config import CorrectionConfig
from nemo_ais.core import compute_diagnostics
from nemo_ais.nemo_rl import loss
from nemo_ais.nemo_rl.workers import mixin


def _diag(tmpe, severity, empty=0.0):
    return {"token_mult_prob_error": tmpe, "severity": severity, "empty_batch": empty}


def test_jump_fires_only_after_history_and_above_both_thresholds():
    monitor = AlarmMonitor(AlarmConfig(min_history=3, jump_factor=3.0, min_jump=0.01))
    assert monitor.observe(1, _diag(1.5, 0.5)) == []  # no history yet
    monitor = AlarmMonitor(AlarmConfig(min_history=3, jump_factor=3.0, min_jump=0.01))
    for step in range(1, 4):
        assert monitor.observe(step, _diag(1.02, 0.02)) == []
    # tmpe excess and D 0.05 = 2.5x the median 0.02: below the factor
    assert monitor.observe(4, _diag(1.05, 0.05)) == []
    # tmpe excess 0.10 = 5x its median while D (the bulk, mean |l|) stays: a few outlier
    # tokens, a tail (issue 27: single tokens drove tmpe_jump on healthy runs); silent
    assert monitor.observe(5, _diag(1.10, 0.02)) == []
    tmpe, sev = monitor.observe(6, _diag(1.10, 0.10))  # both 0.10 = 5x the median 0.02
    assert (tmpe.kind, tmpe.step, sev.kind) == ("tmpe_jump", 6, "severity_jump")
    assert "0.1 vs 0.02 median of the previous 5 steps (5.0x; threshold 3.0x)" in tmpe.evidence
    # 3.5x a tiny median but only +0.0025: below min_jump (0.003)
    quiet = AlarmMonitor(AlarmConfig(min_history=1))
    quiet.observe(1, _diag(1.001, 0.001))
    assert quiet.observe(2, _diag(1.0035, 0.0035)) == []


def test_a_window_shorter_than_the_history_it_needs_is_refused():
    # the baseline holds `window` steps: with window 2 < min_history 3 no jump could ever fire
    with pytest.raises(ValueError, match=r"min_history=3 must be <= window=2"):
        AlarmConfig(window=2)
    monitor = AlarmMonitor(AlarmConfig(window=3, min_history=3))  # equal: fires once the window is full
    for step in range(1, 10):
        assert monitor.observe(step, _diag(1.01, 0.01)) == []
    assert [a.kind for a in monitor.observe(10, _diag(2.0, 1.0))] == ["tmpe_jump", "severity_jump"]


def test_empty_batch_neither_fires_nor_enters_the_history():
    monitor = AlarmMonitor(AlarmConfig(min_history=1))
    assert monitor.observe(1, _diag(1.0, 0.0, empty=1.0)) == []
    assert monitor.state_dict() == {"tmpe_excess": [], "severity": [], "abs_log_ratio_p999": []}


def test_nonfinite_names_the_count_and_first_position():
    (alarm,) = AlarmMonitor().observe(
        7, _diag(1.01, 0.01), n_nonfinite=3, nonfinite_where="f.jsonl:2 prev_logprobs[5] = nan"
    )
    assert str(alarm) == (
        "step 7: nonfinite: 3 valid positions with a NaN/inf log-prob; first f.jsonl:2 prev_logprobs[5] = nan"
    )


def _kv_batch(growth, length=512, batch=4):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(batch, length, generator=g) - 0.1
    sigma = 0.01 * (1 + growth * torch.arange(length) / length)
    return old, old + sigma * torch.randn(batch, length, generator=g), torch.ones(batch, length)


def test_kv_scale_alarm_on_mismatch_growing_with_position():
    monitor = AlarmMonitor()
    (alarm,) = monitor.observe(3, _diag(1.01, 0.01), profile=position_profile(*_kv_batch(9.0)))
    assert alarm.kind == "kv_scale_position"
    assert "in the last quarter of each sequence vs" in alarm.evidence
    assert "4 sequences spanning >= 256 positions, 512 and 512 tokens" in alarm.evidence
    assert monitor.observe(4, _diag(1.01, 0.01), profile=position_profile(*_kv_batch(0.0))) == []
    short = position_profile(*_kv_batch(9.0, length=128))  # span 128 < kv_min_length
    assert short.n_seq == 0
    assert AlarmMonitor().observe(5, _diag(1.01, 0.01), profile=short) == []


def test_kv_alarm_has_no_false_alarm_on_mixed_lengths():
    """Constant per-token mismatch within each sequence, longer sequences more mismatched.

    By absolute position, the last quarter of the longest span holds only the long (more
    mismatched) sequences: > 2x the first quarter's mean |l|, a false alarm. Quarters of each
    sequence's own span compare every sequence with itself: no alarm.
    """
    g = torch.Generator().manual_seed(3)
    lengths = [256, 256, 256, 256, 1024, 1024]
    old = -torch.rand(6, 1024, generator=g, dtype=torch.float64) - 0.1
    mask = torch.zeros(6, 1024)
    sigma = torch.zeros(6, 1)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        sigma[i] = 0.01 if n == 256 else 0.06
    roll = old + sigma * torch.randn(6, 1024, generator=g, dtype=torch.float64)
    profile = position_profile(old, roll, mask)
    assert profile.n_seq == 6
    early, late = profile.quarters()[0][0], profile.quarters()[-1][0]
    assert late / early == pytest.approx(1.0, rel=0.15)
    assert AlarmMonitor().observe(1, _diag(1.01, 0.01), profile=profile) == []
    # the same batch by absolute position would have fired: last quarter long rows only
    abs_l = (old - roll).abs() * mask
    by_abs = [abs_l[:, a : a + 256].sum() / mask[:, a : a + 256].sum() for a in (0, 768)]
    assert by_abs[1] / by_abs[0] > 2.0


def test_position_profile_is_additive_and_relative_to_each_sequence():
    old, roll, mask = _kv_batch(1.0, length=8, batch=4)
    mask[:, 6:] = 0
    mask[1, 4:] = 0  # a shorter sequence: its own quarters
    roll[:, 6:] = -math.inf
    whole = position_profile(old, roll, mask, min_length=4)
    halves = position_profile(old[:2], roll[:2], mask[:2], min_length=4).merge(
        position_profile(old[2:], roll[2:], mask[2:], min_length=4)
    )
    assert torch.allclose(whole.abs_log_rho_sum, halves.abs_log_rho_sum, rtol=0, atol=1e-15)
    # spans 6, 4, 6, 6: quarters of 6 positions hold 2, 1, 2, 1; of 4 positions 1 each
    assert whole.n_tok.tolist() == [7, 4, 7, 4] and whole.n_seq == 4
    assert whole.n_tok.tolist() == halves.n_tok.tolist() and halves.n_seq == 4
    assert torch.isfinite(whole.abs_log_rho_sum).all()
    assert position_profile(old, roll, mask, min_length=5).n_seq == 3  # span 4 left out


def test_online_use_in_a_worker_logs_metrics_and_fails_when_configured():
    """What the AIS worker would do once per global batch, after compute_diagnostics."""
    cfg = CorrectionConfig()
    monitor = AlarmMonitor(AlarmConfig(min_history=2, fail_on_alarm=True, jump_factor=8.0))
    g = torch.Generator().manual_seed(1)
    for step, sigma in enumerate([0.01, 0.01, 0.01, 0.3], start=1):
        old = -torch.rand(8, 32, generator=g) - 0.1
        roll = old + sigma * torch.randn(8, 32, generator=g)
        mask = torch.ones(8, 32)
        diag = compute_diagnostics(old, roll, mask, cfg)
        if sigma < 0.1:
            alarms = monitor.observe(step, diag)
            assert alarm_metrics(alarms) == {f"ais_alarm/{k}": 0.0 for k in ALARM_KINDS}
            continue
        with pytest.raises(RefitAlarmError, match=r"step 4: tmpe_jump: .*step 4: severity_jump"):
            monitor.observe(step, diag)
    assert len(monitor.state_dict()["severity"]) == 4  # the failing step entered the history
    restored = AlarmMonitor(AlarmConfig(min_history=2, jump_factor=8.0))
    restored.load_state_dict(monitor.state_dict())
    assert restored.state_dict() == monitor.state_dict()


def test_offline_report_names_each_alarm_with_its_step(tmp_path):
    log_dir = tmp_path / "logs"
    steps = {s: {} for s in range(1, 9)}
    steps[6] = {"jump": 0.8}
    steps[8] = {"kv": True, "length": 640, "batch": 24, "jump": 0.01}
    write_run(log_dir, steps)
    path = log_dir / "train_data_step4.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["prev_logprobs"][0][10] = float("nan")  # a valid position (token_loss_mask = 1)
    lines[1] = json.dumps(row) + "\n"
    # NeMo-RL logs float32: beyond its range is corrupt too (the report crashed on -1e300)
    row = json.loads(lines[2])
    row["generation_logprobs"][0][10] = -1e300
    lines[2] = json.dumps(row) + "\n"
    path.write_text("".join(lines))
    eight = AlarmConfig(jump_factor=8.0)  # the synthetic jump is ~20x (default 48)
    result = analyze_run(log_dir, tmp_path / "out", alarm_config=eight, plots=False)
    fired = {(r["step"], a.split(": ")[1]) for r in result.rows for a in r["alarms"]}
    assert fired == {
        (4, "nonfinite"),
        (6, "tmpe_jump"),
        (6, "severity_jump"),
        # no tail_jump: 192 tokens a step, below tail_min_tokens (p99.9 = the largest token)
        (8, "kv_scale_position"),
    }
    nonfinite = next(a for a in result.alarms if "nonfinite" in a)
    assert "first train_data_step4.jsonl:2 prev_logprobs[10] = nan" in nonfinite
    assert result.rows[3]["analysis/nonfinite"] == 2 and result.rows[3]["ais_alarm/nonfinite"] == 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| 6 | tmpe_jump |" in report and "| 8 | kv_scale_position |" in report
    assert "Steps with a jump alarm (6) are left out of the fit" in report


@pytest.mark.parametrize(
    ("args", "code"),
    [([], 0), (["--fail-on-alarm"], 3), (["alarms.fail_on_alarm=true"], 3)],
    ids=["alarms-logged", "flag", "config-key"],
)
def test_offline_fail_on_alarm_exits_3_after_writing_the_report(tmp_path, capsys, args, code):
    from nemo_ais.cli import main

    log_dir = tmp_path / "logs"
    write_run(log_dir, {s: ({"jump": 0.8} if s == 6 else {}) for s in range(1, 8)})
    out = tmp_path / "out"
    argv = ["analyze", str(log_dir), "--out", str(out), "--no-progress", "--no-plots"]
    got = main([*argv, "alarms.jump_factor=8", *args])  # the synthetic jump is ~20x
    assert got == code, capsys.readouterr()
    assert "| 6 | tmpe_jump |" in (out / "report.md").read_text()  # written in every case
    assert "alarm: step 6: tmpe_jump" in capsys.readouterr().out


# ----------------------------------------------------------------- where the alarm lives


def test_the_alarm_imports_without_torch_and_both_users_sit_above_it(tmp_path):
    """``nemo_ais.alarms`` imports (and runs) in a Python where torch cannot be imported.

    The pre-flight check validates ``loss_fn.ais_alarms`` on a login node; the AIS worker
    and ``nemo-ais analyze`` import the same objects from it (not one from the other).
    """
    script = (
        "from nemo_ais.alarms import AISAlarmsConfig, AlarmMonitor\n"
        "m = AlarmMonitor(AISAlarmsConfig(min_history=1))\n"
        "d = {'token_mult_prob_error': 1.01, 'severity': 0.01, 'empty_batch': 0.0}\n"
        "m.observe(1, d)\n"
        "d = {'token_mult_prob_error': 1.5, 'severity': 0.5, 'empty_batch': 0.0}\n"
        "print(*m.observe(2, d))\n"
    )
    env = torch_free_env(tmp_path, {"PATH": os.environ["PATH"]})
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    # 0.5 = 50x the median 0.01 of 1 earlier step (min_history=1)
    assert res.stdout.startswith("step 2: tmpe_jump: token_mult_prob_error - 1 0.5 vs 0.01")
    assert mixin.AlarmMonitor is alarms.AlarmMonitor is AlarmMonitor
    assert loss.AISAlarmsConfig is alarms.AISAlarmsConfig
