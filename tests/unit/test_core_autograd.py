# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Autograd's gradient of the core loss against the hand-derived one (issue 17, item 6).

The core writes the surrogate CleanRL-style and lets autograd differentiate it; the
derivation it used to carry lives in ``tests/hand_gradient.py`` (vectorised) and
``tests/oracles.py`` (plain loops). All three agree to 1e-12 in float64, also at every
kink hit exactly: a ratio on a clip bound, a log-ratio on its clamp, a dual-clip tie, a
KL input or output on its clamp.
"""

from __future__ import annotations

import math

import hand_gradient
import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import clipped_pg_loss

F64 = dict(rtol=1e-12, atol=1e-15)
MODES = ["none", "tis", "icepop", "seq_mask_geo"]


def _autograd(b, cfg, pg):
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(
        theta, b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], cfg, pg=pg,
        reference_logprobs=b["logp_ref"],
    )  # fmt: skip
    out.loss.backward()
    return out.loss.detach(), theta.grad


def _by_hand(b, cfg, pg):
    w = torch.tensor(
        oracles.weights(cfg.mode, b["logp_old"].tolist(), b["logp_rollout"].tolist(), b["mask"].tolist(), cfg),
        dtype=torch.float64,
    )
    return hand_gradient.loss_and_grad(
        b["logp_theta"], b["logp_old"], b["adv"], b["mask"], w, pg, cfg.log_ratio_clamp,
        ref=b["logp_ref"],
    )  # fmt: skip


def _plain_loops(b, cfg, pg):
    loss, grad = oracles.clipped_pg_loss(
        *(b[k].tolist() for k in ("logp_theta", "logp_old", "logp_rollout", "adv", "mask")),
        cfg, pg, logp_ref=b["logp_ref"].tolist(),
    )  # fmt: skip
    return loss, torch.tensor(grad, dtype=torch.float64)


def _check_all_three(b, cfg, pg):
    loss, grad = _autograd(b, cfg, pg)
    hand_loss, hand = _by_hand(b, cfg, pg)
    loop_loss, loop = _plain_loops(b, cfg, pg)
    torch.testing.assert_close(grad, hand, **F64)
    torch.testing.assert_close(grad, loop, **F64)
    assert loss.item() == pytest.approx(hand_loss.item(), rel=1e-12, abs=1e-15)
    assert loss.item() == pytest.approx(loop_loss, rel=1e-12, abs=1e-15)


PG = {
    "default": PGLossConfig(),
    "dual_kl_k3": PGLossConfig(ratio_clip_c=2.5, reference_policy_kl_penalty=0.2),
    "seq_kl_k2": PGLossConfig(token_level_loss=False, reference_policy_kl_penalty=0.3, reference_policy_kl_type="k2"),
    "kl_k1_unclamped": PGLossConfig(
        reference_policy_kl_penalty=0.1,
        reference_policy_kl_type="k1",
        kl_input_clamp_value=None,
        kl_output_clamp_value=None,
    ),
    "reinforce": PGLossConfig(disable_ppo_ratio=True, reference_policy_kl_penalty=0.1),
}


@pytest.mark.parametrize("pg_name", list(PG))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_autograd_equals_hand_gradient(mode, pg_name, seed):
    b = oracles.random_batch(6, 11, scale=0.3, seed=seed)
    b["logp_theta"] = b["logp_old"] + 0.4 * torch.randn(6, 11, dtype=torch.float64)
    _check_all_three(b, CorrectionConfig(mode=mode, weight_cap=1.3), PG[pg_name])


def _tie_batch():
    """Rows whose tokens sit exactly on each kink; returns (batch, bounds)."""
    b = oracles.random_batch(4, 6, scale=0.1, seed=5)
    old = torch.full((4, 6), -1.0, dtype=torch.float64)
    theta = old + torch.tensor(
        [
            [0.15, -0.1, 0.3, 20.0, -20.0, 0.0],
            [0.15, -0.1, 0.3, 20.0, -20.0, 0.0],
            [0.05, 0.5, 0.7, 21.0, -0.3, 0.02],
            [0.05, 0.5, 0.7, 21.0, -0.3, 0.02],
        ],
        dtype=torch.float64,
    )
    r = (theta - old).exp()
    hi, lo = r[0, 0].item(), r[0, 1].item()  # 1 + (hi - 1) == hi exactly (Sterbenz)
    dual_c = r[2, 2].item()  # A < 0 on row 2: -A r == -A c, a tie of min
    adv = torch.tensor([1.0, -1.0, -2.0, 0.5], dtype=torch.float64)
    ref = theta.clone()
    ref[:, 4] = theta[:, 4] + 0.5  # KL input exactly on its clamp (0.5)
    ref[:, 5] = theta[:, 5] + 0.25  # k2 = 0.25^2 / 2 exactly on the output clamp
    b.update(logp_old=old, logp_theta=theta, logp_ref=ref, adv=adv, mask=torch.ones(4, 6, dtype=torch.float64))
    b["logp_rollout"] = old - 0.01
    pg = PGLossConfig(
        ratio_clip_min=1 - lo,
        ratio_clip_max=hi - 1,
        ratio_clip_c=dual_c,
        reference_policy_kl_penalty=0.5,
        reference_policy_kl_type="k2",
        kl_input_clamp_value=0.5,
        kl_output_clamp_value=0.25**2 / 2,
    )
    return b, pg, (lo, hi, dual_c)


def test_kinks_hit_exactly():
    b, pg, (lo, hi, c) = _tie_batch()
    r = (b["logp_theta"] - b["logp_old"]).exp()
    assert 1 - pg.ratio_clip_min == lo and 1 + pg.ratio_clip_max == hi and c > 1
    assert r[0, 0] == hi and r[0, 1] == lo and r[2, 2] == c
    assert (b["logp_theta"] - b["logp_old"])[0, 3] == 20.0  # on log_ratio_clamp
    for mode in ("none", "tis"):
        _check_all_three(b, CorrectionConfig(mode=mode, weight_cap=1.5), pg)


def test_dual_clip_tie_halves_the_gradient():
    # A = -2, r = c: -A r = -A c; NeMo-RL's torch.min splits the gradient: 0.5 (-A r) / N
    b, pg, (_, _, c) = _tie_batch()
    _, grad = _autograd(b, CorrectionConfig(mode="none"), pg)
    kl_grad = hand_gradient.kl_grad(b["logp_theta"], b["logp_ref"], b["mask"], pg)[1][2, 2]
    assert grad[2, 2].item() == pytest.approx((0.5 * 2 * c + kl_grad.item()) / 24, rel=1e-14)
    assert math.isfinite(grad.sum().item())
