# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Tail statistics of the log-ratio (issue 27, item 8): ``ais/abs_log_ratio_p999``,
``ais/abs_log_ratio_peak``, ``ais/seq_kl_peak`` and the ``tail_jump`` alarm.

They come from two log-spaced count histograms in the one statistics all-reduce (SUM);
``tests/unit/test_core_diagnostics.py`` checks them against the plain-loop oracle on random
batches. Here: the failure shapes the issue cites, where the tails move and the means do
not (veRL #7986: a wrong layout, KL up 25x in some sequences while the mean probability
difference stays ~1e-6; NeMo-RL #4080: one token drives ``token_mult_prob_error``), the
additivity over ranks (empty ranks included), and ``nemo-ais analyze`` reporting them.
"""

from __future__ import annotations

import math

import oracles
import pytest
import torch
from test_analyze_logs import write_run

from nemo_ais.alarms import AlarmConfig, AlarmMonitor
from nemo_ais.analyze import analyze_run
from nemo_ais.config import CorrectionConfig
from nemo_ais.core import AISStats, compute_diagnostics, compute_statistics, diagnostics_from_stats
from nemo_ais.core.stats import NUM_SLOTS, STATS_BYTES, TAIL_BINS, Slot

CFG = CorrectionConfig()
TAILS = ("abs_log_ratio_p999", "abs_log_ratio_peak", "seq_kl_peak")


def _healthy(seed, b=16, t=256, sigma=0.02):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.05
    return old, old + sigma * torch.randn(b, t, generator=g, dtype=torch.float64), torch.ones(b, t)


def _oracle(old, roll, mask):
    return oracles.diagnostics(old.tolist(), roll.tolist(), mask.tolist(), CFG)


def test_one_outlier_token_moves_the_peak_not_the_means():
    old, roll, mask = _healthy(0)
    base = compute_diagnostics(old, roll, mask, CFG)
    roll[3, 100] = old[3, 100] - 6.14  # one token: exp(|l|) = 464 (NeMo-RL #4080)
    hit = compute_diagnostics(old, roll, mask, CFG)
    expected = _oracle(old, roll, mask)
    for key in TAILS:
        assert getattr(hit, key) == expected[key], key
    assert hit.abs_log_ratio_peak == 4.0  # |l| = 6.14 lies in the bin [4, 8)
    assert base.abs_log_ratio_peak <= 0.125  # healthy: max |l| < 0.25
    assert hit.abs_log_ratio_p999 == base.abs_log_ratio_p999  # one token of 4096: not p99.9
    assert hit.seq_kl_peak >= 16 * base.seq_kl_peak  # its sequence's mean KL jumps
    assert hit.severity < 1.1 * base.severity  # the mean |l| barely moves (+6.1 / 4096)
    assert hit.token_mult_prob_error - 1 > 5 * (base.token_mult_prob_error - 1)  # tmpe does


def test_a_single_outlier_token_fires_no_alarm_on_a_healthy_run():
    # Issue 27, item 2: healthy runs have single outlier tokens (tmpe excess up to 304x its
    # median); the guard must not tell the user to check the FP8 refit for them. At the
    # former jump_factor 8 (the default is 48): the rule, not the threshold, keeps it quiet
    monitor = AlarmMonitor(AlarmConfig(jump_factor=8.0))
    for step in range(1, 6):  # min_history (5) healthy steps
        assert monitor.observe(step, compute_diagnostics(*_healthy(step), CFG)) == []
    old, roll, mask = _healthy(7)
    roll[5, 17] = old[5, 17] - 10.0  # exp(10) / 4096 = 5.4: tmpe excess ~100x its median
    diag = compute_diagnostics(old, roll, mask, CFG)
    median = monitor.state_dict()["tmpe_excess"][-1]
    assert diag.token_mult_prob_error - 1 > 50 * median  # the old rule fired here
    assert monitor.observe(6, diag) == []
    assert diag.abs_log_ratio_peak == 8.0  # reported as a tail: |l| = 10 in [8, 16)
    # a broad mismatch (every token 10x, above jump_factor 8) still fires both mean alarms
    old, roll, mask = _healthy(8, sigma=0.2)
    kinds = [a.kind for a in monitor.observe(7, compute_diagnostics(old, roll, mask, CFG))]
    assert kinds == ["tmpe_jump", "severity_jump"] or "tmpe_jump" in kinds, kinds


def test_a_layout_bug_in_some_sequences_moves_the_tails_and_fires_tail_jump():
    # veRL #7986: one sequence in 32 (a wrongly laid-out expert) carries a 25x larger
    # mismatch: p99.9 |l| rises 8x (3 bins), the batch's mean |l| and tmpe < 2x
    monitor = AlarmMonitor(AlarmConfig())
    for step in range(1, 6):  # min_history (5) healthy steps
        assert monitor.observe(step, compute_diagnostics(*_healthy(step, b=32), CFG)) == []
    old, roll, mask = _healthy(9, b=32)
    roll[:1] = old[:1] + 25 * (roll[:1] - old[:1])
    diag = compute_diagnostics(old, roll, mask, CFG)
    alarms = monitor.observe(6, diag)
    assert [a.kind for a in alarms] == ["tail_jump"], alarms  # the means stay below 3x
    assert "p99.9 |log-ratio|" in alarms[0].evidence
    expected = _oracle(old, roll, mask)
    for key in TAILS:
        assert getattr(diag, key) == expected[key], key


def test_tails_are_additive_over_ranks_with_empty_ranks():
    old, roll, mask = _healthy(3, b=9, t=40, sigma=0.3)
    mask[5:7] = 0  # an all-empty "rank"
    parts = [
        compute_statistics(old[r], roll[r], mask[r], CFG) for r in (slice(0, 5), slice(5, 7), slice(7, 9), slice(9, 9))
    ]
    summed = AISStats(sum(p.vector for p in parts))
    whole = compute_statistics(old, roll, mask, CFG)
    assert torch.equal(summed.vector[len(Slot) :], whole.vector[len(Slot) :])  # exact counts
    assert parts[1].vector[len(Slot) :].abs().sum() == 0
    got = diagnostics_from_stats(summed, CFG)
    expected = _oracle(old, roll, mask)
    for key in TAILS:
        assert getattr(got, key) == expected[key], key


def test_cost_is_two_histograms_in_the_one_sum():
    # 2 x 24 float64 counts = 384 bytes more than the 23 scalars
    assert NUM_SLOTS - len(Slot) == 2 * TAIL_BINS == 48
    assert STATS_BYTES == 8 * NUM_SLOTS == 568


def test_empty_batch_tails_are_zero():
    old, roll, mask = _healthy(1, b=2, t=4)
    diag = compute_diagnostics(old, roll, torch.zeros_like(mask), CFG)
    assert [getattr(diag, k) for k in TAILS] == [0.0, 0.0, 0.0]


def test_analyze_reports_the_tails(tmp_path):
    write_run(tmp_path / "logs", {s: {} for s in range(1, 4)})
    result = analyze_run(tmp_path / "logs", tmp_path / "out", plots=False)
    for row in result.rows:
        for key in TAILS:
            assert math.isfinite(row[f"ais/{key}"]) and row[f"ais/{key}"] >= 0
    assert any(row["ais/abs_log_ratio_peak"] > 0 for row in result.rows)


@pytest.mark.parametrize("value", [0.0, 2.0**-15, 2.0**-14, 0.3, 1.0, 255.9, 256.0, 1e6])
def test_bin_edges_against_the_oracle(value):
    old = torch.tensor([[value, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]])
    diag = compute_diagnostics(old, torch.zeros_like(old), mask, CFG)
    assert diag.abs_log_ratio_peak == oracles.tail_bin_edge(value)
    assert (
        value == 0
        or oracles.tail_bin_edge(value) <= value < 2 * max(oracles.tail_bin_edge(value), 2.0**-14)
        or value >= 256
    )
