# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Statistics, diagnostics, mixer and EMA state against the float64 oracle and by hand."""

from __future__ import annotations

import math

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import (
    BAD_INPUT_SLOTS,
    NUM_SLOTS,
    STATS_BYTES,
    AISState,
    AISStats,
    Slot,
    compute_diagnostics,
    compute_statistics,
    diagnostics_from_stats,
    reduce_statistics,
)
from nemo_ais.core.stats import TAIL_BINS

REL = 1e-12  # float64 sums in a different order than the oracle's loops

CONFIGS = [
    CorrectionConfig(),
    CorrectionConfig(seq_weight="product", weight_cap=1.05),
    CorrectionConfig(use_severity_gate=False, reliability_floor=0.9, variance_tolerance=0.01),
    CorrectionConfig(use_reliability_gate=False, use_variance_gate=False, severity_scale=0.5),
    CorrectionConfig(mixer="constant", constant_alpha=0.3),
    CorrectionConfig(alpha_min=0.2, alpha_max=0.6),
]


def _oracle(b, cfg, prev_alpha=None):
    return oracles.diagnostics(b["logp_old"].tolist(), b["logp_rollout"].tolist(), b["mask"].tolist(), cfg, prev_alpha)


def _assert_diag(diag, expected):
    got = diag.as_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=REL, abs_tol=1e-15), (key, got[key], value)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("scale", [0.01, 0.3])
def test_diagnostics_match_oracle(cfg, scale):
    b = oracles.random_batch(7, 11, scale=scale, seed=int(scale * 100))
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    _assert_diag(diag, _oracle(b, cfg))
    assert 0 < diag.ess_seq <= 1
    assert cfg.alpha_min <= diag.alpha <= cfg.alpha_max


def test_hand_worked_diagnostics():
    # Two sequences, C = 2, geometric W, default gates (tau 0.02, r_min 0.5, kappa 1).
    # seq 0: l = [ln 2, 0]   -> mean ln(2)/2 -> W0 = sqrt(2)
    # seq 1: l = [-ln 2, (masked)] -> W1 = 1/2
    # R = (sqrt2 + 0.5)^2 / (2 * (2 + 0.25)) = (1.9142136)^2 / 4.5 = 3.6642136 / 4.5 = 0.8142697
    # D = (ln2 + 0 + ln2) / 3 = 0.4620981
    # w = [2, 1, 0.5]: mean 7/6, mean w^2 = (4 + 1 + 0.25) / 3 = 1.75
    # CV^2 = 1.75 / (49/36) - 1 = 63/49 - 1 = 2/7
    # g_sev = 1 - exp(-0.4620981 / 0.02) ~= 1 - 9.2e-11
    # g_rel = (0.8142697 - 0.5) / 0.5 = 0.6285394; g_var = 1 / (1 + 2/7) = 7/9
    ln2 = math.log(2)
    logp_old = torch.tensor([[ln2, 0.0], [-ln2, 5.0]], dtype=torch.float64) - 1
    logp_rollout = torch.full_like(logp_old, -1.0)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    d = compute_diagnostics(logp_old, logp_rollout, mask, CorrectionConfig())
    r = (math.sqrt(2) + 0.5) ** 2 / (2 * 2.25)
    assert d.ess_seq == pytest.approx(r, rel=1e-14)
    assert d.severity == pytest.approx(2 * ln2 / 3, rel=1e-14)
    assert d.cv2 == pytest.approx(2 / 7, rel=1e-13)
    # token ESS of the weights (2, 1, 0.5): 3.5^2 / (3 * 5.25) = 7/9 = 1 / (1 + CV^2)
    assert d.ess_tok == pytest.approx(7 / 9, rel=1e-13)
    assert d.g_rel == pytest.approx((r - 0.5) / 0.5, rel=1e-13)
    assert d.g_var == pytest.approx(7 / 9, rel=1e-13)
    assert d.alpha == pytest.approx((1 - math.exp(-2 * ln2 / 3 / 0.02)) * (r - 0.5) / 0.5 * 7 / 9)
    assert d.w_mean == pytest.approx(7 / 6)
    assert d.frac_capped == 0.0  # rho = 2 is not > C = 2
    assert d.kl_k1 == pytest.approx((-ln2 - 0 + ln2) / 3, abs=1e-16)
    # k3 = exp(l) - 1 - l: (2 - 1 - ln2) + 0 + (0.5 - 1 + ln2) = 0.5 -> mean 1/6
    assert d.kl_k3 == pytest.approx(1 / 6, rel=1e-14)
    assert d.token_mult_prob_error == pytest.approx((2 + 1 + 2) / 3)
    assert d.raw_ratio_mean == pytest.approx(3.5 / 3)
    assert (d.n_seq, d.n_tok, d.empty_batch) == (2.0, 3.0, 0.0)


def test_kl_direction_is_mu_to_pi_old():
    # Samples from mu; KL(mu || pi_old) = E_mu[log mu - log pi_old] = E[-l] >= 0 in expectation.
    # Bernoulli example: mu = (0.5, 0.5), pi_old = (0.8, 0.2); exact KL(mu||pi_old) =
    # 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231436. Weighting the two tokens equally is
    # the exact expectation under mu, so k1 and k3 both equal it.
    logp_old = torch.log(torch.tensor([[0.8, 0.2]], dtype=torch.float64))
    logp_rollout = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    d = compute_diagnostics(logp_old, logp_rollout, torch.ones(1, 2), CorrectionConfig())
    exact = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert d.kl_k1 == pytest.approx(exact, rel=1e-14)
    assert d.kl_k3 == pytest.approx(exact, rel=1e-14)  # E_mu[rho] = 1 makes k3 = k1 here


@pytest.mark.parametrize("cfg", [CorrectionConfig(), CorrectionConfig(mixer="constant", ema=0.5)])
def test_globally_empty_batch(cfg):
    b = oracles.random_batch(3, 4, p_mask=1.0)
    state = AISState(alpha=0.4, num_updates=3)
    d = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg, state=state)
    assert d.alpha == 0.0 and d.empty_batch == 1.0
    assert all(math.isfinite(v) for v in d.as_dict().values())
    _assert_diag(d, _oracle(b, cfg))
    assert state.state_dict() == {"alpha": 0.4, "num_updates": 4}  # counted, alpha kept
    for shape in [(0, 5), (4, 0)]:
        z = torch.zeros(shape)
        assert compute_diagnostics(z, z, z, cfg).empty_batch == 1.0


def test_ema_state_advances_once_and_round_trips():
    cfg = CorrectionConfig(ema=0.75)
    state = AISState()
    batches = [oracles.random_batch(4, 6, scale=s, seed=i) for i, s in enumerate([0.01, 0.2, 0.05])]
    prev = None
    for i, b in enumerate(batches):
        d = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg, state=state)
        expected = _oracle(b, cfg, prev)
        _assert_diag(d, expected)
        assert state.num_updates == i + 1 and state.alpha == d.alpha
        prev = d.alpha
    # alpha_2 = 0.75 alpha_1 + 0.25 alpha_raw_2 (first step takes alpha_raw)
    restored = AISState()
    restored.load_state_dict(state.state_dict())
    assert restored == state
    b = batches[0]
    d1 = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg, state=state)
    d2 = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg, state=restored)
    assert d1 == d2


def test_no_state_means_no_smoothing():
    cfg = CorrectionConfig(ema=0.9)
    b = oracles.random_batch(4, 6, scale=0.2)
    d = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    assert d.alpha == d.alpha_raw


def test_alpha_clamp():
    b = oracles.random_batch(4, 6, scale=0.001)  # tiny mismatch -> g_sev ~ 0.05
    d = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig(alpha_min=0.3))
    assert d.alpha_raw < 0.3 and d.alpha == 0.3
    d = compute_diagnostics(
        b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig(mixer="constant", alpha_max=0.7)
    )
    assert d.alpha_raw == 1.0 and d.alpha == 0.7


def test_statistics_are_additive_over_splits():
    # A rank with no valid token contributes zeros; summing split vectors == whole batch.
    b = oracles.random_batch(9, 13, scale=0.1, seed=5)
    b["mask"][6:] = 0
    cfg = CorrectionConfig()
    whole = compute_statistics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    parts = [
        compute_statistics(b["logp_old"][s], b["logp_rollout"][s], b["mask"][s], cfg)
        for s in (slice(0, 2), slice(2, 6), slice(6, 9))
    ]
    assert parts[2].vector.abs().sum() == 0  # all-masked shard
    summed = AISStats(sum(p.vector for p in parts))
    torch.testing.assert_close(summed.vector, whole.vector, rtol=1e-13, atol=0)
    assert diagnostics_from_stats(summed, cfg).alpha == pytest.approx(
        diagnostics_from_stats(whole, cfg).alpha, rel=1e-12
    )


def test_statistics_vector_layout():
    b = oracles.random_batch(3, 5, dtype=torch.bfloat16)
    stats = compute_statistics(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig())
    assert stats.vector.dtype == torch.float64 and stats.vector.shape == (NUM_SLOTS,)
    # 23 scalars + two 24-bin tail histograms (issue 27): 71 float64 = 568 bytes
    assert NUM_SLOTS == len(Slot) + 2 * TAIL_BINS and STATS_BYTES == stats.nbytes == 568
    assert stats[Slot.N_TOK].item() == b["mask"].sum().item()
    tails = stats.vector[len(Slot) :].reshape(2, TAIL_BINS)
    assert tails[0].sum().item() == b["mask"].sum().item()  # one count per valid token
    assert tails[1].sum().item() == 3  # one per sequence with a valid token
    assert stats[Slot.N_SEQ].item() == 3
    assert reduce_statistics(stats, None) is stats  # single process: no collective


def test_bf16_diagnostics_match_float64_of_the_same_values():
    b = oracles.random_batch(5, 8, scale=0.05, dtype=torch.bfloat16)
    cfg = CorrectionConfig()
    d16 = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    d64 = compute_diagnostics(b["logp_old"].double(), b["logp_rollout"].double(), b["mask"], cfg)
    assert d16 == d64  # upcast of bf16 to float64 is exact


@pytest.mark.parametrize(
    ("slot", "match"),
    [
        (Slot.N_BAD_LOGPROBS, r"2 non-finite input value\(s\) at valid positions"),
        (Slot.N_BAD_MASK, r"2 mask value\(s\) not in \{0, 1\}"),
        (Slot.N_MISSING_KEY, r"2 rank\(s\) with a missing key"),
        (Slot.N_BAD_DTYPE, r"2 rank\(s\) with a wrong type or dtype"),
        (Slot.N_BAD_SHAPE, r"2 rank\(s\) with a wrong shape or device"),
        (Slot.N_BAD_RANKS, r"bad input summed over the process group"),
    ],
)
def test_diagnostics_from_stats_raises_on_bad_counts(slot, match):
    vector = torch.zeros(NUM_SLOTS, dtype=torch.float64)
    vector[slot] = 2
    with pytest.raises(ValueError, match=match):
        diagnostics_from_stats(AISStats(vector), CorrectionConfig())


@pytest.mark.parametrize(
    ("error", "slot"),
    [
        (KeyError("token_mask: missing"), Slot.N_MISSING_KEY),
        (TypeError("prev_logprobs: got int64"), Slot.N_BAD_DTYPE),
        (ValueError("mask: got [4, 9]"), Slot.N_BAD_SHAPE),
        (RuntimeError("anything else"), Slot.N_BAD_SHAPE),
    ],
)
def test_input_error_statistics_flag_the_rank_and_the_kind(error, slot):
    stats = AISStats.from_input_error(error)
    assert stats.vector.dtype == torch.float64 and stats.vector.shape == (NUM_SLOTS,)
    want = torch.zeros(NUM_SLOTS, dtype=torch.float64)
    want[Slot.N_BAD_RANKS] = want[slot] = 1  # every sum is 0: nothing else to contribute
    assert torch.equal(stats.vector, want)


def test_bad_values_flag_the_rank_once():
    b = oracles.random_batch(3, 5, scale=0.1, seed=4)
    b["mask"][:] = 1
    b["logp_old"][0, :2] = torch.nan  # two bad values, one bad rank
    v = compute_statistics(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig()).vector
    assert v[Slot.N_BAD_LOGPROBS] == 2 and v[Slot.N_BAD_RANKS] == 1
    assert v[Slot.N_MISSING_KEY] == v[Slot.N_BAD_DTYPE] == v[Slot.N_BAD_SHAPE] == 0
    clean = compute_statistics(b["logp_rollout"], b["logp_rollout"], b["mask"], CorrectionConfig())
    assert all(clean.vector[slot] == 0 for slot in BAD_INPUT_SLOTS)


def test_from_sums_matches_computed_statistics():
    b = oracles.random_batch(6, 9, scale=0.2, seed=8)
    cfg = CorrectionConfig(weight_cap=1.1)
    stats = compute_statistics(b["logp_old"], b["logp_rollout"], b["mask"], cfg)
    ell = (b["logp_old"] - b["logp_rollout"])[b["mask"] == 1]
    w = torch.exp(ell).clamp(max=1.1)
    v = stats.vector
    rebuilt = AISStats.from_sums(
        n_seq=v[Slot.N_SEQ].item(),
        w_seq_sum=v[Slot.W_SEQ_SUM].item(),
        w_seq_sq_sum=v[Slot.W_SEQ_SQ_SUM].item(),
        n_tok=float(ell.numel()),
        abs_log_rho_sum=ell.abs().sum().item(),
        w_tok_sum=w.sum().item(),
        w_tok_sq_sum=w.square().sum().item(),
        log_rho_sum=ell.sum().item(),
        log_rho_clamped_sum=ell.sum().item(),
        n_capped=float((torch.exp(ell) > 1.1).sum()),
        rho_sum=torch.exp(ell).sum().item(),
        exp_abs_log_rho_sum=torch.exp(ell.abs()).sum().item(),
    )
    scalars = len(Slot)  # from_sums has no histogram: its tail slots stay 0
    torch.testing.assert_close(rebuilt.vector[:scalars], v[:scalars], rtol=1e-9, atol=1e-11)
    assert (rebuilt.vector[scalars:] == 0).all()


def test_a_statistics_vector_of_another_config_is_refused_naming_both_lengths():
    """m2po's q* needs its histogram slots: statistics of another mode would silently give q* = 1e4."""
    from nemo_ais.core import AISStats, compute_statistics, diagnostics_from_stats
    from nemo_ais.core.stats import num_slots

    torch.manual_seed(0)
    old = torch.randn(4, 50, dtype=torch.float64) - 1
    gen, m = old + 0.5 * torch.randn(4, 50, dtype=torch.float64), torch.ones(4, 50, dtype=torch.float64)
    m2po, ais = CorrectionConfig(mode="m2po"), CorrectionConfig(mode="ais")
    assert num_slots(m2po) > num_slots(ais)
    assert diagnostics_from_stats(compute_statistics(old, gen, m, m2po), m2po).m2po_threshold < 1.0
    with pytest.raises(
        ValueError,
        match=rf"got .* shape \[{num_slots(ais)}\], expected \[{num_slots(m2po)}\] for loss_fn\.ais\.mode='m2po'",
    ):
        diagnostics_from_stats(compute_statistics(old, gen, m, ais), m2po)
    with pytest.raises(ValueError, match=r"shape \[10\], expected"):
        diagnostics_from_stats(AISStats(torch.zeros(10, dtype=torch.float64)), ais)
