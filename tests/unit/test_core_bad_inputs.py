# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Bad input at the core boundary: a clear error naming the tensor, or a documented finite result."""

from __future__ import annotations

import oracles
import pytest
import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import clipped_pg_loss, compute_diagnostics

B, T = 4, 8
AIS = CorrectionConfig(mode="ais")


def _batch(dtype=torch.float32):
    return oracles.random_batch(B, T, scale=0.05, seed=21, dtype=dtype)


def _loss(b, cfg=AIS, pg=None, **kw):
    theta = b["logp_theta"].clone().requires_grad_() if b["logp_theta"].is_floating_point() else b["logp_theta"]
    args = dict(
        curr_logprobs=theta,
        prev_logprobs=b["logp_old"],
        generation_logprobs=b["logp_rollout"],
        advantages=b["adv"],
        mask=b["mask"],
    )
    args.update(kw)
    out = clipped_pg_loss(**args, config=cfg, pg=pg, reference_logprobs=b.get("ref"))
    out.loss.backward()
    return out, theta.grad


def _assert_finite(out, grad):
    assert torch.isfinite(out.loss)
    assert grad is None or torch.isfinite(grad).all()
    for name, value in out.metrics.items():
        assert value.dim() == 0 and torch.isfinite(value), name


# --- non-finite values: ValueError naming the tensor, the count and the first index --------


@pytest.mark.parametrize(
    "name,key",
    [("curr_logprobs", "logp_theta"), ("prev_logprobs", "logp_old"), ("generation_logprobs", "logp_rollout")],
)
@pytest.mark.parametrize("bad", [torch.nan, torch.inf, -torch.inf])
def test_non_finite_logprob_at_valid_position(name, key, bad):
    b = _batch()
    b["logp_rollout"] = b["logp_old"] + 0.01  # no -inf padding anywhere in this test
    b[key] = b[key].clone()
    b[key][2, 3] = bad
    b[key][3, 5] = bad
    b["mask"][2, 3] = b["mask"][3, 5] = 1
    with pytest.raises(ValueError, match=rf"{name}: 2 non-finite values .* first at index \(2, 3\)"):
        _loss(b)


def test_non_finite_reference_logprobs():
    b = _batch()
    b["ref"] = b["logp_ref"].clone()
    b["ref"][1, 0] = torch.nan
    with pytest.raises(ValueError, match=r"reference_logprobs: 1 non-finite .* \(1, 0\)"):
        _loss(b, pg=PGLossConfig(reference_policy_kl_penalty=0.1))


def test_non_finite_advantage():
    b = _batch()
    b["adv"] = b["adv"].clone()
    b["adv"][2] = torch.inf
    with pytest.raises(ValueError, match=r"advantages: 1 non-finite .* \(2,\)"):
        _loss(b)


def test_non_finite_in_compute_diagnostics():
    b = _batch()
    b["logp_old"][0, 0] = torch.nan
    with pytest.raises(ValueError, match=r"prev_logprobs: 1 non-finite .* \(0, 0\)"):
        compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS)


# --- masked garbage is ignored (documented) ----------------------------------------------


@pytest.mark.parametrize("mode", ["none", "tis", "icepop", "seq_mask_geo", "ais"])
def test_neg_inf_and_nan_at_masked_positions_are_ignored(mode):
    b = _batch()
    b["mask"][:, -3:] = 0
    clean = {k: v.clone() for k, v in b.items()}
    for key in ("logp_theta", "logp_old"):
        b[key][:, -3:] = -torch.inf
    b["logp_rollout"][:, -2:] = torch.nan
    cfg = CorrectionConfig(mode=mode)
    out, grad = _loss(b, cfg)
    ref, ref_grad = _loss(clean, cfg)
    _assert_finite(out, grad)
    assert torch.equal(out.loss, ref.loss) and torch.equal(grad, ref_grad)
    assert (grad[:, -3:] == 0).all()


# --- huge log-ratios: finite thanks to the clamps ------------------------------------------


@pytest.mark.parametrize("mode", ["none", "tis", "icepop", "seq_mask_geo", "ais"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_log_ratios_of_1e4_stay_finite(mode, sign):
    b = _batch()
    b["logp_rollout"] = b["logp_old"] - sign * 1e4  # l = +-1e4 between pi_old and mu
    b["logp_theta"] = b["logp_old"] + sign * 1e4  # and between pi_theta and pi_old
    b["ref"] = b["logp_old"] - 1e4
    pg = PGLossConfig(reference_policy_kl_penalty=0.1)
    out, grad = _loss(b, CorrectionConfig(mode=mode), pg)
    _assert_finite(out, grad)
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS)
    assert all(torch.isfinite(torch.tensor(v)) for v in diag.as_dict().values())
    assert 0 <= diag.alpha <= 1


# --- shape / dtype / device ----------------------------------------------------------------


def test_shape_mismatch_message():
    b = _batch()
    b["logp_rollout"] = torch.zeros(B, T - 1, dtype=torch.float16)
    msg = r"generation_logprobs: got \[4, 7\] float16, expected \[4, 8\] float32 like prev_logprobs"
    with pytest.raises(ValueError, match=msg):
        _loss(b)


def test_integer_logprobs_rejected():
    b = _batch()
    b["logp_old"] = torch.zeros(B, T, dtype=torch.int64)
    with pytest.raises((TypeError, ValueError), match="prev_logprobs"):
        _loss(b)


def test_curr_logprobs_not_a_tensor():
    b = _batch()
    b["logp_theta"] = b["logp_theta"].tolist()
    with pytest.raises(TypeError, match="curr_logprobs: got list"):
        clipped_pg_loss(b["logp_theta"], b["logp_old"], b["logp_rollout"], b["adv"], b["mask"], AIS)


def test_prev_logprobs_wrong_rank():
    b = _batch()
    with pytest.raises(ValueError, match=r"prev_logprobs: got \[32\] float32, expected a \[B, T\]"):
        _loss(b, prev_logprobs=b["logp_old"].reshape(-1))


def test_advantages_wrong_shape():
    b = _batch()
    with pytest.raises(ValueError, match=r"advantages: got \[3\] .* expected \[4, 8\] or \[4\]"):
        _loss(b, advantages=b["adv"][:3])


def test_mask_wrong_shape():
    b = _batch()
    with pytest.raises(ValueError, match=r"mask: got \[4, 9\]"):
        _loss(b, mask=torch.ones(B, T + 1))


def test_device_mismatch_message():
    b = _batch()
    meta = b["logp_rollout"].to("meta")
    with pytest.raises(ValueError, match="generation_logprobs: got device meta, expected cpu"):
        _loss(b, generation_logprobs=meta)


# --- mask values ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.5, -1.0, 2.0, torch.nan])
def test_mask_values_not_binary(value):
    b = _batch()
    b["mask"][1, 2] = value
    with pytest.raises(ValueError, match=r"mask: 1 values not in \{0, 1\}.*\(1, 2\)"):
        _loss(b)
    with pytest.raises(ValueError, match=r"mask: 1 values not in \{0, 1\}"):
        compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS)


@pytest.mark.parametrize(
    ("value", "dtype"), [(1e-60, torch.float64), (1 + 1e-12, torch.float64), (1e-30, torch.float32)]
)
@pytest.mark.parametrize("mode", ["none", "tis", "tbpo", "ais"])
def test_mask_values_a_cast_or_a_sum_would_round_away(mode, value, dtype):
    # float32 log-probs: a float64 mask cast to float32 rounds 1e-60 to 0 and 1 + 1e-12 to
    # 1; in float32, 1e-30 squared underflows and sum(m^2) = sum(m) held
    b = _batch()
    b["mask"] = b["mask"].to(dtype)
    b["mask"][1, 2] = value
    with pytest.raises(ValueError, match=r"mask: 1 values not in \{0, 1\}.*\(1, 2\)"):
        _loss(b, CorrectionConfig(mode=mode), PGLossConfig(token_level_loss=mode != "tbpo"))


def test_bool_and_integer_masks_equal_float_mask():
    b = _batch()
    ref, g_ref = _loss(b)
    for mask in (b["mask"].bool(), b["mask"].long()):
        out, g = _loss(b, mask=mask)
        assert torch.equal(out.loss, ref.loss) and torch.equal(g, g_ref)


def test_missing_reference_logprobs():
    b = _batch()
    with pytest.raises(ValueError, match="reference_logprobs: got None"):
        _loss(b, pg=PGLossConfig(reference_policy_kl_penalty=0.1))


# --- degenerate batches: documented finite results ----------------------------------------


@pytest.mark.parametrize("shape", [(0, T), (B, 0), (0, 0)])
@pytest.mark.parametrize("mode", ["none", "ais"])
def test_empty_batch_shapes(shape, mode):
    z = torch.zeros(shape)
    theta = z.clone().requires_grad_()
    out = clipped_pg_loss(theta, z, z, torch.zeros(shape[0]), z, CorrectionConfig(mode=mode))
    out.loss.backward()
    assert out.loss.item() == 0.0 and theta.grad.shape == shape
    _assert_finite(out, theta.grad)
    if mode == "ais":
        assert out.metrics["ais/empty_batch"].item() == 1.0
        assert out.metrics["ais/alpha"].item() == 0.0


@pytest.mark.parametrize("token_level", [True, False])
def test_all_tokens_masked(token_level):
    b = _batch()
    b["mask"].zero_()
    b["logp_rollout"].fill_(-torch.inf)
    b["ref"] = b["logp_ref"]
    out, grad = _loss(b, pg=PGLossConfig(token_level_loss=token_level, reference_policy_kl_penalty=0.1))
    _assert_finite(out, grad)
    assert out.loss.item() == 0.0 and (grad == 0).all()
    assert out.metrics["ais/empty_batch"].item() == 1.0 and out.metrics["ais/alpha"].item() == 0.0
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS)
    assert diag.alpha == 0.0 and diag.empty_batch == 1.0


def test_bf16_inputs_finite_and_close():
    b16 = _batch(torch.bfloat16)
    b32 = {k: v.float() for k, v in b16.items()}
    out16, g16 = _loss(b16)
    out32, _ = _loss(b32)
    _assert_finite(out16, g16.float())
    torch.testing.assert_close(out16.loss, out32.loss, rtol=1e-6, atol=1e-7)


def _fake_group(monkeypatch, other_rank_flags: dict, other_rank_text: str | None):
    """Stand-ins for the two collectives: rank 1 of 2 adds ``other_rank_flags`` / its text."""
    import nemo_ais.core.diagnostics as diagnostics_module
    from nemo_ais.core import AISStats

    def fake_reduce(stats, group):
        vector = stats.vector.clone()
        for slot, value in other_rank_flags.items():
            vector[slot] += value
        return AISStats(vector)

    def fake_gather(local_text, group):
        entries = [(0, 0, local_text), (1, 1, other_rank_text)]
        return [entry for entry in entries if entry[2] is not None]

    monkeypatch.setattr(diagnostics_module, "reduce_statistics", fake_reduce)
    monkeypatch.setattr(diagnostics_module, "_gather_error_texts", fake_gather)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)


def test_bad_values_on_another_rank_raise_here_too(monkeypatch):
    # The all-reduce brings in one NaN from rank 1: this rank's (0) shard is clean but it
    # must raise with everyone else (no rank may continue into the next collective).
    from nemo_ais.core import Slot

    text = "generation_logprobs: 1 non-finite values (NaN or +-inf) at valid positions"
    _fake_group(monkeypatch, {Slot.N_BAD_LOGPROBS: 1, Slot.N_BAD_RANKS: 1}, text)
    b = _batch()
    with pytest.raises(ValueError) as clean_here:
        compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS, group=object())
    msg = str(clean_here.value)
    assert msg.startswith("AIS statistics: bad input on 1 of 2 ranks of the process group")
    assert f"\n  rank 1: {text}" in msg and "rank 0:" not in msg
    b["logp_old"][1, 0] = torch.nan  # now this rank is bad too: both are listed, in order
    with pytest.raises(ValueError, match=r"(?s)2 of 2 ranks.*rank 0: prev_logprobs: 1 non-finite"
                       r".*\(1, 0\).*rank 1: generation_logprobs"):  # fmt: skip
        compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS, group=object())


def test_structural_error_joins_the_collective_with_a_group(monkeypatch):
    # With a group a shape error is flagged in the all-reduce instead of raised alone.
    _fake_group(monkeypatch, {}, None)
    b = _batch()
    short = b["logp_rollout"][:, :-1]
    with pytest.raises(ValueError, match=r"1 rank\(s\) with a wrong shape.*\n  rank 0: "
                       r"generation_logprobs: got \[4, 7\]"):  # fmt: skip
        compute_diagnostics(b["logp_old"], short, b["mask"], AIS, group=object())
    with pytest.raises(ValueError, match=r"rank 0: advantages: got \[3\]"):
        _loss(b, advantages=b["adv"][:3], group=object())


def test_input_error_without_a_group_is_raised_as_is():
    b = _batch()
    missing = KeyError("token_mask: missing from the loss data")
    with pytest.raises(KeyError, match="token_mask: missing") as info:
        compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], AIS, input_error=missing)
    assert info.value is missing


def test_compute_diagnostics_wants_2d():
    b = _batch()
    flat = b["logp_old"].reshape(-1)
    with pytest.raises(ValueError, match=r"prev_logprobs: got \[32\] float32, expected a \[B, T\]"):
        compute_diagnostics(flat, flat, torch.ones(32), AIS)


# --- global normalisers: NaN, inf, <= 0 with valid tokens, or below this batch's own count --

_BAD_COUNTS = {
    "nan": (lambda n: torch.nan, "it is not finite"),
    "+inf": (lambda n: torch.inf, "it is not finite"),
    "-inf": (lambda n: -torch.inf, "it is not finite"),
    "zero": (lambda n: 0.0, "it is <= 0 while this call has"),
    "negative": (lambda n: -3.0, "it is <= 0 while this call has"),
    "below-local": (lambda n: n - 1, "it is smaller than this call's own"),
}


@pytest.mark.parametrize("as_tensor", [True, False], ids=["0-dim-tensor", "python-float"])
@pytest.mark.parametrize("bad", list(_BAD_COUNTS))
@pytest.mark.parametrize("arg,local", [("global_valid_tokens", "tokens"), ("global_valid_seqs", "sequences")])
def test_bad_global_count_names_the_argument(arg, local, bad, as_tensor):
    b = _batch()
    n_local = {"tokens": b["mask"].sum().item(), "sequences": float(B)}[local]  # every row valid
    make, why = _BAD_COUNTS[bad]
    value = make(n_local)
    value = torch.tensor(value) if as_tensor else value
    with pytest.raises(ValueError, match=rf"^{arg}=.* is invalid: expected a finite count >= ") as e:
        _loss(b, **{arg: value})
    assert why in str(e.value) and f">= {n_local:g} (the valid {local}" in str(e.value)


def test_global_counts_at_or_above_the_local_ones_are_accepted():
    # N_tok = local (one micro-batch is the whole batch) and N_tok = 3 x local (two more
    # micro-batches elsewhere) both pass, and scale the loss by exactly 1/3.
    b = _batch(torch.float64)
    n_tok, n_seq = b["mask"].sum(), torch.tensor(float(B))
    whole, _ = _loss(b, global_valid_tokens=n_tok, global_valid_seqs=n_seq)
    third, _ = _loss(b, global_valid_tokens=3 * n_tok, global_valid_seqs=3 * n_seq)
    assert third.loss.item() == pytest.approx(whole.loss.item() / 3, rel=1e-14)


def test_zero_global_counts_with_no_valid_token_are_the_empty_global_batch():
    b = _batch()
    b["mask"].zero_()
    out, grad = _loss(b, global_valid_tokens=torch.tensor(0.0), global_valid_seqs=0)
    _assert_finite(out, grad)
    assert out.loss.item() == 0.0 and (grad == 0).all()
    assert out.metrics["ais/empty_batch"].item() == 1.0


# --- every metric finite whenever the loss is: probs_ratio at T = 16384, clamp 80 ---------------


@pytest.mark.parametrize("mode", ["none", "tis", "ais", "seq_mask_geo"])
def test_probs_ratio_finite_at_t16384_with_clamp_80(mode):
    # log pi_theta - log pi_old = 100 -> clamped to 80, so every r = e^80 ~ 5.54e34. The mean
    # is e^80, but the float32 SUM of 16384 of them (9.1e38) exceeds float32 max (3.4e38):
    # summing before dividing gave probs_ratio = inf next to a finite loss.
    cfg = CorrectionConfig(mode=mode, log_ratio_clamp=80.0, weight_cap=2.0, seq_mask_geo={"min": 0.5, "max": 2.0})
    t = 16384
    gen = torch.full((1, t), -1.0)
    prev = gen + 0.01
    curr = (prev + 100.0).requires_grad_(True)
    out = clipped_pg_loss(curr, prev, gen, torch.tensor([-1.0]), torch.ones(1, t), cfg, rollout_metrics=True)
    out.loss.backward()
    assert torch.isfinite(curr.grad).all()
    bad = {k: v.item() for k, v in out.metrics.items() if not torch.isfinite(v)}
    assert not bad, bad
    e80 = torch.tensor(80.0).exp().item()  # float32 e^80
    assert out.metrics["probs_ratio"].item() == pytest.approx(e80, rel=1e-6)
    assert out.metrics["mismatch/ratio_max"].item() == e80  # the element itself, no rounding
    assert out.metrics["probs_ratio_clamped"].item() == pytest.approx(1.2, rel=1e-6)


@pytest.mark.parametrize("mode", ["none", "tis", "ais"])
def test_rollout_metrics_saturate_at_the_clamp_instead_of_overflowing(mode):
    # log pi_old - log mu = 95 and log pi_theta - log pi_old = 3: NeMo-RL's definitions give
    # exp(95) (token_mult_prob_error) and -exp(98) * log pi_theta (approx_entropy), both inf
    # in float32 next to a finite loss. Ours clamp each exponent at log_ratio_clamp = 80.
    cfg = CorrectionConfig(mode=mode, log_ratio_clamp=80.0, weight_cap=2.0)
    t = 4096
    gen = torch.full((2, t), -100.0)
    prev = gen + 95.0
    curr = prev + 3.0  # log pi_theta = -2
    out = clipped_pg_loss(curr, prev, gen, torch.tensor([1.0, -1.0]), torch.ones(2, t), cfg, rollout_metrics=True)
    assert torch.isfinite(out.loss)
    bad = {k: v.item() for k, v in out.metrics.items() if not torch.isfinite(v)}
    assert not bad, bad
    e80 = torch.tensor(80.0).exp().item()
    assert out.metrics["mismatch/mult_prob_error"].item() == pytest.approx(e80, rel=1e-5)
    # pi_theta / mu = e^98 saturates at e^80: -(e^80 * -2)
    assert out.metrics["mismatch/entropy"].item() == pytest.approx(2.0 * e80, rel=1e-5)


@pytest.mark.parametrize("arg", ["global_valid_tokens", "global_valid_seqs"])
def test_global_count_of_the_wrong_kind_names_the_argument(arg):
    logp = torch.full((2, 4), -1.0)
    args = (logp.clone().requires_grad_(True), logp, logp, torch.ones(2), torch.ones(2, 4))
    cfg = CorrectionConfig(mode="ais")
    with pytest.raises(ValueError, match=rf"^{arg}: got a tensor of shape \[2\], expected a scalar"):
        clipped_pg_loss(*args, cfg, **{arg: torch.tensor([8.0, 8.0])})
    for bad in ("8", True):
        with pytest.raises(TypeError, match=rf"^{arg}: got (str|bool) .*expected a scalar count"):
            clipped_pg_loss(*args, cfg, **{arg: bad})
