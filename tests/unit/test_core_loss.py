# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""clipped_pg_loss: values and gradients against the float64 oracle, exact identities, by hand."""

from __future__ import annotations

import dataclasses
import math

import oracles
import pytest
import torch
from host_syncs import count_host_syncs

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import AISDiagnostics, clipped_pg_loss, compute_diagnostics

F64 = dict(rtol=1e-12, atol=1e-15)

PG_CASES = {
    "default": PGLossConfig(),
    "asym_dual": PGLossConfig(ratio_clip_min=0.05, ratio_clip_max=0.12, ratio_clip_c=1.5),
    "seq_level": PGLossConfig(token_level_loss=False, ratio_clip_c=3.0),
    "kl_k1": PGLossConfig(reference_policy_kl_penalty=0.3, reference_policy_kl_type="k1"),
    "kl_k2_clamped": PGLossConfig(
        reference_policy_kl_penalty=0.2,
        reference_policy_kl_type="k2",
        kl_input_clamp_value=0.25,
        kl_output_clamp_value=0.02,
    ),
    "kl_k3_seq": PGLossConfig(
        reference_policy_kl_penalty=0.1,
        reference_policy_kl_type="k3",
        kl_input_clamp_value=0.3,
        kl_output_clamp_value=0.03,
        token_level_loss=False,
    ),
    "kl_no_clamps": PGLossConfig(
        reference_policy_kl_penalty=0.1, kl_input_clamp_value=None, kl_output_clamp_value=None
    ),
    "reinforce": PGLossConfig(disable_ppo_ratio=True),
}
MODES = ["none", "tis", "icepop", "seq_mask_geo", "ais"]


def _diag(alpha: float) -> AISDiagnostics:
    fields = {f.name: 0.0 for f in dataclasses.fields(AISDiagnostics) if f.name != "mode_values"}
    return AISDiagnostics(**{**fields, "alpha": alpha, "alpha_raw": alpha})


def _run(b, cfg, pg, alpha=None, **kw):
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(
        theta,
        b["logp_old"],
        b["logp_rollout"],
        b["adv"],
        b["mask"],
        cfg,
        pg=pg,
        reference_logprobs=b["logp_ref"],
        diagnostics=None if alpha is None else _diag(alpha),
        **kw,
    )
    out.loss.backward()
    return out, theta.grad


def _oracle(b, cfg, pg, alpha=None, **kw):
    loss, grad = oracles.clipped_pg_loss(
        b["logp_theta"].tolist(),
        b["logp_old"].tolist(),
        b["logp_rollout"].tolist(),
        b["adv"].tolist(),
        b["mask"].tolist(),
        cfg,
        pg,
        alpha=alpha,
        logp_ref=b["logp_ref"].tolist(),
        **kw,
    )
    return loss, torch.tensor(grad, dtype=torch.float64)


@pytest.mark.parametrize("pg_name", list(PG_CASES))
@pytest.mark.parametrize("mode", MODES)
def test_loss_and_grad_match_oracle(mode, pg_name):
    pg = PG_CASES[pg_name]
    cfg = CorrectionConfig(mode=mode, weight_cap=1.1, icepop={"min": 0.93, "max": 1.06})
    b = oracles.random_batch(5, 9, scale=0.05, seed=len(pg_name))
    b["logp_theta"][0, 0] = b["logp_old"][0, 0] + 25.0  # beyond log_ratio_clamp = 20
    alpha = 0.4 if mode == "ais" else None
    out, grad = _run(b, cfg, pg, alpha)
    loss, grad_ref = _oracle(b, cfg, pg, alpha)
    assert out.loss.dtype == torch.float64
    assert out.loss.item() == pytest.approx(loss, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad, grad_ref, **F64)


def test_alpha_zero_is_mode_none_exactly():
    b = oracles.random_batch(6, 10, scale=0.2, seed=1, dtype=torch.float32)
    pg = PGLossConfig(ratio_clip_c=2.0, reference_policy_kl_penalty=0.05)
    out_none, g_none = _run(b, CorrectionConfig(mode="none"), pg)
    out_ais, g_ais = _run(b, CorrectionConfig(mode="ais"), pg, alpha=0.0)
    assert torch.equal(out_ais.loss, out_none.loss)
    assert torch.equal(g_ais, g_none)


def test_alpha_one_is_tis_exactly():
    b = oracles.random_batch(6, 10, scale=0.5, seed=2, dtype=torch.float32)
    pg = PGLossConfig(ratio_clip_c=2.0)
    out_tis, g_tis = _run(b, CorrectionConfig(mode="tis", weight_cap=1.5), pg)
    cfg = CorrectionConfig(mode="ais", weight_cap=1.5, mixer="constant", constant_alpha=1.0)
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], cfg, pg=pg)
    out.loss.backward()
    assert out.metrics["ais/alpha"].item() == 1.0
    assert torch.equal(out.loss, out_tis.loss)
    assert torch.equal(theta.grad, g_tis)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.77, 1.0])
def test_ais_gradient_interpolates_none_and_tis(alpha):
    b = oracles.random_batch(5, 12, scale=0.4, seed=4)
    pg = PGLossConfig(ratio_clip_c=3.0, token_level_loss=False)
    _, g_none = _run(b, CorrectionConfig(mode="none"), pg)
    _, g_tis = _run(b, CorrectionConfig(mode="tis"), pg)
    _, g_ais = _run(b, CorrectionConfig(mode="ais"), pg, alpha=alpha)
    torch.testing.assert_close(g_ais, (1 - alpha) * g_none + alpha * g_tis, **F64)


def test_token_vs_sequence_normalisation_by_hand():
    # theta = old (r = 1, inside the clip): clip_loss_it = -A_i.
    # seq 0: 1 valid token, A = 1; seq 1: 3 valid tokens, A = -2.
    # token level:    (-1 * 1 + 2 * 3) / 4 = 5 / 4
    # sequence level: (-1 / 1 * 1 + 2 * 3 / 3) / 2 = (-1 + 2) / 2 = 1 / 2
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    cfg = CorrectionConfig(mode="none")
    tok = clipped_pg_loss(logp, logp, logp, adv, mask, cfg)
    seq = clipped_pg_loss(logp, logp, logp, adv, mask, cfg, pg=PGLossConfig(token_level_loss=False))
    assert tok.loss.item() == pytest.approx(5 / 4, rel=1e-15)
    assert seq.loss.item() == pytest.approx(1 / 2, rel=1e-15)
    # global normalisers: N_tok = 8 halves the token loss; N_seq = 4 halves the sequence loss
    assert clipped_pg_loss(logp, logp, logp, adv, mask, cfg, global_valid_tokens=8).loss.item() == pytest.approx(5 / 8)
    seq4 = clipped_pg_loss(
        logp, logp, logp, adv, mask, cfg, pg=PGLossConfig(token_level_loss=False), global_valid_seqs=4
    )
    assert seq4.loss.item() == pytest.approx(1 / 4)


def test_dual_clip_by_hand():
    # A = -1, r = 5: -A r = 5, -A clip(r, 0.8, 1.2) = 1.2 -> max = 5 (pessimistic);
    # dual clip c = 3: min(5, -A c = 3) = 3, gradient 0. Without dual clip: 5, grad -A r = 5.
    theta = torch.tensor([[math.log(5.0) - 1]], dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 1), -1.0, dtype=torch.float64)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    cfg = CorrectionConfig(mode="none")
    one = torch.ones(1, 1)
    out = clipped_pg_loss(theta, old, old, adv, one, cfg, pg=PGLossConfig(ratio_clip_c=3.0))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0) and theta.grad.item() == 0.0
    theta.grad = None
    out = clipped_pg_loss(theta, old, old, adv, one, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(5.0) and theta.grad.item() == pytest.approx(5.0)


def test_kl_term_is_not_importance_weighted():
    # NeMo-RL v0.7.0 adds the KL term unweighted; only the actor loss carries w_hat.
    b = oracles.random_batch(4, 6, scale=0.6, seed=7)
    pg_kl = PGLossConfig(reference_policy_kl_penalty=0.5)
    for mode in MODES:
        cfg = CorrectionConfig(mode=mode)
        alpha = 0.6 if mode == "ais" else None
        with_kl, _ = _run(b, cfg, pg_kl, alpha)
        without, _ = _run(b, cfg, PGLossConfig(), alpha)
        none_kl, _ = _run(b, CorrectionConfig(mode="none"), pg_kl)
        none_plain, _ = _run(b, CorrectionConfig(mode="none"), PGLossConfig())
        kl_mode = with_kl.loss - without.loss
        torch.testing.assert_close(kl_mode, none_kl.loss - none_plain.loss, rtol=1e-12, atol=1e-15)
        assert with_kl.metrics["kl_penalty"].item() == pytest.approx(kl_mode.item() / 0.5, rel=1e-10)


def test_advantages_per_sequence_broadcast():
    b = oracles.random_batch(4, 6, seed=3)
    cfg = CorrectionConfig(mode="tis")
    out_b, g_b = _run(b, cfg, PGLossConfig())
    b2 = dict(b, adv=b["adv"].unsqueeze(-1).expand(4, 6).contiguous())
    out_bt, g_bt = _run(b2, cfg, PGLossConfig())
    assert torch.equal(out_b.loss, out_bt.loss) and torch.equal(g_b, g_bt)


def test_microbatches_with_global_normaliser_sum_to_whole_batch():
    b = oracles.random_batch(8, 7, scale=0.1, seed=9)
    cfg = CorrectionConfig(mode="ais")
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    n_tok = b["mask"].sum()
    theta = b["logp_theta"].clone().requires_grad_()
    whole = clipped_pg_loss(theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], cfg, diagnostics=diag)
    whole.loss.backward()
    g_whole, theta.grad = theta.grad.clone(), None
    total = 0
    for s in (slice(0, 3), slice(3, 8)):
        part = clipped_pg_loss(
            theta[s],
            b["logp_old"][s],
            b["logp_rollout"][s],
            b["adv"][s],
            b["mask"][s],
            cfg,
            diagnostics=diag,
            global_valid_tokens=n_tok,
        )
        part.loss.backward()
        total = total + part.loss.detach()
    torch.testing.assert_close(total, whole.loss.detach(), **F64)
    torch.testing.assert_close(theta.grad, g_whole, **F64)


def test_ais_without_diagnostics_computes_them():
    b = oracles.random_batch(5, 8, scale=0.05, seed=11)
    cfg = CorrectionConfig(mode="ais")
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    out_auto, g_auto = _run(b, cfg, PGLossConfig())
    out_given, g_given = _run(b, cfg, PGLossConfig(), alpha=diag.alpha)
    assert out_auto.metrics["ais/alpha"].item() == pytest.approx(diag.alpha, rel=1e-15)
    assert torch.equal(out_auto.loss, out_given.loss) and torch.equal(g_auto, g_given)


@pytest.mark.parametrize("mode", MODES)
def test_bf16_inputs_close_to_fp32(mode):
    b32 = oracles.random_batch(6, 16, scale=0.05, seed=12, dtype=torch.float32)
    b16 = {k: (v.to(torch.bfloat16) if k != "mask" else v) for k, v in b32.items()}
    b32r = {k: v.to(torch.float32) for k, v in b16.items()}  # same bf16 values, fp32 storage
    cfg = CorrectionConfig(mode=mode, seq_mask_geo={"min": 0.9, "max": 1.1})
    pg = PGLossConfig(reference_policy_kl_penalty=0.1)
    alpha = 0.5 if mode == "ais" else None
    out16, g16 = _run(b16, cfg, pg, alpha)
    out32, g32 = _run(b32r, cfg, pg, alpha)
    assert out16.loss.dtype == torch.float32 and g16.dtype == torch.bfloat16
    assert torch.isfinite(out16.loss) and torch.isfinite(g16.float()).all()
    torch.testing.assert_close(out16.loss, out32.loss, rtol=1e-6, atol=1e-7)  # computed in fp32
    torch.testing.assert_close(g16.float(), g32, rtol=1e-2, atol=1e-4)  # grad stored in bf16


def test_one_host_sync_per_call(monkeypatch):
    b = oracles.random_batch(4, 6, seed=13, dtype=torch.float32)
    cfg = CorrectionConfig(mode="ais")
    pg = PGLossConfig(reference_policy_kl_penalty=0.1, ratio_clip_c=3.0)
    calls = count_host_syncs(monkeypatch)
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    assert calls == ["tolist"]  # the reduced statistics, read once per global batch
    calls.clear()
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(
        theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], cfg, pg=pg,
        reference_logprobs=b["logp_ref"], diagnostics=diag,
    )  # fmt: skip
    out.loss.backward()
    assert calls == ["tolist"]  # the fused value check of the micro-batch
