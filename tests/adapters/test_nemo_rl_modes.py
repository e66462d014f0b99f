# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Issue 17's correction modes through the NeMo-RL adapter (needs NeMo-RL importable).

* ``loss_fn.ais`` accepts every new key (``AISLossConfig`` validates through
  ``CorrectionConfig``), and a bad one names its ``loss_fn.ais.<field>`` path.
* With mu = pi_old (``generation_logprobs == prev_logprobs``) every IS / rejection mode,
  through ``AISClippedPGLossFn``, equals NeMo-RL's own ``ClippedPGLossFn`` without
  correction (loss and gradient, float64, rtol 1e-12: only the summation order differs).
* ``bypass`` equals ``ClippedPGLossFn`` run on the same data with ``prev_logprobs``
  replaced by ``generation_logprobs`` (pi_old := mu).
* Every new mode (tbpo included) through the adapter equals core's ``clipped_pg_loss`` on
  the mapped tensors with the prepared diagnostics: the adapter holds no math.
* NeMo-RL's ``use_cispo``, ``sequence_level_importance_ratios`` (GSPO),
  ``use_on_policy_kl_approximation``, ``positive_example_nll_weight`` (VAPO) and the KL
  term's ``curr_logprobs_unfiltered`` (top-k / top-p training, put in the data by
  upstream's own ``prepare_loss_input``) with an AIS loss: with mu = pi_old, equal to
  ``ClippedPGLossFn`` (loss, gradient to every log-prob tensor, NeMo-RL's metrics); the
  combinations upstream asserts against are config errors naming ``loss_fn.<field>``.
"""

from __future__ import annotations

import math

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
from nemo_rl.algorithms.logits_sampling_utils import TrainingSamplingParams
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl.algorithms.loss.utils import prepare_loss_input
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_batches import global_counts, nemo_rl_batch

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import clipped_pg_loss, compute_diagnostics
from nemo_ais.nemo_rl import AISClippedPGLossFn, validate_loss_config
from nemo_ais.nemo_rl.loss import pg_loss_config
from nemo_ais.nemo_rl.seam import core_inputs, prepare_global_batches

pytestmark = pytest.mark.nemo_rl

B, S = 6, 12
RTOL = 1e-12  # float64; only the order of the sums differs
BASE = {"reference_policy_kl_penalty": 0.01, "ratio_clip_c": 3.0}
TBPO_WIDE = {"tbpo": {"clip_low": 0.05, "clip_high": 0.08, "neg_clip_low": 0.04, "neg_clip_high": 0.06}}
IS_MODES = {
    "seq_tis": {"mode": "seq_tis"},
    "seq_mis": {"mode": "seq_mis"},
    "kl_rs": {"mode": "kl_rs", "kl_rs": {"aggregation": "max", "veto_min_ratio": 0.5}},
    "m2po": {"mode": "m2po", "m2po": {"tau": 1e-3}},
    "tis_bn": {"mode": "tis", "batch_normalize": True},
    "seq_tis_bn": {"mode": "seq_tis", "batch_normalize": True},
}
ALL_MODES = {
    **IS_MODES,
    "tbpo": {"mode": "tbpo", **TBPO_WIDE},
    "tbpo_bn": {"mode": "tbpo", "batch_normalize": True, "seq_weight_cap": 1.05, **TBPO_WIDE},
    "tis_bypass": {"mode": "tis", "bypass": True},
}


def _data(seed=0, b=B, s=S, mismatch=0.3):
    return nemo_rl_batch(seed, b, s, mismatch)


_counts = global_counts


def _run(loss_fn, data, curr):
    lp = curr.clone().requires_grad_(True)
    gvs, gvt = _counts(data)
    loss, metrics = loss_fn(next_token_logprobs=lp, data=data, global_valid_seqs=gvs, global_valid_toks=gvt)
    loss.backward()
    return loss.detach(), lp.grad, metrics


def _section(ais):
    """BASE + ``ais``; tbpo's loss is a mean over sequences (it refuses token_level_loss)."""
    return {**BASE, "ais": ais, **({"token_level_loss": False} if ais.get("mode") == "tbpo" else {})}


def _ours(ais, data, curr):
    loss_fn = AISClippedPGLossFn(_section(ais))
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=data.size, group=None, state=None)
    return _run(loss_fn, data, curr)


def _assert_same(ours, ref):
    assert math.isclose(float(ours[0]), float(ref[0]), rel_tol=RTOL), (ours[0], ref[0])
    torch.testing.assert_close(ours[1], ref[1], rtol=RTOL, atol=1e-15)


@pytest.mark.parametrize("name", list(ALL_MODES))
def test_new_keys_validate_under_loss_fn_ais(name):
    cfg = validate_loss_config(_section(ALL_MODES[name]))
    assert cfg.ais == CorrectionConfig(**ALL_MODES[name])


@pytest.mark.parametrize(
    ("ais", "message"),
    [
        ({"mode": "kl_rs", "kl_rs": {"threshold": -1.0}}, r"loss_fn\.ais\.kl_rs\.threshold=-1\.0 is invalid"),
        ({"mode": "kl_rs", "batch_normalize": True}, r"loss_fn\.ais\.batch_normalize=True"),
        ({"mode": "tbpo", "tbpo": {"clip_low": 1.0}}, r"loss_fn\.ais\.tbpo\.clip_low=1\.0 is invalid"),
        (
            {"mode": "tbpo", "tbpo_clip_low": 0.1},
            r"loss_fn\.ais\.tbpo_clip_low moved: use loss_fn\.ais\.tbpo\.clip_low",
        ),
        ({"mode": "none", "bypass": True}, r"loss_fn\.ais\.bypass=True is invalid"),
    ],
)
def test_bad_new_keys_name_their_path(ais, message):
    with pytest.raises(ValueError, match=message):
        validate_loss_config({"ais": ais})


def test_a_misspelt_ais_section_every_conflict_and_a_non_mapping_are_named():
    """NeMo-RL's loss config keeps unknown keys: ours must not ride along unread."""
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarm is not a known section.*"
                       r"\(did you mean loss_fn\.ais_alarms\?\)"):  # fmt: skip
        validate_loss_config({"ais": {"mode": "ais"}, "ais_alarm": {"enabled": True}})
    both = {"use_importance_sampling_correction": True, "force_on_policy_ratio": True}
    with pytest.raises(ValueError) as err:
        validate_loss_config({**both, "ais": {"mode": "ais"}})
    assert all(f"loss_fn.{k}=True conflicts" in str(err.value) for k in both)  # all, not first
    with pytest.raises(TypeError, match="loss_fn: expected a mapping of fields, got NoneType"):
        validate_loss_config(None)


def test_tbpo_refuses_disable_ppo_ratio_at_config_time():
    with pytest.raises(ValueError, match=r"loss_fn\.disable_ppo_ratio=True is invalid"):
        validate_loss_config({"disable_ppo_ratio": True, "ais": {"mode": "tbpo"}})


@pytest.mark.parametrize("name", list(IS_MODES))
def test_mu_equal_pi_old_equals_nemo_rl_uncorrected(name):
    data, curr = _data(seed=3)
    data["generation_logprobs"] = data["prev_logprobs"].clone()
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**BASE)), data, curr)
    _assert_same(_ours(IS_MODES[name], data, curr), ref)


def test_bypass_equals_nemo_rl_with_pi_old_set_to_mu():
    data, curr = _data(seed=4)
    bypassed = BatchedDataDict({**data, "prev_logprobs": data["generation_logprobs"].clone()})
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**BASE)), bypassed, curr)
    _assert_same(_ours({"mode": "tis", "bypass": True}, data, curr), ref)


@pytest.mark.parametrize("name", list(ALL_MODES))
def test_adapter_equals_core_on_the_mapped_tensors(name):
    data, curr = _data(seed=5)
    ours = _ours(ALL_MODES[name], data, curr)
    cfg = validate_loss_config(_section(ALL_MODES[name]))
    x = core_inputs(data)
    diagnostics = compute_diagnostics(x.logp_old, x.logp_rollout, x.mask, cfg.ais)
    lp = curr.clone().requires_grad_(True)
    gvs, gvt = _counts(data)
    want = clipped_pg_loss(
        lp, x.logp_old, x.logp_rollout, x.adv, x.mask, cfg.ais, pg=pg_loss_config(cfg),
        reference_logprobs=x.logp_ref, diagnostics=diagnostics, global_valid_tokens=gvt,
        global_valid_seqs=gvs,
    )  # fmt: skip
    want.loss.backward()
    _assert_same(ours, (want.loss.detach(), lp.grad))
    for key in ("ais/w_norm", "ais/m2po_threshold", "ais/mode_frac_masked", "ais/mode_ess"):
        assert ours[2][key] == pytest.approx(want.metrics[key].item(), rel=RTOL), key


# ---- NeMo-RL's loss options with an AIS loss (issue 17, item 6) ---------------------------------

OPTIONS = {
    "cispo": {"use_cispo": True, "ratio_clip_c": None},
    "cispo_kl_k1": {
        "use_cispo": True,
        "ratio_clip_c": None,
        "reference_policy_kl_penalty": 0.1,
        "reference_policy_kl_type": "k1",
    },
    "gspo": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "ratio_clip_min": 0.02,
        "ratio_clip_max": 0.03,
    },
    "gspo_reinforce": {"sequence_level_importance_ratios": True, "token_level_loss": False, "disable_ppo_ratio": True},
    "on_policy_kl_clamped": {
        "use_on_policy_kl_approximation": True,
        "reference_policy_kl_penalty": 0.1,
        "kl_input_clamp_value": 0.2,
        "kl_output_clamp_value": 0.012,
    },
    "on_policy_kl_k2_seq": {
        "use_on_policy_kl_approximation": True,
        "reference_policy_kl_penalty": 0.1,
        "reference_policy_kl_type": "k2",
        "token_level_loss": False,
    },
    "nll": {"positive_example_nll_weight": 0.3},
    "nll_cispo_on_policy_kl": {
        "positive_example_nll_weight": 0.5,
        "use_cispo": True,
        "ratio_clip_c": None,
        "use_on_policy_kl_approximation": True,
        "reference_policy_kl_penalty": 0.1,
    },
}
# NeMo-RL's metrics that do not depend on the correction (its IS weight is 1 here)
SHARED_METRICS = (
    "loss",
    "kl_penalty",
    "probs_ratio",
    "probs_ratio_clamped",
    "probs_ratio_min",
    "probs_ratio_max",
    "probs_ratio_clamped_min",
    "probs_ratio_clamped_max",
    "positive_nll_loss",
)


def _on_policy_data(seed):
    """mu = pi_old, and rewards with positive, zero and negative rows (row 1 masked, > 0)."""
    data, curr = _data(seed=seed)
    data["generation_logprobs"] = data["prev_logprobs"].clone()
    data["rewards"] = torch.tensor([0.5, 1.0, 0.0, 2.0, -1.0, 1.0], dtype=torch.float64)
    return data, curr


def _assert_metrics_same(ours: dict, ref: dict, keys=SHARED_METRICS):
    for key in keys:
        assert ours[key] == pytest.approx(ref[key], rel=RTOL, abs=1e-15), key


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("mode", ["tis", "seq_tis", "ais"])
def test_nemo_rl_option_with_mu_equal_pi_old_equals_nemo_rl(mode, name):
    data, curr = _on_policy_data(seed=7)
    cfg = {**BASE, **OPTIONS[name]}
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**cfg)), data, curr)
    loss_fn = AISClippedPGLossFn({**cfg, "ais": {"mode": mode}})
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=B, group=None, state=None)
    ours = _run(loss_fn, data, curr)
    _assert_same(ours, ref)
    _assert_metrics_same(ours[2], ref[2])
    if OPTIONS[name].get("positive_example_nll_weight"):
        assert ours[2]["positive_nll_loss"] > 0  # the term is on: rows 0, 3 and 5


def test_the_options_change_the_loss():
    # the equalities above compare non-trivial terms: each option moves loss or gradient
    data, curr = _on_policy_data(seed=7)
    plain = _ours({"mode": "tis"}, data, curr)
    for name, option in OPTIONS.items():
        if name == "gspo_reinforce":
            continue  # with disable_ppo_ratio, GSPO's ratio is unused (as NeMo-RL)
        loss_fn = AISClippedPGLossFn({**BASE, **option, "ais": {"mode": "tis"}})
        prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=B, group=None)
        changed = _run(loss_fn, data, curr)
        assert not torch.allclose(changed[1], plain[1], rtol=1e-6), name


def test_cispo_with_bypass_equals_nemo_rl_cispo_with_pi_old_set_to_mu():
    data, curr = _data(seed=8)
    cfg = {**BASE, **OPTIONS["cispo"]}
    bypassed = BatchedDataDict({**data, "prev_logprobs": data["generation_logprobs"].clone()})
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**cfg)), bypassed, curr)
    loss_fn = AISClippedPGLossFn({**cfg, "ais": {"mode": "tis", "bypass": True}})
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=B, group=None)
    _assert_same(_run(loss_fn, data, curr), ref)


def test_nll_weight_without_rewards_in_the_data_adds_nothing_as_nemo_rl():
    # GRPO's training batch carries no "rewards": NeMo-RL then skips the VAPO term
    data, curr = _on_policy_data(seed=9)
    del data["rewards"]
    cfg = {**BASE, **OPTIONS["nll"]}
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**cfg)), data, curr)
    loss_fn = AISClippedPGLossFn({**cfg, "ais": {"mode": "tis"}})
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=B, group=None)
    ours = _run(loss_fn, data, curr)
    _assert_same(ours, ref)
    assert ours[2]["positive_nll_loss"] == ref[2]["positive_nll_loss"] == 0.0


def _unfiltered_data(monkeypatch, loss_fn, seed, top_k):
    """Upstream's prepare_loss_input with top-k: filtered curr, and curr_logprobs_unfiltered.

    Returns the data with both log-prob tensors replaced by float64 leaves of the same
    values (upstream computes them in float32), so that gradients compare at float64,
    and the logits leaf and upstream's own loss input for the end-to-end comparison.
    """
    data, _ = _on_policy_data(seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S, 8, generator=g, dtype=torch.float64).requires_grad_(True)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda t, *args, **kwargs: t)  # no device here
    sampling = TrainingSamplingParams(top_k=top_k, top_p=1.0, temperature=1.0)
    inputs, data = prepare_loss_input(logits, data, loss_fn, sampling_params=sampling)
    return data, inputs["next_token_logprobs"], logits


def _run_unfiltered(loss_fn, data, curr, unfiltered):
    curr = curr.detach().double().requires_grad_(True)
    unfiltered = unfiltered.detach().double().requires_grad_(True)
    data = BatchedDataDict({**data, "curr_logprobs_unfiltered": unfiltered})
    gvs, gvt = _counts(data)
    loss, metrics = loss_fn(next_token_logprobs=curr, data=data, global_valid_seqs=gvs, global_valid_toks=gvt)
    loss.backward()
    return loss.detach(), curr.grad, unfiltered.grad, metrics


@pytest.mark.parametrize(
    "option",
    [
        {"kl_input_clamp_value": 0.5},
        {"use_on_policy_kl_approximation": True, "kl_output_clamp_value": 0.05},
        {"use_cispo": True, "ratio_clip_c": None, "reference_policy_kl_type": "k2"},
    ],
    ids=["kl", "on_policy_kl", "cispo_k2"],
)
def test_unfiltered_logprobs_feed_the_kl_term_as_in_nemo_rl(monkeypatch, option):
    cfg = {**BASE, "reference_policy_kl_penalty": 0.1, **option}
    upstream = ClippedPGLossFn(ClippedPGLossConfig(**cfg))
    ours_fn = AISClippedPGLossFn({**cfg, "ais": {"mode": "tis"}})
    data, curr, _ = _unfiltered_data(monkeypatch, upstream, seed=10, top_k=5)
    unfiltered = data["curr_logprobs_unfiltered"]
    assert unfiltered.shape == curr.shape  # response-aligned already, read unsliced
    assert not torch.equal(unfiltered, curr)  # the filter changed some valid tokens
    ref = _run_unfiltered(upstream, data, curr, unfiltered)
    prepare_global_batches(data, ours_fn, ours_fn.ais, local_batch_size=B, group=None)
    ours = _run_unfiltered(ours_fn, data, curr, unfiltered)
    assert math.isclose(float(ours[0]), float(ref[0]), rel_tol=RTOL), (ours[0], ref[0])
    torch.testing.assert_close(ours[1], ref[1], rtol=RTOL, atol=1e-15)  # to curr
    torch.testing.assert_close(ours[2], ref[2], rtol=RTOL, atol=1e-15)  # to the unfiltered
    assert ref[2].abs().sum() > 0  # the KL term's gradient goes to the unfiltered tensor
    _assert_metrics_same(ours[3], ref[3], ("loss", "kl_penalty", "probs_ratio"))


def test_unfiltered_logprobs_end_to_end_through_upstreams_logits_path(monkeypatch):
    # the whole path, logits -> upstream's prepare_loss_input -> loss -> logits.grad
    # (upstream's log-probs are float32: compared at float32 precision)
    cfg = {**BASE, "reference_policy_kl_penalty": 0.1, "use_on_policy_kl_approximation": True}
    grads = []
    for loss_fn in (ClippedPGLossFn(ClippedPGLossConfig(**cfg)), AISClippedPGLossFn({**cfg, "ais": {"mode": "tis"}})):
        data, curr, logits = _unfiltered_data(monkeypatch, loss_fn, seed=11, top_k=4)
        if isinstance(loss_fn, AISClippedPGLossFn):
            prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=B, group=None)
        gvs, gvt = _counts(data)
        loss, _ = loss_fn(next_token_logprobs=curr, data=data, global_valid_seqs=gvs, global_valid_toks=gvt)
        loss.backward()
        grads.append(logits.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ({"use_cispo": True, "disable_ppo_ratio": True}, "disable_ppo_ratio"),
        ({"use_cispo": True, "ratio_clip_c": 3.0}, "ratio_clip_c"),
        ({"use_cispo": True, "token_level_loss": False}, "token_level_loss"),
        (
            {"use_cispo": True, "sequence_level_importance_ratios": True, "token_level_loss": False},
            "sequence_level_importance_ratios",
        ),
        ({"sequence_level_importance_ratios": True}, "sequence_level_importance_ratios"),
    ],
    ids=["cispo_reinforce", "cispo_dual_clip", "cispo_seq_level", "cispo_gspo", "gspo_token"],
)
def test_combinations_nemo_rl_asserts_against_are_config_errors(option, field):
    with pytest.raises(AssertionError):  # upstream refuses them at construction
        ClippedPGLossFn(ClippedPGLossConfig(**option))
    with pytest.raises(ValueError, match=rf"loss_fn\.{field}=\S+ is invalid with"):
        validate_loss_config({**option, "ais": {"mode": "ais"}})
    with pytest.raises(ValueError, match=rf"loss_fn\.{field}="):
        AISClippedPGLossFn({**option, "ais": {"mode": "tis"}})


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ({"use_cispo": True}, "use_cispo"),
        ({"sequence_level_importance_ratios": True, "token_level_loss": False}, "sequence_level_importance_ratios"),
    ],
)
def test_tbpo_refuses_cispo_and_gspo_naming_the_field(option, field):
    with pytest.raises(ValueError, match=rf"loss_fn\.{field}=True is invalid with loss_fn\.ais\.mode='tbpo'"):
        validate_loss_config({**option, "ais": {"mode": "tbpo"}})


def test_nll_weight_is_range_checked_with_its_path():
    with pytest.raises(ValueError, match=r"loss_fn\.positive_example_nll_weight=-0\.1 is invalid"):
        validate_loss_config({"positive_example_nll_weight": -0.1, "ais": {"mode": "ais"}})
    # the four options are core's now: no conflict with an AIS mode
    cfg = {**OPTIONS["nll_cispo_on_policy_kl"], "ais": {"mode": "ais"}}
    assert validate_loss_config(cfg).use_cispo is True
