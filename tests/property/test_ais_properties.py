# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Property-based tests (hypothesis) of the AIS statistics, mixer and loss.

Properties (ais_method.md / style.md):

* alpha in [alpha_min, alpha_max] and every diagnostic finite, for random valid configs and
  random inputs (EMA state advanced over several batches); R in (0, 1] whenever a
  sequence has a valid token; a globally empty batch gives alpha = 0.
* loss and gradients finite for any finite inputs, including log-ratios exactly at, just
  beyond and far beyond ``log_ratio_clamp`` (and log-probs of either sign), every mode;
  every metric too, at T up to 16384 (NeMo-RL's rollout metrics wherever their value is
  representable).
* each gate is monotone in its diagnostic: g_sev non-decreasing in D, g_rel
  non-decreasing in R, g_var non-increasing in CV^2 (driven through
  ``diagnostics_from_stats`` with hand-built sufficient statistics, since the gate
  functions are private).
* invariance: permuting sequences, re-batching into micro-batches (sum of statistics ==
  whole; sum of micro-batch losses == whole loss) and padding T with masked garbage.
* ``AISState`` round-trips through ``state_dict`` / ``load_state_dict`` and through
  ``torch.save`` / ``torch.load`` (``weights_only=True``) with identical later alphas.

Runs derandomized (same examples on every CI run); raise ``NEMO_AIS_HYPOTHESIS_EXAMPLES``
to explore more locally.
"""

from __future__ import annotations

import io
import itertools
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import (
    AISState,
    AISStats,
    clipped_pg_loss,
    compute_diagnostics,
    compute_statistics,
    diagnostics_from_stats,
)
from nemo_ais.core.mismatch import MISMATCH_EXTREMES

_EXAMPLES = int(os.environ.get("NEMO_AIS_HYPOTHESIS_EXAMPLES", "0"))


def _settings(n: int):
    return settings(
        max_examples=_EXAMPLES or n,
        deadline=None,
        derandomize=_EXAMPLES == 0,
        suppress_health_check=[HealthCheck.too_slow],
    )


RTOL = 1e-12  # float64 re-association only
MODES = ("none", "tis", "icepop", "seq_mask_geo", "ais")

# ---- strategies ------------------------------------------------------------------------------


def _unit(lo: float = 0.0, hi: float = 1.0, **kw):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, **kw)


@st.composite
def configs(draw, mode=None) -> CorrectionConfig:
    """Any valid CorrectionConfig (the bounds of config.py, kept finite)."""
    a_lo, a_hi = sorted(draw(st.tuples(_unit(), _unit())))
    ice_lo = draw(_unit(1e-3, 2.0))
    seq_lo = draw(_unit(0.5, 1.0))
    return CorrectionConfig(
        mode=mode or draw(st.sampled_from(MODES)),
        weight_cap=draw(_unit(1.0, 20.0, exclude_min=True)),
        seq_weight=draw(st.sampled_from(["geometric", "product"])),
        log_ratio_clamp=draw(st.sampled_from([20.0, 80.0]) | _unit(0.01, 80.0)),
        severity_scale=draw(_unit(1e-4, 100.0)),
        reliability_floor=draw(_unit(0.0, 1.0, exclude_max=True)),
        variance_tolerance=draw(_unit(1e-4, 100.0)),
        mixer=draw(st.sampled_from(["product", "constant"])),
        constant_alpha=draw(_unit()),
        use_severity_gate=draw(st.booleans()),
        use_reliability_gate=draw(st.booleans()),
        use_variance_gate=draw(st.booleans()),
        ema=draw(_unit(0.0, 1.0, exclude_max=True)),
        alpha_min=a_lo,
        alpha_max=a_hi,
        tis={"floor": draw(st.none() | _unit(0.0, 1.0, exclude_max=True))},
        icepop={"min": ice_lo, "max": ice_lo + draw(_unit(1e-3, 10.0))},
        seq_mask_geo={"min": seq_lo, "max": seq_lo + draw(_unit(1e-4, 1.0))},
    )


def _log_ratios(clamp: float):
    """Typical FP8 mismatch, values at / just beyond / far beyond the clamp, and huge ones."""
    edges = [0.0, clamp, -clamp, clamp * (1 + 1e-9), -clamp * (1 + 1e-9), 2 * clamp, -2 * clamp]
    return st.one_of(_unit(-0.5, 0.5), st.sampled_from(edges), _unit(-1e4, 1e4))


def _batch(gen, log_rho, log_r, valid, adv, dtype):
    """Inputs of clipped_pg_loss from float64 [B, T] log-probs and log-ratios.

    prev = gen + l, curr = prev + log r, ref = gen + log r reversed; masked positions hold
    garbage (50, NaN, -inf) that must not leak into the loss.
    """
    prev = gen + log_rho
    curr = prev + log_r
    ref = gen + log_r.flip(-1)

    def garbage(x, fill):
        return torch.where(valid, x, torch.full_like(x, fill)).to(dtype)

    return {
        "curr": garbage(curr, 50.0),
        "prev": garbage(prev, float("nan")),
        "gen": garbage(gen, float("-inf")),
        "ref": garbage(ref, float("nan")),
        "adv": torch.tensor(adv, dtype=dtype),
        "mask": valid.to(dtype),
    }


@st.composite
def batches(draw, clamp: float = 20.0, max_b: int = 5, max_t: int = 6, dtype=torch.float64):
    """A [B, T] batch with ragged masks; masked positions hold NaN / -inf garbage."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    n = b * t
    logp_rollout = draw(st.lists(_unit(-30.0, 0.0), min_size=n, max_size=n))
    log_rho = draw(st.lists(_log_ratios(clamp), min_size=n, max_size=n))
    log_r = draw(st.lists(_log_ratios(clamp), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    adv = draw(st.lists(_unit(-10.0, 10.0), min_size=b, max_size=b))

    def shaped(values):
        return torch.tensor(values, dtype=torch.float64).reshape(b, t)

    return _batch(shaped(logp_rollout), shaped(log_rho), shaped(log_r), shaped(mask).bool(), adv, dtype)


def _diag(x, cfg, state=None):
    return compute_diagnostics(x["prev"], x["gen"], x["mask"], cfg, state=state)


def _close(a: float, b: float, rtol: float = RTOL) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)


def _assert_diag_close(got, want, what: str):
    g, w = got.as_dict(), want.as_dict()
    bad = {k: (g[k], w[k]) for k in w if not _close(g[k], w[k])}
    assert not bad, f"{what}: {bad}"


# ---- alpha bounds, R in (0, 1], finiteness -----------------------------------------------------


@_settings(60)
@given(cfg=configs(mode="ais"), data=st.data())
def test_alpha_in_bounds_and_diagnostics_finite(cfg, data):
    state = AISState()
    for _ in range(3):  # EMA over several batches
        x = data.draw(batches(clamp=cfg.log_ratio_clamp))
        d = _diag(x, cfg, state)
        values = d.as_dict()
        assert all(math.isfinite(v) for v in values.values()), values
        if d.empty_batch:
            assert d.alpha == 0.0 and d.n_tok == 0.0
            continue
        assert cfg.alpha_min <= d.alpha <= cfg.alpha_max, (d.alpha, cfg)
        assert 0.0 <= d.alpha_raw <= 1.0
        for gate in (d.g_sev, d.g_rel, d.g_var):
            assert 0.0 <= gate <= 1.0
        assert d.n_seq >= 1
        assert 0.0 < d.ess_seq <= 1.0, d.ess_seq  # R in (0, 1]
        assert d.ess_seq >= 1.0 / d.n_seq * (1 - 1e-12)  # (sum W)^2 >= sum W^2
        assert d.severity >= 0.0 and d.cv2 >= 0.0 and 0.0 <= d.frac_capped <= 1.0
        # w_mean = 1 + sum(w - 1) / n: absolute accuracy ~1e-16, so w = exp(-37) reads as 0
        assert 0.0 <= d.w_mean <= cfg.weight_cap * (1 + 1e-12)


@_settings(40)
@given(x=batches(), data=st.data())
def test_all_masked_batch_gives_alpha_zero(x, data):
    cfg = data.draw(configs(mode="ais"))
    x["mask"] = torch.zeros_like(x["mask"])
    d = _diag(x, cfg, AISState())
    assert d.alpha == 0.0 and d.empty_batch == 1.0
    assert all(math.isfinite(v) for v in d.as_dict().values())


# ---- finite loss and gradients -----------------------------------------------------------------


_PG_CONFIGS = st.builds(
    PGLossConfig,
    ratio_clip_c=st.none() | _unit(1.0, 10.0, exclude_min=True),
    reference_policy_kl_penalty=st.sampled_from([0.0, 0.1]),
    reference_policy_kl_type=st.sampled_from(["k1", "k2", "k3"]),
    token_level_loss=st.booleans(),
    disable_ppo_ratio=st.booleans(),
)


@_settings(60)
@given(cfg=configs(), dtype=st.sampled_from([torch.float32, torch.float64]), pg=_PG_CONFIGS, data=st.data())
def test_loss_and_grads_finite_for_finite_inputs(cfg, dtype, pg, data):
    x = data.draw(batches(clamp=cfg.log_ratio_clamp, dtype=dtype))
    curr = x["curr"].clone().requires_grad_(True)
    out = clipped_pg_loss(
        curr, x["prev"], x["gen"], x["adv"], x["mask"], cfg, pg=pg,
        reference_logprobs=x["ref"], state=AISState(),
    )  # fmt: skip
    out.loss.backward()
    assert torch.isfinite(out.loss), (out.loss, cfg, pg)
    assert torch.isfinite(curr.grad).all(), (curr.grad, cfg, pg)
    assert (curr.grad[x["mask"] == 0] == 0).all()  # masked positions get no gradient
    bad = {k: v.item() for k, v in out.metrics.items() if not torch.isfinite(v)}
    assert not bad, bad


@st.composite
def long_batches(draw, clamp: float = 20.0, dtype=torch.float64):
    """[B, T] batches with T up to 16384: a few drawn values (extreme log-ratios included)
    spread over the positions by a drawn seed; masked positions hold NaN / -inf garbage."""
    b = draw(st.integers(1, 3))
    t = draw(st.sampled_from([1, 4096, 16384]) | st.integers(1, 16384))
    pools = [draw(st.lists(_log_ratios(clamp), min_size=1, max_size=6)) for _ in range(2)]
    adv = draw(st.lists(_unit(-10.0, 10.0), min_size=b, max_size=b))
    p_mask = draw(_unit(0.0, 1.0))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))

    def spread(pool):
        index = torch.randint(len(pool), (b, t), generator=g)
        return torch.tensor(pool, dtype=torch.float64)[index]

    gen = -30 * torch.rand(b, t, generator=g, dtype=torch.float64)
    log_rho, log_r = spread(pools[0]), spread(pools[1])
    valid = torch.rand(b, t, generator=g) >= p_mask
    return _batch(gen, log_rho, log_r, valid, adv, dtype)


def _finite_loss_and_metrics(x, cfg, pg, rollout_metrics):
    curr = x["curr"].clone().requires_grad_(True)
    n_tok = x["mask"].sum() * 3  # two more micro-batches of the global batch elsewhere
    out = clipped_pg_loss(
        curr, x["prev"], x["gen"], x["adv"], x["mask"], cfg, pg=pg,
        reference_logprobs=x["ref"], state=AISState(), global_valid_tokens=n_tok,
        rollout_metrics=rollout_metrics,
    )  # fmt: skip
    out.loss.backward()
    assert torch.isfinite(out.loss), (out.loss, cfg, pg)
    assert torch.isfinite(curr.grad).all(), (cfg, pg)
    assert (curr.grad[x["mask"] == 0] == 0).all()
    bad = {k: v.item() for k, v in out.metrics.items() if not torch.isfinite(v)}
    if x["mask"].sum() == 0:  # NeMo-RL's defined extremes of no token: +inf / -inf
        bad = {k: v for k, v in bad.items() if k not in MISMATCH_EXTREMES}
    assert not bad, (bad, cfg, pg)
    return out


@pytest.mark.parametrize("rollout_metrics", [False, True])
@_settings(40)
@given(cfg=configs(), dtype=st.sampled_from([torch.float32, torch.float64]), pg=_PG_CONFIGS, data=st.data())
def test_loss_and_every_metric_finite_up_to_t16384(rollout_metrics, cfg, dtype, pg, data):
    # Every metric is finite whenever the loss is: sums are taken of terms already divided
    # by their normaliser, so T = 16384 ratios of e^80 (log_ratio_clamp = 80) stay finite.
    # NeMo-RL's rollout metrics (rollout_metrics=True: exp(|l|), pi_theta / mu, ...) exceed
    # float32 in NeMo-RL's own definitions once |l| + |log r| > 88; ours clamp every
    # exponent at log_ratio_clamp, so they are finite at any log-ratio too.
    x = data.draw(long_batches(clamp=cfg.log_ratio_clamp, dtype=dtype))
    out = _finite_loss_and_metrics(x, cfg, pg, rollout_metrics=rollout_metrics)
    if x["mask"].sum() > 0 and not pg.disable_ppo_ratio:
        assert 0 < out.metrics["probs_ratio"].item() <= math.exp(cfg.log_ratio_clamp) * 1.0001


@pytest.mark.parametrize("mode", ["tis", "ais"])
def test_loss_finite_float32_at_max_log_ratio_clamp(mode):
    # Regression for a float32 overflow found by the finiteness property on a larger batch:
    # log_ratio_clamp = 80 is accepted by CorrectionConfig (it keeps exp() finite in
    # float32), but the per-token terms are then up to |A| * C * e^80 ~ 1.1e36 and their
    # float32 SUM over ~300+ tokens exceeds float32 max (3.4e38): loss = inf for finite
    # inputs. Here: log pi_theta - log pi_old = 100 (clamped to 80), A = -10, C = 2,
    # T = 4096 tokens. Expected: a finite loss (e.g. accumulate the loss sum in float64,
    # or bound the PPO-ratio clamp separately), as the contract "finite for any finite
    # input, including at the clamp bounds" (style.md) requires.
    cfg = CorrectionConfig(mode=mode, log_ratio_clamp=80.0, weight_cap=2.0)
    t = 4096
    gen = torch.full((1, t), -1.0)
    prev = gen + 85.0  # l = 85: beyond the clamp, rho capped at C
    curr = (prev + 100.0).requires_grad_(True)
    out = clipped_pg_loss(curr, prev, gen, torch.tensor([-10.0]), torch.ones(1, t), cfg)
    out.loss.backward()
    assert torch.isfinite(curr.grad).all()
    assert torch.isfinite(out.loss), f"float32 loss overflowed: {out.loss.item()}"
    bad = {k: v.item() for k, v in out.metrics.items() if not torch.isfinite(v)}
    assert not bad, bad


def test_approx_entropy_term_saturates_instead_of_overflowing_float32():
    # Regression for the finiteness property's falsifying example: pi_theta / mu clamps at
    # e^80, and e^80 * |log pi_theta| = 5.5e34 * 6142 overflows float32, so NeMo-RL's
    # definition gives approx_entropy = -inf for a finite loss. Each token's term saturates
    # at float32's largest value: the metric is -max / 3 (one of the 3 global tokens).
    cfg = CorrectionConfig(mode="none", log_ratio_clamp=80.0, weight_cap=2.0)
    gen = torch.tensor([[-1.8316]])
    curr = torch.tensor([[6142.1685]])
    out = clipped_pg_loss(
        curr, gen.clone(), gen, torch.tensor([0.0]), torch.ones(1, 1), cfg,
        global_valid_tokens=torch.tensor(3.0), rollout_metrics=True,
    )  # fmt: skip
    got = out.metrics["mismatch/entropy"].item()
    assert math.isfinite(got)
    assert got == pytest.approx(-torch.finfo(torch.float32).max / 3, rel=1e-6)
    # below the clamp it is NeMo-RL's definition: -(pi_theta / mu) log pi_theta / n
    curr = torch.tensor([[-1.0]])
    out = clipped_pg_loss(
        curr, gen.clone(), gen, torch.tensor([0.0]), torch.ones(1, 1), cfg,
        global_valid_tokens=torch.tensor(3.0), rollout_metrics=True,
    )  # fmt: skip
    want = math.exp(-1.0 + 1.8316) * 1.0 / 3
    assert out.metrics["mismatch/entropy"].item() == pytest.approx(want, rel=1e-5)


@_settings(30)
@given(cfg=configs(mode="ais"), x=batches())
def test_mask_dtype_and_layout_do_not_matter(cfg, x):
    base = compute_statistics(x["prev"], x["gen"], x["mask"], cfg).vector
    valid = x["mask"].bool()
    for mask in (valid, valid.long(), valid.to(torch.uint8), valid.float()):
        got = compute_statistics(x["prev"], x["gen"], mask, cfg).vector
        assert torch.equal(got, base), mask.dtype
    # non-contiguous views (NeMo-RL slices [:, 1:] of bigger tensors)
    wide = torch.cat([x["prev"], x["gen"]], dim=1)
    t = x["prev"].shape[1]
    got = compute_statistics(wide[:, :t], wide[:, t:], x["mask"].t().contiguous().t(), cfg)
    # strides change torch's summation order: equal up to float64 re-association
    torch.testing.assert_close(got.vector, base, rtol=RTOL, atol=1e-12)


# ---- monotonicity of each gate (through diagnostics_from_stats) ----------------------------------


def _stats(n_seq, w_sum, w_sq_sum, n_tok, abs_sum, wt_sum, wt_sq_sum) -> AISStats:
    return AISStats.from_sums(
        n_seq=n_seq, w_seq_sum=w_sum, w_seq_sq_sum=w_sq_sum, n_tok=n_tok,
        abs_log_rho_sum=abs_sum, w_tok_sum=wt_sum, w_tok_sq_sum=wt_sq_sum,
    )  # fmt: skip


def _base(n_seq=8.0, n_tok=64.0, severity=0.05, ess=0.9, cv2=0.2, w_seq_sum=8.0, w_sum=64.0):
    """Stats with the given D, R and CV^2 (inverting the three formulas)."""
    w_seq_sq_sum = w_seq_sum**2 / (n_seq * ess)
    wt_sq_sum = (1 + cv2) * w_sum**2 / n_tok
    return dict(
        n_seq=n_seq, w_sum=w_seq_sum, w_sq_sum=w_seq_sq_sum, n_tok=n_tok,
        abs_sum=severity * n_tok, wt_sum=w_sum, wt_sq_sum=wt_sq_sum,
    )  # fmt: skip


_gate_cfg = configs(mode="ais")


@_settings(50)
@given(
    cfg=_gate_cfg,
    d=st.tuples(_unit(0.0, 50.0), _unit(0.0, 50.0)).map(sorted),
    ess=_unit(0.01, 1.0),
    cv2=_unit(0.0, 100.0),
)
def test_g_sev_non_decreasing_in_severity(cfg, d, ess, cv2):
    lo = diagnostics_from_stats(_stats(**_base(severity=d[0], ess=ess, cv2=cv2)), cfg)
    hi = diagnostics_from_stats(_stats(**_base(severity=d[1], ess=ess, cv2=cv2)), cfg)
    assert lo.severity <= hi.severity
    assert lo.g_sev <= hi.g_sev, (d, lo.g_sev, hi.g_sev)
    if cfg.mixer == "product":
        assert lo.alpha_raw <= hi.alpha_raw * (1 + 1e-12)


@_settings(50)
@given(
    cfg=_gate_cfg,
    r=st.tuples(_unit(0.01, 1.0), _unit(0.01, 1.0)).map(sorted),
    severity=_unit(0.0, 5.0),
    cv2=_unit(0.0, 100.0),
)
def test_g_rel_non_decreasing_in_reliability(cfg, r, severity, cv2):
    lo = diagnostics_from_stats(_stats(**_base(ess=r[0], severity=severity, cv2=cv2)), cfg)
    hi = diagnostics_from_stats(_stats(**_base(ess=r[1], severity=severity, cv2=cv2)), cfg)
    assert lo.ess_seq <= hi.ess_seq * (1 + 1e-12)
    assert 0.0 < lo.ess_seq <= 1.0 and 0.0 < hi.ess_seq <= 1.0
    assert lo.g_rel <= hi.g_rel * (1 + 1e-12) + 1e-15, (r, lo.g_rel, hi.g_rel)
    if cfg.mixer == "product":
        assert lo.alpha_raw <= hi.alpha_raw * (1 + 1e-12) + 1e-15


@_settings(50)
@given(
    cfg=_gate_cfg,
    c=st.tuples(_unit(0.0, 1e3), _unit(0.0, 1e3)).map(sorted),
    severity=_unit(0.0, 5.0),
    ess=_unit(0.01, 1.0),
)
def test_g_var_non_increasing_in_cv2(cfg, c, severity, ess):
    lo = diagnostics_from_stats(_stats(**_base(cv2=c[0], severity=severity, ess=ess)), cfg)
    hi = diagnostics_from_stats(_stats(**_base(cv2=c[1], severity=severity, ess=ess)), cfg)
    assert lo.cv2 <= hi.cv2 * (1 + 1e-12) + 1e-15
    assert lo.g_var * (1 + 1e-12) + 1e-15 >= hi.g_var, (c, lo.g_var, hi.g_var)
    if cfg.mixer == "product":
        assert lo.alpha_raw * (1 + 1e-12) + 1e-15 >= hi.alpha_raw


def test_gates_hand_worked_values():
    # D = 0.02 = tau -> g_sev = 1 - e^-1; R = 0.75, r_min = 0.5 -> g_rel = 0.5;
    # CV^2 = 1 = kappa -> g_var = 0.5; alpha = (1 - e^-1) / 4 = 0.158030...
    cfg = CorrectionConfig()
    d = diagnostics_from_stats(_stats(**_base(severity=0.02, ess=0.75, cv2=1.0)), cfg)
    assert _close(d.g_sev, 1 - math.exp(-1), 1e-14)
    assert _close(d.g_rel, 0.5, 1e-14) and _close(d.g_var, 0.5, 1e-14)
    assert _close(d.alpha, (1 - math.exp(-1)) / 4, 1e-14)


# ---- invariance: permutation, re-batching, padding ---------------------------------------------


@_settings(40)
@given(cfg=configs(mode="ais"), x=batches(max_b=6), data=st.data())
def test_permutation_of_sequences_changes_nothing(cfg, x, data):
    b = x["mask"].shape[0]
    perm = torch.tensor(data.draw(st.permutations(range(b))))
    xp = {k: v[perm] for k, v in x.items()}
    d, dp = _diag(x, cfg), _diag(xp, cfg)
    _assert_diag_close(dp, d, "permuted diagnostics")
    curr, curr_p = x["curr"].clone().requires_grad_(True), xp["curr"].clone().requires_grad_(True)
    loss = clipped_pg_loss(curr, x["prev"], x["gen"], x["adv"], x["mask"], cfg, diagnostics=d)
    loss_p = clipped_pg_loss(curr_p, xp["prev"], xp["gen"], xp["adv"], xp["mask"], cfg, diagnostics=d)
    (loss.loss + loss_p.loss).backward()
    assert _close(loss_p.loss.item(), loss.loss.item())
    torch.testing.assert_close(curr_p.grad, curr.grad[perm], rtol=RTOL, atol=1e-300)


@_settings(40)
@given(cfg=configs(mode="ais"), x=batches(max_b=6), data=st.data())
def test_rebatching_sums_statistics_and_losses(cfg, x, data):
    b = x["mask"].shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(0, b), max_size=3)))
    bounds = [0, *cuts, b]
    parts = [slice(lo, hi) for lo, hi in itertools.pairwise(bounds)]  # B=0 parts too
    whole = compute_statistics(x["prev"], x["gen"], x["mask"], cfg)
    summed = sum(compute_statistics(x["prev"][s], x["gen"][s], x["mask"][s], cfg).vector for s in parts)
    torch.testing.assert_close(summed, whole.vector, rtol=RTOL, atol=0)
    d_whole = diagnostics_from_stats(whole, cfg)
    _assert_diag_close(diagnostics_from_stats(AISStats(summed), cfg), d_whole, "re-batched")

    n_tok = x["mask"].sum()
    want = clipped_pg_loss(x["curr"], x["prev"], x["gen"], x["adv"], x["mask"], cfg,
                           diagnostics=d_whole).loss  # fmt: skip
    got = [
        clipped_pg_loss(
            x["curr"][s], x["prev"][s], x["gen"][s], x["adv"][s], x["mask"][s], cfg,
            diagnostics=d_whole, global_valid_tokens=n_tok,
        ).loss.item()
        for s in parts
    ]  # fmt: skip
    assert _close(math.fsum(got), want.item()), (got, want)


@_settings(30)
@given(cfg=configs(mode="ais"), x=batches(), pad=st.integers(1, 4))
def test_padding_t_with_masked_garbage_changes_nothing(cfg, x, pad):
    fills = {"curr": 1e30, "prev": float("nan"), "gen": float("-inf"), "ref": 7.0, "mask": 0.0}
    xp = dict(x)
    for k, fill in fills.items():
        xp[k] = torch.nn.functional.pad(x[k], (0, pad), value=fill)
    s, sp = (compute_statistics(y["prev"], y["gen"], y["mask"], cfg) for y in (x, xp))
    torch.testing.assert_close(sp.vector, s.vector, rtol=RTOL, atol=0)


# ---- EMA state round trip -----------------------------------------------------------------------


@_settings(25)
@given(ema=_unit(0.05, 0.95), n_before=st.integers(0, 3), data=st.data())
def test_ema_state_round_trips(ema, n_before, data):
    cfg = CorrectionConfig(ema=ema, severity_scale=1.0)
    steps = [data.draw(batches()) for _ in range(n_before + 3)]
    state = AISState()
    for x in steps[:n_before]:
        _diag(x, cfg, state)
    restored, reloaded = AISState(), AISState()
    restored.load_state_dict(state.state_dict())
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    buf.seek(0)
    reloaded.load_state_dict(torch.load(buf, weights_only=True))
    for x in steps[n_before:]:
        a = _diag(x, cfg, state).alpha
        assert _diag(x, cfg, restored).alpha == a
        assert _diag(x, cfg, reloaded).alpha == a
    assert state.state_dict() == restored.state_dict() == reloaded.state_dict()


def test_ema_matches_recursion_by_hand():
    # beta = 0.5: alpha_1 = a1 (no history), alpha_2 = 0.5 a1 + 0.5 a2, ...; an empty batch
    # leaves the state unchanged.
    cfg = CorrectionConfig(ema=0.5, severity_scale=1.0)
    no_ema = CorrectionConfig(severity_scale=1.0)
    gen = torch.Generator().manual_seed(3)
    xs = []
    for scale in (0.05, 0.5, 0.2):
        g = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
        xs.append({"gen": g, "prev": g + scale * torch.randn(3, 4, generator=gen, dtype=torch.float64),
                   "mask": torch.ones(3, 4, dtype=torch.float64)})  # fmt: skip
    raw = [_diag(x, no_ema).alpha for x in xs]
    state = AISState()
    got = [_diag(x, cfg, state).alpha for x in xs[:2]]
    empty = dict(xs[0], mask=torch.zeros(3, 4, dtype=torch.float64))
    assert _diag(empty, cfg, state).alpha == 0.0
    assert state.num_updates == 3  # counted, but the empty batch kept alpha
    got.append(_diag(xs[2], cfg, state).alpha)
    want = [raw[0], 0.5 * raw[0] + 0.5 * raw[1]]
    want.append(0.5 * want[1] + 0.5 * raw[2])
    assert all(_close(a, b, 1e-14) for a, b in zip(got, want, strict=True)), (got, want)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
