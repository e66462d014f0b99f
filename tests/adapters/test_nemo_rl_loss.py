# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""AISClippedPGLossFn against NeMo-RL's own ClippedPGLossFn (needs NeMo-RL importable).

Data follow NeMo-RL's CPU test pattern (tests/unit/algorithms/test_loss_functions.py):
a ``BatchedDataDict`` with int64 ``token_mask`` (first position 0) and ``sample_mask``,
``[B, S]`` advantages / log-probs, and ``next_token_logprobs`` ``[B, S - 1]``. Values are
random float64 here (more positions than the hand-built upstream cases).

* AIS off (no ``ais`` section, or ``mode: none``): loss, gradient and metrics are
  bit-identical to ``ClippedPGLossFn`` (delegation), also with NeMo-RL's own tis on.
* ``mode: ais`` with ``mixer: constant``, ``constant_alpha: 1``, ``weight_cap: C`` equals
  NeMo-RL's ``truncated_importance_sampling_type: tis`` with ratio C: loss and gradient to
  rtol 1e-12 (float64; the two differ only in summation order), shared metrics likewise.
  ``constant_alpha: 0`` equals NeMo-RL without correction.
* Metric keys / normalisations / NeMo-RL's summing rule (micro-batches sum to the whole).
"""

from __future__ import annotations

import math
import pickle

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
from nemo_rl.algorithms.loss import interfaces as loss_interfaces
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl_batches import global_counts, nemo_rl_batch
from nemo_rl_version import per_version

from nemo_ais.core.metrics import AIS_METRIC_NAMES
from nemo_ais.nemo_rl import AISClippedPGLossFn, AISLossConfig, validate_loss_config
from nemo_ais.nemo_rl.loss import ALARM_METRIC_KEYS, NEMO_RL_METRIC_KEYS
from nemo_ais.nemo_rl.seam import GLOBAL_BATCH_KEY, VALID_TOKENS_KEY, prepare_global_batches

pytestmark = pytest.mark.nemo_rl

B, S = 6, 12
CAP = 1.5
RTOL = 1e-12  # float64; only the order of the sums differs


def _data(seed=0, b=B, s=S, mismatch=0.3):
    return nemo_rl_batch(seed, b, s, mismatch)


_counts = global_counts


def _run(loss_fn, data, curr, counts=None):
    lp = curr.clone().requires_grad_(True)
    gvs, gvt = counts if counts is not None else _counts(data)
    loss, metrics = loss_fn(next_token_logprobs=lp, data=data, global_valid_seqs=gvs, global_valid_toks=gvt)
    loss.backward()
    return loss.detach(), lp.grad, metrics


def _prepared(loss_fn, data):
    prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=data.size, group=None, state=None)
    return loss_fn


BASE = {"reference_policy_kl_penalty": 0.01, "ratio_clip_c": 3.0}
NEMO_TIS = {
    "use_importance_sampling_correction": True,
    "truncated_importance_sampling_type": "tis",
    "truncated_importance_sampling_ratio": CAP,
}
ALPHA1 = {"mode": "ais", "mixer": "constant", "constant_alpha": 1.0, "weight_cap": CAP}


@pytest.mark.parametrize(
    "cfg",
    [{}, {"ais": {"mode": "none"}}, {**BASE, "token_level_loss": False}, {**BASE, **NEMO_TIS, "ais": {"mode": "none"}}],
    ids=["no-section", "mode-none", "seq-level", "nemo-rl-tis"],
)
def test_ais_off_is_exactly_clipped_pg_loss(cfg):
    data, curr = _data()
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**cfg)), data, curr)
    ours = _run(AISClippedPGLossFn(cfg), data, curr)
    assert torch.equal(ours[0], ref[0])
    assert torch.equal(ours[1], ref[1])
    assert ours[2] == ref[2]


@pytest.mark.parametrize("nemo_cfg", [{}, {**BASE, **NEMO_TIS}], ids=["uncorrected", "nemo-rl-tis"])
def test_prepared_mode_none_is_clipped_pg_loss_plus_telemetry(nemo_cfg):
    data, curr = _data(seed=5)
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**nemo_cfg)), data, curr)
    ours = _run(_prepared(AISClippedPGLossFn({**nemo_cfg, "ais": {"mode": "none"}}), data), data, curr)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])  # weights exactly 1
    assert {k: ours[2][k] for k in ref[2]} == ref[2]
    ais_keys = {k for k in ours[2] if k.startswith("ais/")}
    assert set(ours[2]) == set(ref[2]) | ais_keys
    # the same telemetry as a weighted mode on the same batch (statistics ignore the mode)
    data_tis, _ = _data(seed=5)
    tis = _run(_prepared(AISClippedPGLossFn({"ais": {"mode": "tis"}}), data_tis), data_tis, curr)
    assert {k: ours[2][k] for k in ais_keys} == {k: tis[2][k] for k in ais_keys}
    assert ais_keys == {k for k in tis[2] if k.startswith("ais/")}
    assert ours[2]["ais/n_tok"] == pytest.approx(float(_counts(data)[1]))  # one call: whole


def test_prepared_row_valid_tokens_give_the_telemetry_of_the_masks():
    # The prepare step counts each row's valid tokens once per train() call; a call without
    # that column counts them from token_mask[:, 1:] x sample_mask: the same metrics.
    data, curr = _data(seed=6)
    loss_fn = _prepared(AISClippedPGLossFn({"ais": {"mode": "none"}}), data)
    per_row = (data["token_mask"][:, 1:].sum(-1) * data["sample_mask"]).tolist()
    assert data[VALID_TOKENS_KEY].dtype == torch.float64
    assert data[VALID_TOKENS_KEY].tolist() == per_row and per_row[1] == 0  # row 1 masked
    gvs, gvt = _counts(data)
    half = data.slice(0, 2)  # a micro-batch: ais/n_tok is n_tok * local / global
    with_column = _run(loss_fn, half, curr[:2], (gvs, gvt))[2]
    assert with_column["ais/n_tok"] == pytest.approx(sum(per_row[:2]), rel=1e-6)
    del half[VALID_TOKENS_KEY]
    assert _run(loss_fn, half, curr[:2], (gvs, gvt))[2] == with_column


@pytest.mark.parametrize("token_level_loss", [True, False])
def test_alpha_one_equals_nemo_rl_tis(token_level_loss):
    data, curr = _data(seed=1)
    common = {**BASE, "token_level_loss": token_level_loss}
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**common, **NEMO_TIS)), data, curr)
    ours = _run(_prepared(AISClippedPGLossFn({**common, "ais": ALPHA1}), data), data, curr)
    assert math.isclose(float(ours[0]), float(ref[0]), rel_tol=RTOL)
    torch.testing.assert_close(ours[1], ref[1], rtol=RTOL, atol=1e-15)
    shared = set(ref[2]) - {"is_oob_ratio"}
    for key in sorted(shared):
        assert math.isclose(ours[2][key], ref[2][key], rel_tol=RTOL, abs_tol=1e-15), key
    assert ours[2]["ais/alpha"] == pytest.approx(1.0, rel=RTOL)  # one global batch, one call
    # NeMo-RL's out-of-bound fraction is #{rho > C} here (floor 0): our ais/frac_capped.
    # NeMo-RL averages the flags as float32 (`.float()`), hence float32 tolerance.
    assert ours[2]["ais/frac_capped"] == pytest.approx(ref[2]["is_oob_ratio"], rel=1e-6)


def test_alpha_zero_equals_nemo_rl_uncorrected():
    data, curr = _data(seed=2)
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**BASE)), data, curr)
    cfg = {**BASE, "ais": {**ALPHA1, "constant_alpha": 0.0}}
    ours = _run(_prepared(AISClippedPGLossFn(cfg), data), data, curr)
    assert math.isclose(float(ours[0]), float(ref[0]), rel_tol=RTOL)
    torch.testing.assert_close(ours[1], ref[1], rtol=RTOL, atol=1e-15)


def test_ais_metrics_keys_and_normalizations():
    data, curr = _data(seed=3)
    loss_fn = _prepared(AISClippedPGLossFn({**BASE, "ais": {"mode": "ais"}}), data)
    metrics = _run(loss_fn, data, curr)[2]
    ais_keys = {k for k in metrics if k.startswith("ais/")}
    assert set(NEMO_RL_METRIC_KEYS) <= set(metrics)  # grpo_train reads some of them
    assert ais_keys == {k for k in loss_fn.metric_normalizations if k.startswith("ais/")}
    assert set(loss_fn.metric_normalizations) <= set(metrics)
    assert all(type(v) in (float, int) for v in metrics.values())
    # NeMo-RL min/max-reduces every key containing "_min"/"_max": AIS keys must not
    assert not [k for k in ais_keys if "_min" in k or "_max" in k]
    assert set(loss_fn.metric_normalizations.values()) <= set(_NORMALIZERS)
    assert 0.0 <= metrics["ais/alpha"] <= 1.0


# What the loss interface spells a normaliser as: main's split-step trainer tests each value
# with `is MetricNormalizer.TOKENS` (else it falls back to the gradient's normaliser).
_MetricNormalizer = getattr(loss_interfaces, "MetricNormalizer", None)
_NORMALIZERS = per_version(
    v0_7_0=("tokens", "sequences", "none"), main=tuple(_MetricNormalizer) if _MetricNormalizer else ()
)


@pytest.mark.parametrize("mode", ["none", "ais"])
def test_metric_normalizations_are_upstreams_enum_and_keep_upstreams_entries(mode):
    gspo = {"sequence_level_importance_ratios": True, "token_level_loss": False}
    cfg = {**BASE, **(gspo if mode == "none" else {}), "ais": {"mode": mode}}
    ours = AISClippedPGLossFn({**cfg, "ais_alarms": {"enabled": True}}).metric_normalizations
    tokens = _NORMALIZERS[0]
    for key in (*AIS_METRIC_NAMES, *ALARM_METRIC_KEYS):  # global scalars s * local / global
        assert ours[key] is tokens, key
    upstream = getattr(ClippedPGLossFn(ClippedPGLossConfig(**cfg)), "metric_normalizations", {})
    assert per_version(v0_7_0=upstream == {}, main=bool(upstream))
    if mode == "none":  # upstream's metrics, returned unchanged: upstream's normalisers
        assert {k: ours[k] for k in upstream} == upstream
        if upstream:  # GSPO-style ratios: one weight per sequence
            assert ours["sampling_importance_ratio"] is _MetricNormalizer.SEQUENCES


def test_micro_batches_sum_to_the_global_batch():
    data, curr = _data(seed=4)
    loss_fn = _prepared(AISClippedPGLossFn({**BASE, "ais": {"mode": "ais"}}), data)
    whole = _run(loss_fn, data, curr)
    counts = _counts(data)
    parts = [_run(loss_fn, data.slice(a, b), curr[a:b], counts) for a, b in ((0, 2), (2, 5), (5, B))]
    assert math.isclose(sum(float(p[0]) for p in parts), float(whole[0]), rel_tol=1e-12)
    for key, value in whole[2].items():
        if "_min" in key or "_max" in key:
            continue
        total = sum(p[2][key] for p in parts)
        assert math.isclose(total, value, rel_tol=1e-9, abs_tol=1e-12), key


@pytest.mark.parametrize(
    ("cfg", "keys"),
    [
        ({"reference_policy_kl_penalty": 0.0}, ("advantages",)),
        ({"reference_policy_kl_penalty": 0.01}, ("advantages", "reference_policy_logprobs")),
        # upstream's rule: the KL term moves into the reward, the loss reads no reference
        ({"reference_policy_kl_penalty": 0.01, "use_kl_in_reward": True}, ("advantages",)),
    ],
)
@pytest.mark.parametrize("mode", ["none", "ais"])
def test_loss_keys_are_what_the_loss_reads(cfg, keys, mode):
    # what the worker's prepare step checks before the all-reduce (seam.LOSS_KEYS)
    assert AISClippedPGLossFn({**cfg, "ais": {"mode": mode}}).loss_keys == keys


def test_unprepared_loss_raises_with_instructions():
    data, curr = _data()
    with pytest.raises(RuntimeError, match="prepare_global_batches"):
        _run(AISClippedPGLossFn({"ais": {"mode": "ais"}}), data, curr)


def test_pickle_drops_prepared_diagnostics():
    data, _ = _data()
    loss_fn = _prepared(AISClippedPGLossFn({"ais": {"mode": "tis"}}), data)
    assert len(loss_fn._diagnostics) == 1 and GLOBAL_BATCH_KEY in data
    clone = pickle.loads(pickle.dumps(loss_fn))
    assert clone._diagnostics == () and clone.ais == loss_fn.ais


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("use_importance_sampling_correction", True),
        ("truncated_importance_sampling_type", "icepop"),
        ("force_on_policy_ratio", True),
    ],
)
def test_conflicting_nemo_rl_options_are_config_errors(field, value):
    # use_cispo, sequence_level_importance_ratios, use_on_policy_kl_approximation and
    # positive_example_nll_weight are core's (tests/adapters/test_nemo_rl_modes.py)
    with pytest.raises(ValueError, match=rf"loss_fn\.{field}=.*conflicts with loss_fn\.ais\.mode"):
        validate_loss_config({field: value, "ais": {"mode": "ais"}})


def test_mode_none_refuses_force_on_policy_ratio_whose_zeros_its_telemetry_would_read():
    """NeMo-RL's loss ignores the zero prev_logprobs this option leaves (prev := curr); the ais/* telemetry and the
    refit guard of mode none read them, so every diagnostic would be formed from -log(mu)."""
    for loss_fn in ({"force_on_policy_ratio": True, "ais": {"mode": "none"}}, {"force_on_policy_ratio": True}):
        with pytest.raises(ValueError, match=r"loss_fn\.force_on_policy_ratio=True conflicts with the AIS loss"):
            validate_loss_config(loss_fn)
    for field, value in (("use_importance_sampling_correction", True), ("truncated_importance_sampling_type", "tis")):
        assert getattr(validate_loss_config({field: value, "ais": {"mode": "none"}}), field) == value  # NeMo-RL's


def test_invalid_ais_field_names_the_path():
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.weight_cap=0\.8 is invalid"):
        validate_loss_config({"ais": {"weight_cap": 0.8}})
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.not_a_field is not a known field"):
        validate_loss_config({"ais": {"not_a_field": 1}})
    with pytest.raises(ValueError, match=r"loss_fn\.ratio_clip_min"):
        validate_loss_config({"ratio_clip_min": "wide"})


def test_surrogate_knobs_are_checked_only_with_ais_on():
    with pytest.raises(ValueError, match=r"loss_fn\.ratio_clip_c=0\.5 is invalid"):
        AISClippedPGLossFn({"ratio_clip_c": 0.5, "ais": {"mode": "ais"}})
    assert AISClippedPGLossFn({"ratio_clip_c": 0.5}).pg is None  # as ClippedPGLossFn


def test_config_is_a_clipped_pg_loss_config():
    cfg = validate_loss_config({"ais": {"mode": "ais", "weight_cap": 3.0}})
    assert isinstance(cfg, AISLossConfig) and isinstance(cfg, ClippedPGLossConfig)
    assert cfg.ais.weight_cap == 3.0
    assert validate_loss_config({}).ais.mode == "none"  # no section: AIS off
    # NeMo-RL's MasterConfig keeps our section (ClippedPGLossConfig allows extra keys)
    assert ClippedPGLossConfig(ais={"mode": "ais"}).ais == {"mode": "ais"}


# ---- NeMo-RL's own metric keys, computed by core in the same pass ------------------------------

ROLLOUT_KEYS = (
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "approx_entropy",
    "probs_ratio_min",
    "probs_ratio_max",
    "probs_ratio_clamped_min",
    "probs_ratio_clamped_max",
    "num_valid_samples",
    "positive_nll_loss",
)


@pytest.mark.parametrize(
    "nemo_cfg",
    [
        {},
        {"reference_policy_kl_type": "k1", "token_level_loss": False},
        {"reference_policy_kl_type": "k2", "ratio_clip_c": 3.0, "ratio_clip_max": 0.28},
        {"disable_ppo_ratio": True, "reference_policy_kl_penalty": 0.0},
    ],
    ids=["k3-default", "k1-seq-level", "k2-dual-clip", "reinforce"],
)
@pytest.mark.parametrize("mode", ["ais", "tis"])
def test_nemo_rl_metric_keys_equal_clipped_pg_loss(mode, nemo_cfg):
    # The keys NeMo-RL defines (its rollout-mismatch diagnostics, ratio extremes, sample
    # count) do not depend on the correction: ours must equal ClippedPGLossFn's to float64
    # re-association (NeMo-RL's JS is 0.5 KL(P||M) + 0.5 KL(Q||M); ours the same quantity
    # in closed form, softplus(l) - l / 2 - log 2).
    data, curr = _data(seed=6, mismatch=0.4)
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig(**nemo_cfg)), data, curr)
    ours = _run(_prepared(AISClippedPGLossFn({**nemo_cfg, "ais": {"mode": mode}}), data), data, curr)
    for key in ROLLOUT_KEYS:
        assert type(ours[2][key]) is type(ref[2][key]), key
        assert math.isclose(ours[2][key], ref[2][key], rel_tol=RTOL, abs_tol=1e-15), (key, ours[2][key], ref[2][key])
    assert list(ours[2])[: len(NEMO_RL_METRIC_KEYS)] == list(NEMO_RL_METRIC_KEYS)


def test_nemo_rl_metric_keys_of_an_all_masked_micro_batch():
    # A micro-batch without a valid token (a DTensor dummy batch): NeMo-RL reports the ratio
    # extremes as +inf / -inf and every mean as 0; so do we (it min/max-reduces those keys).
    data, curr = _data(seed=7)
    data["sample_mask"] = torch.zeros_like(data["sample_mask"])
    counts = (torch.tensor(4.0), torch.tensor(30.0))  # other ranks hold the valid tokens
    ref = _run(ClippedPGLossFn(ClippedPGLossConfig()), data, curr, counts)
    ours = _run(_prepared(AISClippedPGLossFn({"ais": {"mode": "ais"}}), data), data, curr, counts)
    for key in ROLLOUT_KEYS:
        assert ours[2][key] == ref[2][key], (key, ours[2][key], ref[2][key])
    assert ours[2]["probs_ratio_min"] == math.inf and ours[2]["probs_ratio_max"] == -math.inf
    assert float(ours[0]) == 0.0


# ---- bad global normalisers ---------------------------------------------------------------------

BAD_COUNTS = {
    "nan": lambda n: math.nan,
    "+inf": lambda n: math.inf,
    "-inf": lambda n: -math.inf,
    "zero": lambda n: 0.0,
    "negative": lambda n: -n,
    "below-local": lambda n: n - 1,
}


@pytest.mark.parametrize("bad", list(BAD_COUNTS))
@pytest.mark.parametrize("arg", ["global_valid_toks", "global_valid_seqs"])
@pytest.mark.parametrize("mode", ["none", "ais"])
def test_bad_global_counts_are_refused_naming_the_argument(mode, arg, bad):
    # NeMo-RL all-reduces the valid sequences / tokens of the global batch; a value that is
    # NaN, inf, <= 0 while this call has valid tokens, or below this call's own count cannot
    # be a global count and would silently mis-normalise the loss.
    data, curr = _data(seed=8)
    gvs, gvt = _counts(data)
    counts = {"global_valid_seqs": gvs, "global_valid_toks": gvt}
    n_local = float(counts[arg])  # one call holds the whole batch: global = local
    counts[arg] = torch.tensor(BAD_COUNTS[bad](n_local))
    loss_fn = _prepared(AISClippedPGLossFn({"ais": {"mode": mode}}), data)
    with pytest.raises(ValueError, match=r"is invalid: expected a finite count >= ") as err:
        _run(loss_fn, data, curr, (counts["global_valid_seqs"], counts["global_valid_toks"]))
    assert arg in str(err.value)  # core calls it global_valid_tokens and names NeMo-RL's too


@pytest.mark.parametrize("mode", ["none", "ais"])
@pytest.mark.parametrize("arg", ["global_valid_seqs", "global_valid_toks"])
def test_global_counts_that_are_not_scalars_are_refused_naming_the_argument(mode, arg):
    data, curr = _data(seed=8)
    gvs, gvt = _counts(data)
    counts = {"global_valid_seqs": gvs, "global_valid_toks": gvt}
    counts[arg] = torch.stack([counts[arg], counts[arg]])
    loss_fn = _prepared(AISClippedPGLossFn({"ais": {"mode": mode}}), data)
    with pytest.raises(ValueError, match=r"got a tensor of shape \[2\], expected a scalar") as err:
        _run(loss_fn, data, curr, (counts["global_valid_seqs"], counts["global_valid_toks"]))
    assert arg in str(err.value) or arg.replace("toks", "tokens") in str(err.value)


@pytest.mark.parametrize("mode", ["none", "ais"])
def test_zero_global_counts_of_an_empty_global_batch_are_accepted(mode):
    # Globally empty (no valid token on any rank): counts 0 are right; loss 0, documented
    # telemetry ais/empty_batch = 1 (core/metrics.py).
    data, curr = _data(seed=9)
    data["sample_mask"] = torch.zeros_like(data["sample_mask"])
    loss_fn = _prepared(AISClippedPGLossFn({"ais": {"mode": mode}}), data)
    loss, grad, metrics = _run(loss_fn, data, curr, (torch.tensor(0.0), torch.tensor(0.0)))
    assert float(loss) == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert metrics["ais/empty_batch"] == 1.0 and metrics["ais/alpha"] == 0.0
