# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""NeMo-RL's loss options in core's ``clipped_pg_loss``, by hand (no NeMo-RL needed).

CISPO, GSPO's sequence ratio, the on-policy KL approximation, the VAPO NLL term and the KL
term's own log-probs (``kl_logprobs``, NeMo-RL's ``curr_logprobs_unfiltered``) on float64
hand cases: values and gradients as the algorithm box of ``nemo_ais.core.loss`` writes
them. Equality with NeMo-RL's ``ClippedPGLossFn`` itself is in
``tests/adapters/test_nemo_rl_modes.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from host_syncs import count_host_syncs

from nemo_ais.config import CorrectionConfig, PGLossConfig, validate_section
from nemo_ais.core import clipped_pg_loss

F64 = torch.float64
NONE = CorrectionConfig(mode="none")


def _hand_batch():
    """2 x 3, N = 4 valid tokens; log r = (0.1, -0.9, 0.5 | 0.05, masked, masked)."""
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.25, -1.5, -0.75]], dtype=F64)
    log_r = torch.tensor([[0.1, -0.9, 0.5], [0.05, 7.0, 0.3]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([2.0, -0.5], dtype=F64)
    return old + log_r, old, mask, adv


def _loss(theta, old, mask, adv, pg, config=NONE, **kw):
    theta = theta.clone().requires_grad_(True)
    out = clipped_pg_loss(theta, old, old, adv, mask, config, pg=pg, **kw)
    out.loss.backward()
    return out, theta.grad


# ---- CISPO -----------------------------------------------------------------------------------


def test_cispo_gradient_is_minus_a_times_the_clipped_ratio_exactly():
    theta, old, mask, adv = _hand_batch()
    pg = PGLossConfig(use_cispo=True, ratio_clip_min=0.5, ratio_clip_max=0.25)
    out, grad = _loss(theta, old, mask, adv, pg)
    r_clip = (theta - old).exp().clamp(0.5, 1.25)  # 0.5 and 1.25: dyadic, N = 4 a power of 2
    want = -adv[:, None] * r_clip * mask / 4
    assert torch.equal(grad, want), (grad, want)
    assert grad[0, 2] != 0  # clipped (r = e^0.5 > 1.25) and still a gradient, unlike PPO
    ppo = _loss(theta, old, mask, adv, PGLossConfig(ratio_clip_min=0.5, ratio_clip_max=0.25))[1]
    assert ppo[0, 2] == 0
    # value: -A sg(clip(r)) log pi_theta, token mean
    assert out.loss.item() == pytest.approx((want * theta).sum().item(), rel=1e-15)
    assert out.metrics["probs_ratio_clamped"].item() == pytest.approx((r_clip * mask).sum().item() / 4, rel=1e-15)


def test_cispo_is_refused_with_the_options_nemo_rl_asserts_against():
    for fields, name in (
        ({"disable_ppo_ratio": True}, "disable_ppo_ratio"),
        ({"ratio_clip_c": 3.0}, "ratio_clip_c"),
        ({"token_level_loss": False}, "token_level_loss"),
    ):
        with pytest.raises(ValueError, match=rf"^loss_fn\.{name}=\S+ is invalid with use_cispo"):
            validate_section(PGLossConfig, {"use_cispo": True, **fields}, "loss_fn")


# ---- GSPO: sequence-level ratios -----------------------------------------------------------


def test_gspo_ratio_is_the_sequence_geometric_mean_and_its_gradient_spreads_over_tokens():
    theta, old, mask, adv = _hand_batch()
    pg = PGLossConfig(sequence_level_importance_ratios=True, token_level_loss=False)
    out, grad = _loss(theta, old, mask, adv, pg)
    s = [math.exp((0.1 - 0.9 + 0.5) / 3), math.exp(0.05)]  # row 1: its one valid token
    assert 0.8 < s[0] < 1.2 and 0.8 < s[1] < 1.2  # inside the clip: L = -sum_i A_i s_i / N_seq
    assert out.loss.item() == pytest.approx(-(2.0 * s[0] - 0.5 * s[1]) / 2, rel=1e-14)
    # d s_i / d log pi_theta_it = s_i / n_i on each of the sequence's n_i valid tokens
    want = torch.tensor([[-2.0 * s[0] / 3 / 2] * 3, [0.5 * s[1] / 2, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=1e-14, atol=0)
    ratio_mean = (3 * s[0] + s[1]) / 4  # probs_ratio: token mean of the broadcast s_i
    assert out.metrics["probs_ratio"].item() == pytest.approx(ratio_mean, rel=1e-14)


def test_gspo_needs_sequence_level_loss_and_excludes_tbpo():
    with pytest.raises(ValueError, match="sequence_level_importance_ratios=True is invalid"):
        PGLossConfig(sequence_level_importance_ratios=True)
    theta, old, mask, adv = _hand_batch()
    for pg, field in (
        (PGLossConfig(sequence_level_importance_ratios=True, token_level_loss=False), "sequence"),
        (PGLossConfig(use_cispo=True), "use_cispo"),
    ):
        with pytest.raises(ValueError, match=rf"loss_fn\.{field}\S*=True is invalid with "):
            _loss(theta, old, mask, adv, pg, CorrectionConfig(mode="tbpo"))


# ---- KL term: on-policy approximation and its own log-probs -----------------------------------


def _kl_case():
    theta, old, mask, adv = _hand_batch()
    ref = theta.detach() + torch.tensor([[0.2, -0.1, 0.45], [0.3, 0.0, -0.4]], dtype=F64)
    mu = old - torch.tensor([[0.1, 0.2, -0.3], [0.0, 0.1, 0.25]], dtype=F64)
    return theta, old, mu, mask, torch.zeros_like(adv), ref


def _kl_loss(pg, theta, old, mu, mask, adv, ref, **kw):
    theta = theta.clone().requires_grad_(True)
    out = clipped_pg_loss(theta, old, mu, adv, mask, CorrectionConfig(mode="tis"), pg=pg, reference_logprobs=ref, **kw)
    out.loss.backward()
    return out, theta.grad


def test_on_policy_kl_weight_is_pi_theta_over_mu_with_its_gradient():
    theta, old, mu, mask, adv, ref = _kl_case()
    beta = 0.5
    pg = PGLossConfig(reference_policy_kl_penalty=beta, use_on_policy_kl_approximation=True, kl_input_clamp_value=0.35)
    out, grad = _kl_loss(pg, theta, old, mu, mask, adv, ref)
    x = (ref - theta).clamp(-0.35, 0.35)
    w = (theta - mu).exp()
    k3 = x.exp() - 1 - x
    inside = ((ref - theta).abs() <= 0.35).to(F64)  # token (0, 2): x = 0.45, clamped
    assert inside[0, 2] == 0
    assert out.loss.item() == pytest.approx(beta * (w * k3 * mask).sum().item() / 4, rel=1e-14)
    # d/dtheta [w k3(x)] = w k3 + w (e^x - 1)(-1), both 0 where the input clamp is active
    want = beta * mask / 4 * inside * (w * k3 - w * (x.exp() - 1))
    torch.testing.assert_close(grad, want, rtol=1e-13, atol=1e-17)
    assert grad[0, 2] == 0


def test_on_policy_kl_weight_overflow_is_zeroed_as_nemo_rl():
    theta, old, mu, mask, adv, ref = _kl_case()
    mu = mu.clone()
    mu[0, 0] = -1000.0  # exp(log pi_theta - log mu) = inf -> 0 (nan_to_num)
    pg = PGLossConfig(reference_policy_kl_penalty=0.5, use_on_policy_kl_approximation=True)
    out, grad = _kl_loss(pg, theta, old, mu, mask, adv, ref)
    assert math.isfinite(out.loss.item()) and torch.isfinite(grad).all()
    assert grad[0, 0] == 0


def test_default_kl_weight_has_value_one_and_the_score_function_gradient():
    theta, old, mu, mask, adv, ref = _kl_case()
    pg = PGLossConfig(reference_policy_kl_penalty=0.5, kl_input_clamp_value=None)
    out, grad = _kl_loss(pg, theta, old, mu, mask, adv, ref)
    x = ref - theta
    k3 = x.exp() - 1 - x
    assert out.loss.item() == pytest.approx(0.5 * (k3 * mask).sum().item() / 4, rel=1e-14)
    torch.testing.assert_close(grad, 0.5 * mask / 4 * (k3 - (x.exp() - 1)), rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("clamp", [100.0, None])
def test_k3_past_exps_overflow_is_its_output_clamp_not_nan(dtype, clamp):
    """log pi_ref - log pi_theta beyond exp()'s overflow (valid, or masked garbage): NeMo-RL's finite forward."""
    theta = torch.full((1, 4), -0.5, dtype=dtype)
    theta[0, 0] = theta[0, 3] = -1000.0  # valid; masked
    ref, mask = torch.full((1, 4), -0.5, dtype=dtype), torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=dtype)
    pg = PGLossConfig(reference_policy_kl_penalty=0.1, kl_input_clamp_value=clamp, kl_output_clamp_value=10.0)
    out, grad = _loss(theta, theta, mask, torch.zeros(1, dtype=dtype), pg, reference_logprobs=ref)
    assert out.loss.item() == pytest.approx(0.1 * 10.0 / 3, rel=1e-6)  # k3 = +inf clamped to 10 at 1 of 3 tokens
    assert out.metrics["kl_penalty"].item() == pytest.approx(10.0 / 3, rel=1e-6)
    assert torch.equal(grad, torch.zeros_like(grad))  # the clamp's zero gradient; the other tokens: x = 0


@pytest.mark.parametrize("on_policy", [False, True])
def test_kl_logprobs_take_the_kl_term_and_curr_logprobs_the_surrogate(on_policy):
    theta, old, mu, mask, _, ref = _kl_case()
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    pg = PGLossConfig(reference_policy_kl_penalty=0.3, use_on_policy_kl_approximation=on_policy)
    whole, grad = _kl_loss(pg, theta, old, mu, mask, adv, ref)
    curr = theta.clone().requires_grad_(True)
    kl = theta.clone().requires_grad_(True)  # same values, a separate leaf
    out = clipped_pg_loss(
        curr, old, mu, adv, mask, CorrectionConfig(mode="tis"), pg=pg, reference_logprobs=ref,
        kl_logprobs=kl,
    )  # fmt: skip
    out.loss.backward()
    assert out.loss.item() == pytest.approx(whole.loss.item(), rel=1e-15)
    torch.testing.assert_close(curr.grad + kl.grad, grad, rtol=1e-14, atol=1e-17)
    _, surrogate_grad = _kl_loss(
        PGLossConfig(), theta, old, mu, mask, adv, ref.clone()
    )  # the surrogate alone: all of curr's gradient
    torch.testing.assert_close(curr.grad, surrogate_grad, rtol=1e-14, atol=1e-17)
    assert kl.grad.abs().sum() > 0
    # different values: the KL term reads kl_logprobs, the ratio r still reads curr_logprobs
    shifted = out.loss.item()
    moved = clipped_pg_loss(
        theta, old, mu, adv, mask, CorrectionConfig(mode="tis"), pg=pg, reference_logprobs=ref,
        kl_logprobs=theta + 0.05,
    )  # fmt: skip
    assert moved.metrics["probs_ratio"].item() == pytest.approx(out.metrics["probs_ratio"].item(), rel=1e-15)
    assert moved.metrics["kl_penalty"].item() != pytest.approx(out.metrics["kl_penalty"].item())
    assert moved.loss.item() != pytest.approx(shifted)


def test_kl_logprobs_are_checked_like_the_other_log_probs():
    theta, old, mu, mask, adv, ref = _kl_case()
    pg = PGLossConfig(reference_policy_kl_penalty=0.3)
    with pytest.raises(ValueError, match="kl_logprobs"):
        _kl_loss(pg, theta, old, mu, mask, adv, ref, kl_logprobs=theta[:, :2])
    bad = theta.clone()
    bad[0, 1] = math.nan
    with pytest.raises(ValueError, match="kl_logprobs"):
        _kl_loss(pg, theta, old, mu, mask, adv, ref, kl_logprobs=bad)
    # KL off: not read (as reference_logprobs)
    _kl_loss(PGLossConfig(), theta, old, mu, mask, adv, ref, kl_logprobs=theta[:, :2])


# ---- VAPO: positive-example NLL ----------------------------------------------------------------


def test_nll_term_is_the_mean_nll_of_the_positive_rows_with_a_local_count():
    theta, old, mask, adv = _hand_batch()
    pg = PGLossConfig(positive_example_nll_weight=0.25)
    rewards = torch.tensor([1.0, 0.0], dtype=F64)  # row 0 only: its 3 valid tokens
    base, base_grad = _loss(theta, old, mask, adv, PGLossConfig(), global_valid_tokens=40.0)
    out, grad = _loss(theta, old, mask, adv, pg, rewards=rewards, global_valid_tokens=40.0)
    nll = -theta[0].sum().item() / 3  # / 3 tokens of this call, not / 40
    assert out.metrics["positive_nll_loss"].item() == pytest.approx(nll, rel=1e-15)
    assert out.loss.item() == pytest.approx(base.loss.item() + 0.25 * nll, rel=1e-15)
    want = base_grad + torch.tensor([[-0.25 / 3] * 3, [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("rewards", [[0.0, -1.0], [math.nan, 0.0], [-2.0, 3.0]], ids=["none", "nan", "masked_only"])
def test_nll_term_without_a_positive_valid_token_is_zero_not_nan(rewards):
    theta, old, mask, adv = _hand_batch()
    if rewards == [-2.0, 3.0]:
        mask = mask.clone()
        mask[1] = 0  # the positive row has no valid token
    pg = PGLossConfig(positive_example_nll_weight=1.0)
    rewards = torch.tensor(rewards, dtype=F64)
    base, base_grad = _loss(theta, old, mask, adv, PGLossConfig())
    out, grad = _loss(theta, old, mask, adv, pg, rewards=rewards)
    assert out.metrics["positive_nll_loss"].item() == 0.0
    assert out.loss.item() == base.loss.item()
    assert torch.equal(grad, base_grad)


def test_nll_weight_needs_rewards_naming_them():
    theta, old, mask, adv = _hand_batch()
    pg = PGLossConfig(positive_example_nll_weight=0.1)
    with pytest.raises(TypeError, match=r"rewards: got NoneType, expected a real \[B\] tensor"):
        _loss(theta, old, mask, adv, pg)
    with pytest.raises(ValueError, match=r"rewards: .* expected \[2\]"):
        _loss(theta, old, mask, adv, pg, rewards=torch.ones(3, dtype=F64))
    assert "positive_nll_loss" not in _loss(theta, old, mask, adv, PGLossConfig())[0].metrics


# ---- cost: still one host sync ------------------------------------------------------------------


@pytest.mark.parametrize(
    "pg",
    [
        PGLossConfig(use_cispo=True, reference_policy_kl_penalty=0.1),
        PGLossConfig(sequence_level_importance_ratios=True, token_level_loss=False),
        PGLossConfig(
            reference_policy_kl_penalty=0.1, use_on_policy_kl_approximation=True, positive_example_nll_weight=0.2
        ),
    ],
    ids=["cispo_kl", "gspo", "on_policy_kl_nll"],
)
def test_the_options_keep_one_host_sync_per_call(monkeypatch, pg):
    theta, old, mu, mask, _, ref = _kl_case()
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    calls = count_host_syncs(monkeypatch)
    theta = theta.clone().requires_grad_(True)
    out = clipped_pg_loss(
        theta, old, mu, adv, mask, CorrectionConfig(mode="tis"), pg=pg, reference_logprobs=ref,
        kl_logprobs=theta * 1.0, rewards=torch.tensor([1.0, 0.0], dtype=F64),
    )  # fmt: skip
    out.loss.backward()
    assert calls == ["tolist"]  # the fused value check
