# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``loss_fn.ais.bypass`` with a KL term in the reward is refused by the runtime adapter
(issue 27, item 4).

Bypass makes upstream skip the ``prev_logprobs`` forward and fill zeros; with
``use_kl_in_reward`` and a non-zero ``reference_policy_kl_penalty`` upstream's real
advantage estimator subtracts beta * KL(zeros, reference) from the advantages (shown below
on ``ReinforcePlusPlusAdvantageEstimator`` itself, which reads the flag). NeMo-RL main
asserts against it, v0.7.0 does not: ``AISLossConfig`` refuses it, naming the fields,
before any GPU time is spent.
"""

from __future__ import annotations

import pytest
import torch
from nemo_rl.algorithms.advantage_estimator import ReinforcePlusPlusAdvantageEstimator
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig

from nemo_ais.nemo_rl import AISClippedPGLossFn, validate_loss_config

pytestmark = pytest.mark.nemo_rl

KL_IN_REWARD = {"use_kl_in_reward": True, "reference_policy_kl_penalty": 0.05}


class _EstimatorConfig(dict):
    """``advantage_estimator`` section: v0.7.0 reads keys, main attributes."""

    __getattr__ = dict.__getitem__


def _estimator():
    cfg = _EstimatorConfig(name="reinforce_plus_plus", minus_baseline=True)
    return ReinforcePlusPlusAdvantageEstimator(cfg, ClippedPGLossConfig(**KL_IN_REWARD))


def test_upstreams_estimator_reads_the_zeros_bypass_leaves():
    # why the combination is refused: the KL term's value depends on prev_logprobs
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.zeros(4, 3, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(4, 5)
    ref = -torch.rand(4, 5, generator=g) - 0.1
    prev = ref + 0.01 * torch.randn(4, 5, generator=g)
    kwargs = dict(prompt_ids=prompt_ids, rewards=rewards, mask=mask, logprobs_reference=ref)
    real = _estimator().compute_advantage(logprobs_policy=prev, **kwargs)
    zeros = _estimator().compute_advantage(logprobs_policy=torch.zeros_like(prev), **kwargs)
    assert (real - zeros).abs().max() > 1e-2  # the zeros shift every advantage


@pytest.mark.parametrize("mode", ["tis", "ais", "seq_tis"])
def test_bypass_with_a_kl_term_in_the_reward_is_refused_naming_the_fields(mode):
    cfg = {**KL_IN_REWARD, "ais": {"mode": mode, "bypass": True}}
    for build in (validate_loss_config, AISClippedPGLossFn):
        with pytest.raises(ValueError, match=r"loss_fn\.ais\.bypass=true") as err:
            build(cfg)
        assert "loss_fn.use_kl_in_reward=true" in str(err.value)
        assert "loss_fn.reference_policy_kl_penalty=0.05" in str(err.value)


def test_without_any_of_the_three_it_is_accepted():
    ok = [
        {**KL_IN_REWARD, "reference_policy_kl_penalty": 0.0, "ais": {"bypass": True}},
        {**KL_IN_REWARD, "use_kl_in_reward": False, "ais": {"bypass": True}},
        {**KL_IN_REWARD, "ais": {"bypass": False}},
    ]
    for cfg in ok:
        assert validate_loss_config(cfg).ais.bypass == cfg["ais"]["bypass"]
