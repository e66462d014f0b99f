# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Metrics are summable (micro-batches x ranks), match METRICS and docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import METRICS, clipped_pg_loss, compute_diagnostics, metric_normalizations
from nemo_ais.core.metrics import AIS_PREFIX

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _call(b, rows, cfg, pg, diag, n_tok, n_seq):
    theta = b["logp_theta"][rows].clone().requires_grad_()
    return clipped_pg_loss(
        theta,
        b["logp_old"][rows],
        b["logp_rollout"][rows],
        b["adv"][rows],
        b["mask"][rows],
        cfg,
        pg=pg,
        reference_logprobs=b["logp_ref"][rows],
        diagnostics=diag,
        global_valid_tokens=n_tok,
        global_valid_seqs=n_seq,
    )


@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize("mode", ["ais", "tis"])
def test_microbatch_sums_equal_whole_batch(mode, token_level):
    b = oracles.random_batch(9, 6, scale=0.1, seed=31)
    b["mask"][4:6] = 0  # one micro-batch with no valid token
    cfg = CorrectionConfig(mode=mode)
    pg = PGLossConfig(token_level_loss=token_level, reference_policy_kl_penalty=0.05)
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    n_tok = b["mask"].sum()
    n_seq = (b["mask"].sum(-1) > 0).sum().to(torch.float64)
    whole = _call(b, slice(None), cfg, pg, diag, n_tok, n_seq).metrics
    parts = [_call(b, s, cfg, pg, diag, n_tok, n_seq).metrics for s in (slice(0, 4), slice(4, 6), slice(6, 9))]
    assert set(whole) == {m.name for m in METRICS}
    for key, value in whole.items():
        total = sum(p[key] for p in parts)
        torch.testing.assert_close(total, value, rtol=1e-12, atol=1e-15, msg=key)
    for field, value in diag.as_dict().items():
        assert whole[AIS_PREFIX + field].item() == pytest.approx(value, rel=1e-12, abs=1e-15)


def test_metrics_are_detached_zero_dim_tensors():
    b = oracles.random_batch(3, 5, dtype=torch.float32)
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], CorrectionConfig())
    for name, value in out.metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, name
        assert not value.requires_grad, name


def test_keys_without_diagnostics_are_the_non_ais_rows():
    b = oracles.random_batch(3, 5)
    out = clipped_pg_loss(
        b["logp_theta"], b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], CorrectionConfig(mode="tis")
    )
    assert set(out.metrics) == {m.name for m in METRICS if not m.name.startswith(AIS_PREFIX)}


def test_token_mult_prob_error_is_nemo_rl_formula():
    # NeMo-RL: masked_mean(exp(|gen - prev| * mask), mask), mean over valid tokens.
    b = oracles.random_batch(4, 7, scale=0.2, seed=2)
    m = b["mask"]
    gen = torch.where(m == 1, b["logp_rollout"], 0)
    expected = (torch.exp((gen - b["logp_old"]).abs() * m) * m).sum() / m.sum()
    out = clipped_pg_loss(b["logp_theta"], b["logp_old"], b["logp_rollout"], b["adv"], m, CorrectionConfig())
    torch.testing.assert_close(out.metrics["ais/token_mult_prob_error"], expected, rtol=1e-12, atol=0)


def test_globally_empty_batch_metrics_flag_it():
    b = oracles.random_batch(4, 5, p_mask=1.0)
    cfg = CorrectionConfig()
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    parts = [_call(b, s, cfg, PGLossConfig(), diag, 0, 0).metrics for s in (slice(0, 2), slice(2, 4))]
    assert sum(p["ais/empty_batch"] for p in parts).item() == 2.0  # >= 1 flags the batch
    for key in parts[0]:
        if key != "ais/empty_batch":
            assert all(p[key].item() == 0.0 for p in parts), key


def test_metric_normalizations_cover_the_table():
    tok = metric_normalizations(token_level_loss=True)
    seq = metric_normalizations(token_level_loss=False)
    assert list(tok) == [m.name for m in METRICS]
    assert tok["loss"] == "tokens" and seq["loss"] == "sequences"
    assert seq["kl_penalty"] == "sequences" and tok["num_valid_samples"] == "none"
    assert all(tok[m.name] == "tokens" for m in METRICS if m.name.startswith(AIS_PREFIX))
    assert not any(k.endswith(("_min", "_max")) for k in tok)  # min/max names are NeMo-RL's


def test_docs_mirror_the_metrics_table():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z_/0-9]+)`", cells[0]) if len(cells) >= 4 else None
        if match:
            rows[match.group(1)] = cells
    assert set(rows) == {m.name for m in METRICS}
    for spec in METRICS:
        assert rows[spec.name][2] == spec.normalizer, spec.name
