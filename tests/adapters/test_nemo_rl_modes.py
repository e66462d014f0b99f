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
"""

from __future__ import annotations

import math

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
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
TBPO_WIDE = {
    "tbpo_clip_low": 0.05,
    "tbpo_clip_high": 0.08,
    "tbpo_neg_clip_low": 0.04,
    "tbpo_neg_clip_high": 0.06,
}
IS_MODES = {
    "seq_tis": {"mode": "seq_tis"},
    "seq_mis": {"mode": "seq_mis"},
    "kl_rs": {"mode": "kl_rs", "rs_aggregation": "max", "rs_veto_min_ratio": 0.5},
    "m2po": {"mode": "m2po", "m2po_tau": 1e-3},
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
    loss, metrics = loss_fn(
        next_token_logprobs=lp, data=data, global_valid_seqs=gvs, global_valid_toks=gvt
    )
    loss.backward()
    return loss.detach(), lp.grad, metrics


def _ours(ais, data, curr):
    loss_fn = AISClippedPGLossFn({**BASE, "ais": ais})
    prepare_global_batches(
        data, loss_fn, loss_fn.ais, local_batch_size=data.size, group=None, state=None
    )
    return _run(loss_fn, data, curr)


def _assert_same(ours, ref):
    assert math.isclose(float(ours[0]), float(ref[0]), rel_tol=RTOL), (ours[0], ref[0])
    torch.testing.assert_close(ours[1], ref[1], rtol=RTOL, atol=1e-15)


@pytest.mark.parametrize("name", list(ALL_MODES))
def test_new_keys_validate_under_loss_fn_ais(name):
    cfg = validate_loss_config({**BASE, "ais": ALL_MODES[name]})
    assert cfg.ais == CorrectionConfig(**ALL_MODES[name])


@pytest.mark.parametrize(
    ("ais", "message"),
    [
        ({"mode": "kl_rs", "rs_threshold": -1.0}, r"loss_fn\.ais\.rs_threshold=-1\.0 is invalid"),
        ({"mode": "kl_rs", "batch_normalize": True}, r"loss_fn\.ais\.batch_normalize=True"),
        ({"mode": "tbpo", "tbpo_clip_low": 1.0}, r"loss_fn\.ais\.tbpo_clip_low=1\.0 is invalid"),
        ({"mode": "none", "bypass": True}, r"loss_fn\.ais\.bypass=True is invalid"),
    ],
)
def test_bad_new_keys_name_their_path(ais, message):
    with pytest.raises(ValueError, match=message):
        validate_loss_config({"ais": ais})


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
    cfg = validate_loss_config({**BASE, "ais": ALL_MODES[name]})
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
