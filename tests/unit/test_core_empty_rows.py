# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Rows without a valid token (NeMo-RL's ``sample_mask = 0`` rows) and all-empty ranks, in
every mode, against the float64 plain-loop oracles of ``tests/oracles.py`` (issue 27, item 11).

``oracles.random_batch`` always keeps the first mask column, so no other test gives the
sequence-level modes (``seq_tis``, ``seq_mis``, ``tbpo``) an empty row: an empty row must not
count as a sequence in their statistics (``ais/w_norm``, ``ais/mode_*``, ``ais/n_seq``), in
the loss's sequence normaliser, or anywhere else.
"""

from __future__ import annotations

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import AISStats, clipped_pg_loss, compute_diagnostics, compute_statistics, diagnostics_from_stats

F64 = dict(rtol=1e-12, atol=1e-15)
EMPTY_ROWS = (1, 4)  # of 7
PG = {
    "token_level": PGLossConfig(),
    "seq_level": PGLossConfig(token_level_loss=False),
    "dual_kl": PGLossConfig(ratio_clip_c=2.0, reference_policy_kl_penalty=0.1),
}
TBPO_WIDE = dict(tbpo={"clip_low": 0.05, "clip_high": 0.08, "neg_clip_low": 0.04, "neg_clip_high": 0.06})
CONFIGS = {
    "none": CorrectionConfig(mode="none"),
    "tis": CorrectionConfig(mode="tis"),
    "icepop": CorrectionConfig(mode="icepop"),
    "seq_mask_geo": CorrectionConfig(mode="seq_mask_geo"),
    "ais": CorrectionConfig(mode="ais"),
    "seq_tis": CorrectionConfig(mode="seq_tis", seq_weight_cap=1.5),
    "seq_mis": CorrectionConfig(mode="seq_mis", seq_mis={"min": 0.7, "max": 1.4}),
    "kl_rs": CorrectionConfig(mode="kl_rs", kl_rs={"threshold": 0.05, "veto_min_ratio": 0.7}),
    "m2po": CorrectionConfig(mode="m2po", m2po={"tau": 0.03}),
    "tbpo": CorrectionConfig(mode="tbpo", seq_weight_cap=1.05, **TBPO_WIDE),
    "seq_tis_bn": CorrectionConfig(mode="seq_tis", batch_normalize=True),
    "seq_mis_bn": CorrectionConfig(mode="seq_mis", batch_normalize=True),
    "tbpo_bn": CorrectionConfig(mode="tbpo", batch_normalize=True, **TBPO_WIDE),
    "tis_bn": CorrectionConfig(mode="tis", batch_normalize=True),
    "ais_bn": CorrectionConfig(mode="ais", batch_normalize=True),
}
DIAG_KEYS = (
    "alpha",
    "n_seq",
    "n_tok",
    "ess_seq",
    "severity",
    "cv2",
    "w_norm",
    "m2po_threshold",
    "mode_frac_masked",
    "mode_frac_capped",
    "mode_ess",
)


def _batch(seed, empty_rows=EMPTY_ROWS):
    """7 x 9 float64 batch whose ``empty_rows`` have no valid token (rollout -inf there)."""
    b = oracles.random_batch(7, 9, scale=0.3, seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    b["logp_theta"] = b["logp_old"] + 0.3 * torch.randn(7, 9, generator=g, dtype=torch.float64)
    b["mask"][list(empty_rows)] = 0
    b["logp_rollout"] = torch.where(b["mask"] == 1, b["logp_rollout"], -torch.inf)
    return b


def _oracle(b, cfg, pg, n_tok=None, n_seq=None):
    lists = {k: v.tolist() for k, v in b.items()}
    diag = oracles.diagnostics(lists["logp_old"], lists["logp_rollout"], lists["mask"], cfg)
    batch_value = {"ais": diag["alpha"], "m2po": diag["m2po_threshold"]}.get(cfg.mode)
    loss, grad = oracles.clipped_pg_loss(
        lists["logp_theta"], lists["logp_old"], lists["logp_rollout"], lists["adv"],
        lists["mask"], cfg, pg, alpha=batch_value, logp_ref=lists["logp_ref"],
        w_norm=diag["w_norm"], n_tok=n_tok, n_seq=n_seq,
    )  # fmt: skip
    return loss, torch.tensor(grad, dtype=torch.float64), diag


def _core(b, cfg, pg, rows=slice(None), diagnostics=None, n_tok=None, n_seq=None):
    theta = b["logp_theta"][rows].clone().requires_grad_()
    out = clipped_pg_loss(
        theta, b["logp_old"][rows], b["logp_rollout"][rows], b["adv"][rows], b["mask"][rows],
        cfg, pg=pg, reference_logprobs=b["logp_ref"][rows], diagnostics=diagnostics,
        global_valid_tokens=n_tok, global_valid_seqs=n_seq,
    )  # fmt: skip
    out.loss.backward()
    return out, theta.grad


@pytest.mark.parametrize("pg_name", list(PG))
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_empty_rows_match_oracle(name, pg_name, seed):
    b, cfg = _batch(seed), CONFIGS[name]
    pg = oracles.pg_for(cfg, PG[pg_name])
    out, grad = _core(b, cfg, pg)
    loss, grad_ref, diag = _oracle(b, cfg, pg)
    assert out.loss.item() == pytest.approx(loss, **{"rel": 1e-12, "abs": 1e-15})
    torch.testing.assert_close(grad, grad_ref, **F64)
    assert grad[list(EMPTY_ROWS)].abs().sum() == 0  # no gradient reaches an empty row
    got = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg).as_dict()
    assert got["n_seq"] == 7 - len(EMPTY_ROWS)
    for key in DIAG_KEYS:
        assert got[key] == pytest.approx(diag[key], rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize("name", ["seq_tis_bn", "seq_mis_bn", "tbpo_bn"])
def test_empty_rows_are_not_sequences_of_the_batch_mean(name):
    # Not vacuous: counting the empty rows (w_i = 0) would give w_norm * 5/7, which the
    # oracle (mean over the 5 rows that have a token) rules out.
    b, cfg = _batch(0), CONFIGS[name]
    w_norm = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg).w_norm
    lists = [b[k].tolist() for k in ("logp_old", "logp_rollout", "mask")]
    expected = oracles.diagnostics(*lists, cfg)["w_norm"]
    assert w_norm == pytest.approx(expected, rel=1e-12)
    assert abs(expected * 5 / 7 - w_norm) > 0.1


def _ranks(b):
    """Three 'ranks': rows 0-2, the all-empty rows 3-4 (mask zeroed), and a rank with B = 0."""
    b = {k: v.clone() for k, v in b.items()}
    b["mask"][3:5] = 0
    b["logp_rollout"] = torch.where(b["mask"] == 1, b["logp_rollout"], -torch.inf)
    return b, (slice(0, 3), slice(3, 5), slice(5, 7), slice(7, 7))


@pytest.mark.parametrize("pg_name", ["token_level", "seq_level"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_all_empty_ranks_match_the_oracle_of_the_whole_batch(name, pg_name):
    b, ranks = _ranks(_batch(2, empty_rows=(6,)))
    cfg = CONFIGS[name]
    pg = oracles.pg_for(cfg, PG[pg_name])
    parts = [compute_statistics(b["logp_old"][r], b["logp_rollout"][r], b["mask"][r], cfg) for r in ranks]
    assert parts[1].vector.abs().sum() == 0 and parts[3].vector.abs().sum() == 0
    diagnostics = diagnostics_from_stats(AISStats(sum(p.vector for p in parts)), cfg)
    mask = b["mask"]
    n_tok, n_seq = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    loss, grad_ref, diag = _oracle(b, cfg, pg, n_tok=n_tok, n_seq=n_seq)
    for key in DIAG_KEYS:
        assert getattr(diagnostics, key) == pytest.approx(diag[key], rel=1e-12, abs=1e-15), key
    total, grads = 0.0, []
    for r in ranks:
        out, grad = _core(b, cfg, pg, r, diagnostics, torch.tensor(n_tok), torch.tensor(n_seq))
        total += out.loss.item()
        grads.append(grad)
    assert total == pytest.approx(loss, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(torch.cat(grads), grad_ref, **F64)
    assert grads[1].abs().sum() == 0 and grads[3].numel() == 0
