# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The veRL / AReaL corrections in the one core loss (issue 17, item 1): seq_tis, seq_mis,
kl_rs, m2po and the batch_normalize / bypass switches, against the float64 plain-loop
oracles of ``tests/oracles.py`` (which import nothing from ``nemo_ais.core``)."""

from __future__ import annotations

import math

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig, validate_section
from nemo_ais.core import clipped_pg_loss, compute_diagnostics, correction_weights

F64 = dict(rtol=1e-12, atol=1e-15)
PG = {
    "default": PGLossConfig(),
    "dual_kl": PGLossConfig(ratio_clip_c=2.0, reference_policy_kl_penalty=0.1),
    "seq_level": PGLossConfig(token_level_loss=False),
}
# bands wide enough that the test data's sequence ratios fall on both sides of them
TBPO_WIDE = dict(tbpo={"clip_low": 0.05, "clip_high": 0.08, "neg_clip_low": 0.04, "neg_clip_high": 0.06})
CONFIGS = {
    "seq_tis": CorrectionConfig(mode="seq_tis", seq_weight_cap=1.5),
    "seq_mis": CorrectionConfig(mode="seq_mis", seq_mis={"min": 0.7, "max": 1.4}),
    "kl_rs_k1_mean": CorrectionConfig(mode="kl_rs", kl_rs={"estimator": "k1", "threshold": 0.05}),
    "kl_rs_k2_max": CorrectionConfig(mode="kl_rs", kl_rs={"estimator": "k2", "aggregation": "max", "threshold": 0.1}),
    "kl_rs_k3_veto": CorrectionConfig(mode="kl_rs", kl_rs={"threshold": 0.05, "veto_min_ratio": 0.7}),
    "m2po": CorrectionConfig(mode="m2po", m2po={"tau": 0.03}),
    "tis_bn": CorrectionConfig(mode="tis", batch_normalize=True),
    "seq_tis_bn": CorrectionConfig(mode="seq_tis", batch_normalize=True),
    "seq_mis_bn": CorrectionConfig(mode="seq_mis", batch_normalize=True),
    "ais_bn": CorrectionConfig(mode="ais", batch_normalize=True),
    "tis_bypass": CorrectionConfig(mode="tis", bypass=True),
    "tbpo": CorrectionConfig(mode="tbpo"),  # QaRL's bands: almost every sequence clipped
    "tbpo_wide": CorrectionConfig(mode="tbpo", seq_weight_cap=1.05, **TBPO_WIDE),
    "tbpo_bn_bypass": CorrectionConfig(mode="tbpo", batch_normalize=True, bypass=True, **TBPO_WIDE),
}
IS_AND_REJECTION = [CorrectionConfig(mode=m) for m in ("tis", "icepop", "seq_mask_geo", "ais", "seq_tis")] + [
    CorrectionConfig(mode="seq_mis"),
    CorrectionConfig(mode="kl_rs", kl_rs={"aggregation": "max", "veto_min_ratio": 0.5}),
    CorrectionConfig(mode="m2po", m2po={"tau": 1e-3}),
    CorrectionConfig(mode="seq_tis", batch_normalize=True),
    CorrectionConfig(mode="tis", batch_normalize=True),
    CorrectionConfig(mode="ais", batch_normalize=True),
]


def _batch(seed):
    b = oracles.random_batch(7, 9, scale=0.3, seed=seed)
    b["logp_theta"] = b["logp_old"] + 0.3 * torch.randn(7, 9, dtype=torch.float64)
    return b


def _core(b, cfg, pg):
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(
        theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], cfg, pg=pg,
        reference_logprobs=b["logp_ref"],
    )  # fmt: skip
    out.loss.backward()
    return out, theta.grad


def _oracle(b, cfg, pg):
    lists = {k: v.tolist() for k, v in b.items()}
    old = lists["logp_rollout"] if cfg.bypass else lists["logp_old"]
    diag = oracles.diagnostics(old, lists["logp_rollout"], lists["mask"], cfg)
    batch_value = {"ais": diag["alpha"], "m2po": diag["m2po_threshold"]}.get(cfg.mode)
    loss, grad = oracles.clipped_pg_loss(
        lists["logp_theta"], old, lists["logp_rollout"], lists["adv"], lists["mask"], cfg, pg,
        alpha=batch_value, logp_ref=lists["logp_ref"], w_norm=diag["w_norm"],
    )  # fmt: skip
    return loss, torch.tensor(grad, dtype=torch.float64), diag


@pytest.mark.parametrize("pg_name", list(PG))
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_grad_and_diagnostics_match_oracle(name, pg_name, seed):
    b, cfg = _batch(seed), CONFIGS[name]
    pg = oracles.pg_for(cfg, PG[pg_name])
    out, grad = _core(b, cfg, pg)
    loss, grad_ref, diag = _oracle(b, cfg, pg)
    assert out.loss.item() == pytest.approx(loss, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad, grad_ref, **F64)
    for key in ("w_norm", "m2po_threshold", "mode_frac_masked", "mode_frac_capped", "mode_ess"):
        got = out.metrics.get("ais/" + key)
        if got is not None:  # computed by the loss itself (modes with a batch value)
            assert got.item() == pytest.approx(diag[key], rel=1e-12, abs=1e-15), key
    old = b["logp_rollout"] if cfg.bypass else b["logp_old"]
    got = compute_diagnostics(old, b["logp_rollout"], b["mask"], cfg).as_dict()
    for key in ("w_norm", "m2po_threshold", "mode_frac_masked", "mode_frac_capped", "mode_ess"):
        assert got[key] == pytest.approx(diag[key], rel=1e-12, abs=1e-15), key


def test_modes_are_not_vacuous_on_the_test_data():
    b = _batch(0)
    lists = [b[k].tolist() for k in ("logp_old", "logp_rollout", "mask")]
    for name in ("seq_mis", "kl_rs_k1_mean", "kl_rs_k2_max", "kl_rs_k3_veto", "m2po"):
        d = oracles.diagnostics(*lists, CONFIGS[name])
        assert 0 < d["mode_frac_masked"] < 1, name
    assert 0 < oracles.diagnostics(*lists, CONFIGS["seq_tis"])["mode_frac_capped"] < 1
    assert oracles.diagnostics(*lists, CONFIGS["tis_bn"])["w_norm"] != 1
    assert 0 < oracles.diagnostics(*lists, CONFIGS["tbpo_wide"])["mode_frac_capped"] < 1
    # tbpo_wide: some sequences inside their band (gradient) and some outside (none)
    _, grad = _core(b, CONFIGS["tbpo_wide"], PG["seq_level"])
    moving = (grad != 0).any(dim=-1)
    assert 0 < moving.sum() < moving.numel()


def test_tbpo_hand_worked():
    # one sequence, 2 valid tokens, log r = theta - old = [0.01, 0.03]: s = e^0.02 = 1.020201;
    # mu = pi_old, so the mismatch weight is 1; a mean over sequences: c_t = 1 / (n_i N_seq) = 1 / 2
    old = torch.tensor([[-1.0, -2.0, -1.0]], dtype=torch.float64)
    theta = (old + torch.tensor([[0.01, 0.03, 5.0]], dtype=torch.float64)).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = math.exp(0.02)
    cfg = CorrectionConfig(mode="tbpo", **TBPO_WIDE)  # A >= 0 band [0.95, 1.08]: s inside
    out = clipped_pg_loss(theta, old, old, torch.tensor([2.0], dtype=torch.float64), mask, cfg, pg=PG["seq_level"])
    out.loss.backward()
    # loss = -A s = -2.040403; d loss / d theta_t = -A s / n = -1.020201 per valid token
    assert out.loss.item() == pytest.approx(-2 * s, rel=1e-15)
    assert theta.grad[0].tolist() == pytest.approx([-s, -s, 0.0], rel=1e-15)
    # A < 0 band [0.96, 1.06]; tighten it to [0.96, 1.01]: s = 1.0202 > 1.01 -> -A * 1.01 = 1.01,
    # no gradient (PPO's pessimistic max would keep -A s = 1.0202 and its gradient)
    tight = CorrectionConfig(mode="tbpo", tbpo={**TBPO_WIDE["tbpo"], "neg_clip_high": 0.01})
    theta.grad = None
    out = clipped_pg_loss(theta, old, old, torch.tensor([-1.0], dtype=torch.float64), mask, tight, pg=PG["seq_level"])
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.01, rel=1e-15)
    assert theta.grad.abs().sum().item() == 0.0


def test_tbpo_refuses_a_token_level_loss():
    # -mean_i[m_i f_i]: a token mean would weigh each sequence by its length (a 1- and a 9-token
    # sequence in their band, A = 1: -(1 + 9) s / 10 weighs the long one 9 times)
    b = _batch(0)
    with pytest.raises(ValueError, match=r"token_level_loss=True is invalid with .*mode='tbpo'.*mean over sequences"):
        _core(b, CorrectionConfig(mode="tbpo"), PGLossConfig())


def test_tbpo_refuses_disable_ppo_ratio():
    b = _batch(0)
    with pytest.raises(ValueError, match=r"disable_ppo_ratio=True is invalid with .*mode='tbpo'"):
        _core(b, CorrectionConfig(mode="tbpo"), PGLossConfig(disable_ppo_ratio=True))


@pytest.mark.parametrize("cfg", IS_AND_REJECTION, ids=lambda c: f"{c.mode}-bn{c.batch_normalize}")
@pytest.mark.parametrize("pg_name", list(PG))
def test_mu_equal_pi_old_gives_mode_none(cfg, pg_name):
    b = _batch(3)
    b["logp_rollout"] = b["logp_old"].clone()  # no mismatch at all
    out, grad = _core(b, cfg, PG[pg_name])
    ref, ref_grad = _core(b, CorrectionConfig(mode="none"), PG[pg_name])
    torch.testing.assert_close(out.loss, ref.loss, **F64)
    torch.testing.assert_close(grad, ref_grad, **F64)


def test_bypass_is_pi_old_equal_mu():
    b = _batch(4)
    pg = PG["dual_kl"]
    out, grad = _core(b, CorrectionConfig(mode="tis", bypass=True), pg)
    b2 = dict(b, logp_old=b["logp_rollout"])
    ref, ref_grad = _core(b2, CorrectionConfig(mode="none"), pg)
    assert torch.equal(out.loss, ref.loss) and torch.equal(grad, ref_grad)


def test_bypass_needs_no_prev_logprobs():
    b = _batch(5)
    cfg = CorrectionConfig(mode="tis", bypass=True, batch_normalize=True)
    out, grad = _core(b, cfg, PG["default"])
    theta = b["logp_theta"].clone().requires_grad_()
    got = clipped_pg_loss(theta, None, b["logp_rollout"], b["adv"], b["mask"], cfg)
    got.loss.backward()
    assert torch.equal(got.loss, out.loss) and torch.equal(theta.grad, grad)
    d = compute_diagnostics(None, b["logp_rollout"], b["mask"], cfg)
    assert d.w_norm == 1.0 and d.severity == 0.0  # rho = 1 exactly


def test_kl_rs_hand_worked():
    # l = log pi_old - log mu per token; 2 valid tokens per row (the third is masked)
    ell = torch.tensor([[0.1, -0.1, 9.0], [0.2, 0.2, 9.0], [0.0, -0.5, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 0], [1, 1, 0]])
    zeros = torch.zeros_like(ell)
    # k1 = -l, mean: row 0 |(-0.1 + 0.1) / 2| = 0; row 1 |-0.2| = 0.2; row 2 |0.5 / 2| = 0.25
    k1 = CorrectionConfig(mode="kl_rs", kl_rs={"estimator": "k1", "threshold": 0.21})
    assert correction_weights(ell, zeros, mask, k1)[:, 0].tolist() == [1.0, 1.0, 0.0]
    # k2 = l^2 / 2, max: row 0 0.005; row 1 0.02; row 2 0.125
    k2 = CorrectionConfig(mode="kl_rs", kl_rs={"estimator": "k2", "aggregation": "max", "threshold": 0.01})
    assert correction_weights(ell, zeros, mask, k2)[:, 0].tolist() == [1.0, 0.0, 0.0]
    # k3 = e^l - 1 - l, mean: row 2 (0 + e^-0.5 - 1 + 0.5) / 2 = 0.0532653; veto rho < 0.7:
    # row 2 has rho = e^-0.5 = 0.6065 < 0.7, vetoed even under a threshold it passes
    k3 = CorrectionConfig(mode="kl_rs", kl_rs={"threshold": 0.06})
    assert correction_weights(ell, zeros, mask, k3)[:, 0].tolist() == [1.0, 1.0, 1.0]
    veto = CorrectionConfig(mode="kl_rs", kl_rs={"threshold": 0.06, "veto_min_ratio": 0.7})
    w = correction_weights(ell, zeros, mask, veto)
    assert w[:, 0].tolist() == [1.0, 1.0, 0.0] and w[:, 2].tolist() == [0.0] * 3
    d = compute_diagnostics(ell, zeros, mask, veto)
    assert d.mode_frac_masked == pytest.approx(1 / 3) and d.mode_ess == pytest.approx(2 / 3)


def test_seq_tis_weight_is_capped_product_in_log_space():
    # S = sum l: 0.3 -> exp(0.3); 2.0 -> capped at 2; -1e4 -> exp(-L) (no underflow to NaN)
    ell = torch.tensor([[0.1, 0.2, 0.0], [1.0, 1.0, 0.0], [-5e3, -5e3, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 0], [1, 1, 0]])
    w = correction_weights(ell, torch.zeros_like(ell), mask, CorrectionConfig(mode="seq_tis"))
    want = [math.exp(0.1 + 0.2), 2.0, math.exp(-20.0)]
    for i in range(3):
        assert w[i, :2].tolist() == pytest.approx([want[i]] * 2, rel=1e-15) and w[i, 2] == 0


def test_m2po_bins_mask_a_superset_of_the_exact_rule_and_bound_the_moment():
    g = torch.Generator().manual_seed(7)
    # mean l^2 of each batch is ~0.13 (0.3^2 plus the four outliers): every tau masks
    for tau in (0.01, 0.05, 0.1):
        ell = 0.3 * torch.randn(16, 32, generator=g, dtype=torch.float64)
        ell[0, :4] = torch.tensor([3.0, -2.5, 2.0, 1.5], dtype=torch.float64)
        mask = torch.ones(16, 32, dtype=torch.float64)
        cfg = CorrectionConfig(mode="m2po", m2po={"tau": tau})
        d = compute_diagnostics(ell, torch.zeros_like(ell), mask, cfg)
        w = correction_weights(ell, torch.zeros_like(ell), mask, cfg, d.m2po_threshold)
        q = ell.square().reshape(-1).tolist()
        exact = oracles.m2po_exact_mask(q, tau)
        ours = (w.reshape(-1) == 0).tolist()
        assert all(o for o, e in zip(ours, exact, strict=True) if e)  # superset
        kept = [x for x, o in zip(q, ours, strict=True) if not o]
        assert math.fsum(kept) / len(kept) <= tau
        assert d.mode_frac_masked == pytest.approx(sum(ours) / len(ours), rel=1e-15)
        assert sum(ours) >= sum(exact) > 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "seq_tis", "seq_weight_cap": 1.0}, "loss_fn.ais.seq_weight_cap=1.0 is invalid"),
        ({"mode": "kl_rs", "kl_rs": {"threshold": 0}}, "loss_fn.ais.kl_rs.threshold=0 is invalid"),
        ({"kl_rs": {"estimator": "k4"}}, "loss_fn.ais.kl_rs.estimator='k4' is invalid"),
        ({"kl_rs": {"aggregation": "sum"}}, "loss_fn.ais.kl_rs.aggregation='sum' is invalid"),
        ({"kl_rs": {"veto_min_ratio": 1.5}}, "loss_fn.ais.kl_rs.veto_min_ratio=1.5 is invalid"),
        ({"m2po": {"tau": -1.0}}, "loss_fn.ais.m2po.tau=-1.0 is invalid"),
        ({"seq_mis": {"min": 2.5}}, "loss_fn.ais.seq_mis.min=2.5 must be < max=2.0"),
        ({"mode": "kl_rs", "batch_normalize": True}, "loss_fn.ais.batch_normalize=True is invalid"),
        ({"bypass": "yes"}, "loss_fn.ais.bypass='yes' is invalid"),
        ({"tbpo": {"clip_low": 1.0}}, "loss_fn.ais.tbpo.clip_low=1.0 is invalid"),
        ({"tbpo": {"neg_clip_high": 0.0}}, "loss_fn.ais.tbpo.neg_clip_high=0.0 is invalid"),
        ({"rs_threshold": 0.02}, "loss_fn.ais.rs_threshold moved: use loss_fn.ais.kl_rs.threshold"),
        ({"tbpo_clip_low": 0.1}, "loss_fn.ais.tbpo_clip_low moved: use loss_fn.ais.tbpo.clip_low"),
    ],
)
def test_field_named_errors(data, message):
    with pytest.raises(ValueError) as err:
        validate_section(CorrectionConfig, data, "loss_fn.ais")
    assert message in str(err.value)


@pytest.mark.parametrize("clamp", [20.0, 1.0])  # 1.0 < log C: the clamp binds below the cap
@pytest.mark.parametrize("mode", ["tis", "ais"])
def test_token_statistics_describe_the_applied_weights(mode, clamp):
    # tokens beyond -L, between L and log C, and far above the cap: the diagnostics' w_mean,
    # CV^2 and frac_capped are those of min(rho, C) as applied, so batch_normalize averages
    # the weights to 1 (ais normalised by (1 - alpha) + alpha w_mean was 1.19 at L = 1)
    mixer = {"mixer": "constant", "constant_alpha": 0.75} if mode == "ais" else {}
    cfg = CorrectionConfig(mode=mode, weight_cap=5.0, log_ratio_clamp=clamp, batch_normalize=True, **mixer)
    log_rho = torch.tensor([[-30.0, -1.5, 0.3, 1.2, 1.5, 30.0], [0.9, -0.2, 1.4, 0.0, 2.0, -25.0]])
    gen = torch.full_like(log_rho, -2.0, dtype=torch.float64)
    old, mask = gen + log_rho, torch.ones_like(log_rho)
    d = compute_diagnostics(old, gen, mask, cfg)
    w = [min(math.exp(ell), 5.0) for ell in log_rho.reshape(-1).tolist()]
    mean = math.fsum(w) / len(w)
    assert d.w_mean == pytest.approx(mean, rel=1e-14)
    assert d.frac_capped == sum(x == 5.0 for x in w) / len(w) == 2 / 12
    assert d.cv2 == pytest.approx(math.fsum((x - mean) ** 2 for x in w) / len(w) / mean**2, rel=1e-12)
    w_hat = correction_weights(old, gen, mask, cfg, d.alpha if mode == "ais" else None)
    assert (w_hat / d.w_norm).mean().item() == pytest.approx(1.0, rel=1e-14)
