# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Per-token correction weights of every mode against the float64 oracle and by hand."""

from __future__ import annotations

import math

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import WEIGHT_FNS, correction_weights

F64_TOL = dict(rtol=1e-12, atol=1e-14)


def _oracle_weights(cfg, b, alpha=None):
    w = oracles.weights(cfg.mode, b["logp_old"].tolist(), b["logp_rollout"].tolist(), b["mask"].tolist(), cfg, alpha)
    return torch.tensor(w, dtype=torch.float64)


CASES = [
    CorrectionConfig(mode="none"),
    CorrectionConfig(mode="tis"),
    CorrectionConfig(mode="tis", weight_cap=1.05, tis={"floor": 0.97}),  # both clamps active
    CorrectionConfig(mode="icepop"),
    CorrectionConfig(mode="icepop", icepop={"min": 0.97, "max": 1.01}),  # asymmetric bounds
    CorrectionConfig(mode="seq_mask_geo"),
    CorrectionConfig(mode="seq_mask_geo", seq_mask_geo={"min": 0.99, "max": 1.003}),  # asymmetric
    CorrectionConfig(mode="ais", weight_cap=1.04),
]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.mode}")
@pytest.mark.parametrize("seed", [0, 1])
def test_weights_match_oracle(cfg, seed):
    b = oracles.random_batch(6, 9, scale=0.03, seed=seed)
    alpha = 0.37 if cfg.mode == "ais" else None
    w = correction_weights(b["logp_old"], b["logp_rollout"], b["mask"], cfg, alpha=alpha)
    assert w.dtype == torch.float64 and not w.requires_grad
    torch.testing.assert_close(w, _oracle_weights(cfg, b, alpha), **F64_TOL)


def test_asymmetric_bounds_keep_exactly_the_interval():
    # rho = pi_old / mu = exp(l): l = log(0.6), log(0.95), log(1.0), log(1.2), log(2.0)
    rho = torch.tensor([[0.6, 0.95, 1.0, 1.2, 2.0]], dtype=torch.float64)
    logp_old = torch.log(rho) - 1.0
    logp_rollout = torch.full_like(logp_old, -1.0)
    mask = torch.ones_like(rho)
    cfg = CorrectionConfig(mode="icepop", icepop={"min": 0.9, "max": 1.5})
    w = correction_weights(logp_old, logp_rollout, mask, cfg)
    # kept: 0.95, 1.0, 1.2 (inside [0.9, 1.5]); dropped: 0.6 (< lo), 2.0 (> hi)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.95, 1.0, 1.2, 0.0]], dtype=torch.float64))
    # Swapping the direction (mu / pi_old) would keep 1/0.95, 1, 1/1.2 = 0.83 -> dropped,
    # so the result pins rho = pi_old / mu.


def test_tis_hand_worked_cap_and_floor():
    # rho = [0.1, 0.5, 1.5, 3.0]; C = 2, floor = 0.4 -> [0.4, 0.5, 1.5, 2.0]
    rho = torch.tensor([[0.1, 0.5, 1.5, 3.0]], dtype=torch.float64)
    cfg = CorrectionConfig(mode="tis", weight_cap=2.0, tis={"floor": 0.4})
    w = correction_weights(torch.log(rho), torch.zeros_like(rho), torch.ones_like(rho), cfg)
    torch.testing.assert_close(w, torch.tensor([[0.4, 0.5, 1.5, 2.0]], dtype=torch.float64))


def test_seq_mask_geo_hand_worked():
    # row 0: l = [+0.001, -0.0005] -> mean 0.00025 -> geo 1.00025 in [0.999, 1.002]: kept, w = rho
    # row 1: l = [+0.01,  +0.0]    -> mean 0.005   -> geo 1.005 > 1.002: dropped, w = 0
    # row 2: l = [-0.004, +0.003]  -> mean -0.0005 -> geo 0.9995 kept (lower bound 0.999)
    ell = torch.tensor([[0.001, -0.0005], [0.01, 0.0], [-0.004, 0.003]], dtype=torch.float64)
    cfg = CorrectionConfig(mode="seq_mask_geo")
    w = correction_weights(ell, torch.zeros_like(ell), torch.ones_like(ell), cfg)
    expected = torch.exp(ell) * torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    torch.testing.assert_close(w, expected, **F64_TOL)


def test_ais_hand_worked():
    # alpha = 0.25, C = 2: rho = [0.5, 1.0, 4.0] -> min(rho, C) = [0.5, 1.0, 2.0]
    # w_hat = 0.75 + 0.25 * [0.5, 1.0, 2.0] = [0.875, 1.0, 1.25]
    rho = torch.tensor([[0.5, 1.0, 4.0]], dtype=torch.float64)
    cfg = CorrectionConfig(mode="ais", weight_cap=2.0)
    w = correction_weights(torch.log(rho), torch.zeros_like(rho), torch.ones_like(rho), cfg, 0.25)
    torch.testing.assert_close(w, torch.tensor([[0.875, 1.0, 1.25]], dtype=torch.float64))


@pytest.mark.parametrize("mode", list(WEIGHT_FNS))
def test_masked_positions_are_zero_and_padding_never_leaks(mode):
    b = oracles.random_batch(4, 7, p_mask=0.5, seed=3)
    b["logp_old"] = torch.where(b["mask"] == 1, b["logp_old"], torch.nan)  # garbage in padding
    w = correction_weights(b["logp_old"], b["logp_rollout"], b["mask"].bool(), CorrectionConfig(mode=mode), 0.5)
    assert torch.isfinite(w).all()
    assert (w[b["mask"] == 0] == 0).all()


@pytest.mark.parametrize("mode", list(WEIGHT_FNS))
def test_huge_log_ratios_give_finite_weights(mode):
    # l = +-1e4: exp overflows to inf / underflows to 0; weights must stay finite.
    ell = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, 1e4]], dtype=torch.float32)
    cfg = CorrectionConfig(mode=mode)
    w = correction_weights(ell, torch.zeros_like(ell), torch.ones_like(ell), cfg, 0.5)
    assert torch.isfinite(w).all()
    if mode in ("tis", "ais"):
        assert w[1].tolist() == pytest.approx([cfg.weight_cap if mode == "tis" else 0.5 + 0.5 * cfg.weight_cap] * 3)


def test_weights_follow_input_dtype():
    b = oracles.random_batch(2, 5, dtype=torch.bfloat16)
    w = correction_weights(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig(mode="tis"))
    assert w.dtype == torch.float32
    ref = correction_weights(
        b["logp_old"].double(), b["logp_rollout"].double(), b["mask"], CorrectionConfig(mode="tis")
    )
    torch.testing.assert_close(w.double(), ref, rtol=1e-6, atol=1e-7)


def test_ais_without_alpha_is_an_error():
    b = oracles.random_batch(2, 3)
    with pytest.raises(ValueError, match="alpha"):
        correction_weights(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig(mode="ais"))


def test_registry_covers_every_mode():
    modes = CorrectionConfig.model_fields["mode"].annotation.__args__
    assert set(WEIGHT_FNS) == set(modes)
    assert [m for m, f in WEIGHT_FNS.items() if f.needs_alpha] == ["ais", "m2po"]
    assert math.isclose(CorrectionConfig().weight_cap, 2.0)
