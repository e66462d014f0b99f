# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Values at the edges of the method (issue 27, item 13), against the float64 oracle.

* Diagnostics in the clamped regime, |l| > ``log_ratio_clamp`` (20): every diagnostic and
  every mode's batch value, against ``tests/oracles.py`` (which clamps where the method
  does and keeps the raw l for severity and k1).
* A ratio exactly ON an ``icepop`` / ``seq_mis`` bound is kept: NeMo-RL's ``icepop`` and
  veRL's sequence MIS compare with ``>=`` / ``<=`` (inclusive), and so does the oracle.
"""

from __future__ import annotations

import math

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import clipped_pg_loss, compute_diagnostics, correction_weights

CLAMPED = [
    CorrectionConfig(),
    CorrectionConfig(seq_weight="product"),
    CorrectionConfig(mode="tis", batch_normalize=True),
    CorrectionConfig(mode="seq_tis", batch_normalize=True),
    CorrectionConfig(mode="tbpo", batch_normalize=True),
    CorrectionConfig(mode="kl_rs", kl_rs={"estimator": "k3", "aggregation": "max", "threshold": 50.0}),
    CorrectionConfig(mode="m2po", m2po={"tau": 0.5}),
    CorrectionConfig(mode="seq_mis", seq_mis={"min": 1e-12, "max": 1e12}),
]


def _clamped_batch(seed):
    """Log-ratios up to |l| = 60 (beyond the clamp L = 20) in most rows, small in others."""
    b = oracles.random_batch(6, 8, scale=0.05, seed=seed)
    g = torch.Generator().manual_seed(seed)
    big = (torch.rand(6, 8, generator=g, dtype=torch.float64) * 40 + 20) * torch.where(
        torch.rand(6, 8, generator=g) < 0.5, -1.0, 1.0
    ).double()
    hit = torch.rand(6, 8, generator=g) < 0.4
    hit[4:] = False  # two rows in the unclamped regime
    rollout = torch.where(hit, b["logp_old"] - big, b["logp_rollout"])
    b["logp_rollout"] = torch.where(b["mask"] == 1, rollout, -torch.inf)
    return b, hit & (b["mask"] == 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cfg", CLAMPED, ids=lambda c: f"{c.mode}-{c.seq_weight}")
def test_diagnostics_in_the_clamped_regime_match_the_oracle(cfg, seed):
    b, hit = _clamped_batch(seed)
    lists = [b[k].tolist() for k in ("logp_old", "logp_rollout", "mask")]
    log_rho = (b["logp_old"] - b["logp_rollout"])[hit]
    assert hit.sum() >= 5 and (log_rho.abs() > cfg.log_ratio_clamp).all()  # not vacuous
    expected = oracles.diagnostics(*lists, cfg)
    got = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg).as_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-15), (key, got[key], value)
    assert all(math.isfinite(v) for v in got.values())


def _one_row(log_rhos, length=4):
    """logp_old = l, logp_rollout = 0 at the first len(log_rhos) positions; rest masked."""
    old = torch.zeros(1, length, dtype=torch.float64)
    old[0, : len(log_rhos)] = torch.tensor(log_rhos, dtype=torch.float64)
    mask = torch.zeros(1, length, dtype=torch.float64)
    mask[0, : len(log_rhos)] = 1
    return old, torch.zeros_like(old), mask


def _just_outside(ell, below, factor=1):
    """The float nearest ``ell`` on the outer side whose exp(factor * l) leaves the bound."""
    target = math.exp(factor * ell)
    out = ell
    while math.exp(factor * out) == target:
        out = math.nextafter(out, -math.inf if below else math.inf)
    return out


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_ratio_exactly_on_an_icepop_bound_is_kept(bound):
    cfg = CorrectionConfig(mode="icepop", icepop={"min": 0.5, "max": 2.0})
    value = getattr(cfg.icepop, bound)
    ell = math.log(value)
    assert math.exp(ell) == value  # the ratio is exactly the bound (no rounding either way)
    old, rollout, mask = _one_row([ell, 0.0])
    w = correction_weights(old, rollout, mask, cfg)
    expected = oracles.weights("icepop", old.tolist(), rollout.tolist(), mask.tolist(), cfg)
    assert w.tolist() == expected == [[value, 1.0, 0.0, 0.0]]  # kept with weight rho
    # the next ratio outside the bound is dropped
    old, rollout, mask = _one_row([_just_outside(ell, bound.endswith("min")), 0.0])
    assert correction_weights(old, rollout, mask, cfg)[0, 0].item() == 0.0


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_sequence_ratio_exactly_on_a_seq_mis_bound_is_kept(bound):
    cfg = CorrectionConfig(mode="seq_mis", seq_mis={"min": 0.5, "max": 4.0}, seq_weight_cap=8.0)
    value = getattr(cfg.seq_mis, bound)
    half = math.log(value) / 2  # two tokens whose log-ratios sum exactly to log(bound)
    assert half + half == math.log(value) and math.exp(half + half) == value
    old, rollout, mask = _one_row([half, half])
    w = correction_weights(old, rollout, mask, cfg)
    expected = oracles.weights("seq_mis", old.tolist(), rollout.tolist(), mask.tolist(), cfg)
    assert w.tolist() == expected
    assert w[0, :2].tolist() == pytest.approx([value, value], rel=1e-15)  # kept
    diag = compute_diagnostics(old, rollout, mask, cfg)
    assert diag.mode_frac_masked == 0.0
    # the loss keeps the on-bound sequence: its gradient is not zero
    theta = old.clone().requires_grad_()
    clipped_pg_loss(theta, old, rollout, torch.ones(1), mask, cfg, pg=PGLossConfig()).loss.backward()
    assert (theta.grad[0, :2] != 0).all()
    outside = _just_outside(half, bound.endswith("min"), factor=2)
    old, rollout, mask = _one_row([outside, outside])
    assert correction_weights(old, rollout, mask, cfg)[0, 0].item() == 0.0


def test_correction_weights_checks_its_inputs_as_the_loss_does():
    """The public weight function: no broadcast, no mask 0.5 read as 0, no NaN weight, no NaN alpha."""
    old, gen, ones = torch.zeros(2, 3), torch.full((2, 3), -0.1), torch.ones(2, 3)
    tis = CorrectionConfig(mode="tis")
    with pytest.raises(ValueError, match=r"^mask: 6 values not in \{0, 1\}; first at index \(0, 0\) \(value 0\.5\)"):
        correction_weights(old, gen, torch.full((2, 3), 0.5), tis)
    for short in (gen[:, :1], gen[:, :2]):  # a broadcastable shape too
        with pytest.raises(ValueError, match=r"generation_logprobs: got \[2, \d\] float32, expected \[2, 3\]"):
            correction_weights(old, short, ones, tis)
    nan_old = old.clone()
    nan_old[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"prev_logprobs: 1 non-finite values .* first at index \(1, 2\)"):
        correction_weights(nan_old, gen, ones, tis)
    masked = ones.clone()
    masked[1, 2] = 0  # a masked NaN is ignored: weight 0 there
    assert correction_weights(nan_old, gen, masked, tis)[1].tolist() == pytest.approx([math.exp(0.1)] * 2 + [0.0])
    with pytest.raises(ValueError, match=r"mode 'ais' needs a finite alpha, got nan"):
        correction_weights(old, gen, ones, CorrectionConfig(mode="ais"), alpha=math.nan)
