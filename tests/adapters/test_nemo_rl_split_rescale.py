# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The loss under NeMo-RL main's split train-step contract (issue 27, item 7).

Main's split API (``megatron_policy_worker.py``: ``begin_train_step`` /
``train_microbatch`` / ``finish_train_step``) calls the loss on each micro-batch with
placeholder ``global_valid_seqs = global_valid_toks = 1`` (raw sums) and, at finish,
rescales once: the gradient and ``loss`` by 1 / N (N = global valid tokens for a
token-level loss, sequences otherwise), and every metric whose name holds neither ``_min``
nor ``_max`` by the denominator the loss advertises in ``metric_normalizations``
(``tokens`` -> 1 / global tokens, ``sequences`` -> 1 / global sequences, ``none`` -> 1,
not advertised -> the gradient's). :func:`_split_step` is that arithmetic, re-read from main's
``_finish_train_step_body``; it runs on the real losses (upstream's ``ClippedPGLossFn`` and
ours) and must give what the synchronous path gives (the loss called with the true global
counts). Modes whose weight needs no global-batch statistic follow the contract; modes
that need one (``ais``'s alpha, ``m2po``'s threshold, ``batch_normalize``'s mean) refuse
the placeholder with the reason, naming the split API.
"""

from __future__ import annotations

import math

import pytest
import torch
from nemo_rl.algorithms.loss.interfaces import LossType
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl_batches import global_counts, nemo_rl_batch
from nemo_rl_version import NEMO_RL

from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.seam import prepare_global_batches

pytestmark = pytest.mark.nemo_rl

B, S, MBS = 6, 12, 2
# upstream's own loss on float64 data gives split and sync values ~1e-8 apart relative (its
# masked means round through float32); core's weighted modes agree to float64 rounding
UPSTREAM_RTOL = 1e-6
BASE = {"reference_policy_kl_penalty": 0.01, "ratio_clip_c": 3.0}
TBPO_WIDE = {"tbpo": {"clip_low": 0.05, "clip_high": 0.08, "neg_clip_low": 0.04, "neg_clip_high": 0.06}}
# modes whose weight needs no statistic of the global batch
NO_GLOBAL_STATISTIC = {
    "none": {"mode": "none"},
    "tis": {"mode": "tis"},
    "icepop": {"mode": "icepop"},
    "seq_mask_geo": {"mode": "seq_mask_geo"},
    "seq_tis": {"mode": "seq_tis"},
    "seq_mis": {"mode": "seq_mis", "seq_mis": {"min": 0.5, "max": 2.0}},
    "kl_rs": {"mode": "kl_rs", "kl_rs": {"aggregation": "max", "veto_min_ratio": 0.5}},
    "tbpo": {"mode": "tbpo", **TBPO_WIDE},
    "tis_bypass": {"mode": "tis", "bypass": True},
}
NEEDS_GLOBAL_STATISTIC = {
    "ais": ({"mode": "ais"}, "alpha"),
    "m2po": ({"mode": "m2po", "m2po": {"tau": 1e-3}}, "m2po_threshold"),
    "tis_bn": ({"mode": "tis", "batch_normalize": True}, "w_norm"),
    "seq_tis_bn": ({"mode": "seq_tis", "batch_normalize": True}, "w_norm"),
}


def _kind(normalizer) -> str | None:
    """main's ``MetricNormalizer`` member or v0.7.0's string, as its value."""
    return None if normalizer is None else getattr(normalizer, "value", normalizer)


def _calls(loss_fn, data, curr, gvs, gvt):
    """Each micro-batch's (loss, d loss / d logprobs, metrics) at the given global counts."""
    out = []
    for start in range(0, B, MBS):
        lp = curr[start : start + MBS].clone().requires_grad_(True)
        loss, metrics = loss_fn(lp, data.slice(start, start + MBS), gvs, gvt)
        loss.backward()
        out.append((loss.detach().item(), lp.grad, metrics))
    return out


def _split_step(loss_fn, data, curr):
    """main's split step: placeholder counts of 1, then the finish-time rescale."""
    gvs, gvt = global_counts(data)
    one = torch.tensor(1.0, dtype=torch.float64)
    calls = _calls(loss_fn, data, curr, one, one)
    token_level = loss_fn.loss_type == LossType.TOKEN_LEVEL
    inv_n = 1 / (gvt if token_level else gvs).item()
    inv = {"tokens": 1 / gvt.item(), "sequences": 1 / gvs.item(), "none": 1.0}
    norms = getattr(loss_fn, "metric_normalizations", {})
    out = []
    for loss, grad, metrics in calls:
        scaled = {
            k: v if "_min" in k or "_max" in k else v * inv.get(_kind(norms.get(k)), inv_n) for k, v in metrics.items()
        }
        out.append((loss * inv_n, grad * inv_n, scaled))
    return out


def _sync_step(loss_fn, data, curr):
    gvs, gvt = global_counts(data)
    return _calls(loss_fn, data, curr, gvs, gvt)


def _assert_split_equals_sync(make_loss_fn, data, curr, rtol=1e-12):
    """Loss, gradient and every metric (v0.7.0, which has no split API and no
    ``MetricNormalizer``: those the loss advertises) of the split step == the sync step."""
    loss_fn = make_loss_fn()
    split, sync = _split_step(loss_fn, data, curr), _sync_step(make_loss_fn(), data, curr)
    advertised = getattr(loss_fn, "metric_normalizations", {})
    for (l_split, g_split, m_split), (l_sync, g_sync, m_sync) in zip(split, sync, strict=True):
        assert math.isclose(l_split, l_sync, rel_tol=rtol, abs_tol=1e-15), (l_split, l_sync)
        torch.testing.assert_close(g_split, g_sync, rtol=rtol, atol=1e-15)
        assert m_split.keys() == m_sync.keys()
        for k in m_sync if NEMO_RL == "main" else m_sync.keys() & advertised:
            assert math.isclose(m_split[k], m_sync[k], rel_tol=rtol, abs_tol=1e-15), k


def _prepared(ais, token_level=True):
    data, curr = nemo_rl_batch(3, B, S)

    def make():
        loss_fn = AISClippedPGLossFn({**BASE, "token_level_loss": token_level, "ais": ais})
        prepare_global_batches(data, loss_fn, loss_fn.ais, local_batch_size=data.size, group=None, state=None)
        return loss_fn

    return make, data, curr


@pytest.mark.parametrize("token_level", [True, False])
def test_upstream_loss_follows_the_split_contract(token_level):
    # the contract as upstream's own loss meets it (the reference of the tests below)
    data, curr = nemo_rl_batch(3, B, S)
    cfg = ClippedPGLossConfig(**BASE, token_level_loss=token_level)
    _assert_split_equals_sync(lambda: ClippedPGLossFn(cfg), data, curr, rtol=UPSTREAM_RTOL)


@pytest.mark.parametrize("token_level", [True, False])
def test_ais_loss_without_a_section_follows_the_split_contract(token_level):
    # upstream's test with our class swapped in: no ais section (mode none), nothing prepared
    data, curr = nemo_rl_batch(3, B, S)
    cfg = {**BASE, "token_level_loss": token_level}
    _assert_split_equals_sync(lambda: AISClippedPGLossFn(cfg), data, curr, rtol=UPSTREAM_RTOL)


@pytest.mark.parametrize(
    ("name", "token_level"),
    # tbpo's loss is a mean over sequences: it refuses token_level_loss (tests/unit/test_core_modes.py)
    [(name, level) for name in NO_GLOBAL_STATISTIC for level in (True, False) if not (name == "tbpo" and level)],
)
def test_modes_without_a_global_statistic_follow_the_split_contract(name, token_level):
    make, data, curr = _prepared(NO_GLOBAL_STATISTIC[name], token_level)
    rtol = UPSTREAM_RTOL if name == "none" else 1e-12  # none is upstream's loss
    _assert_split_equals_sync(make, data, curr, rtol=rtol)


@pytest.mark.parametrize("name", list(NEEDS_GLOBAL_STATISTIC))
def test_modes_with_a_global_statistic_refuse_the_placeholder_with_the_reason(name):
    ais, field = NEEDS_GLOBAL_STATISTIC[name]
    make, data, curr = _prepared(ais)
    one = torch.tensor(1.0, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"split train-step API.*{field}") as err:
        make()(curr[:MBS], data.slice(0, MBS), one, one)
    assert "data_plane.enabled=false" in str(err.value)
    assert "global_valid_" in str(err.value)


def test_a_real_count_below_the_calls_own_is_still_refused():
    # only the placeholder 1 is the split API's; any other smaller count is a caller's bug
    make, data, curr = _prepared({"mode": "tis"})
    gvs, gvt = global_counts(data.slice(0, MBS))
    with pytest.raises(ValueError, match="global_valid_tok"):
        make()(curr[:MBS], data.slice(0, MBS), gvs, gvt - 1)
