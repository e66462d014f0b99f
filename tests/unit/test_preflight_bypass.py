# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The offline check's ``loss_fn.ais.bypass`` rule (issue 17): what NeMo-RL's skip needs.

The launcher turns bypass into NeMo-RL's ``force_on_policy_ratio`` for the driver
(``tests/upstream/test_driver_main.py`` checks that upstream's ``grpo_train`` then skips the
forward); ``setup()`` asserts one update per rollout batch, which this check reports first.
"""

from __future__ import annotations

from shipped_configs import CONFIG_DIR

from nemo_ais import preflight as pf

SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"  # 8 prompts x 4 generations, gbs 32


def _result(overrides):
    cfg = pf.load_config(str(SMOKE), list(overrides))
    (result,) = [r for r in pf.check_config(cfg) if r.name == "loss_fn.ais.bypass"] or [None]
    return result


def test_without_bypass_the_check_stays_silent():
    assert _result([]) is None


def test_bypass_with_one_update_per_rollout_batch_passes():
    result = _result(["loss_fn.ais.bypass=true"])
    assert result.status == "ok" and "prev_logprobs forward skipped" in result.detail


def test_bypass_with_several_updates_fails_naming_the_fields():
    result = _result(["loss_fn.ais.bypass=true", "policy.train_global_batch_size=16"])
    assert result.status == "fail"
    assert "policy.train_global_batch_size=16 must equal grpo.num_prompts_per_step * " in (result.detail)
    assert "grpo.num_generations_per_prompt = 32" in result.detail


def test_bypass_with_mode_none_fails():
    result = _result(["loss_fn.ais.bypass=true", "loss_fn.ais.mode=none"])
    assert result.status == "fail" and "needs a correction mode" in result.detail


def test_a_seq_logprob_error_threshold_warns_that_nothing_is_saved():
    cfg = pf.load_config(str(SMOKE), ["loss_fn.ais.bypass=true", "+grpo.seq_logprob_error_threshold=2.0"])
    warnings = [r for r in pf.check_config(cfg) if r.name == "loss_fn.ais.bypass" and r.status == "warn"]
    assert warnings and "no time saved" in warnings[0].detail


KL_IN_REWARD = ["loss_fn.ais.bypass=true", "loss_fn.use_kl_in_reward=true"]


def test_bypass_with_a_kl_term_in_the_reward_fails_naming_the_fields():
    # bypass fills prev_logprobs with zeros; the reward's KL term would read them (issue 27)
    result = _result([*KL_IN_REWARD, "loss_fn.reference_policy_kl_penalty=0.01"])
    assert result.status == "fail"
    for field in (
        "loss_fn.ais.bypass=true",
        "loss_fn.use_kl_in_reward=true",
        "loss_fn.reference_policy_kl_penalty=0.01",
    ):
        assert field in result.detail


def test_bypass_with_a_zero_kl_coefficient_in_the_reward_passes():
    # beta = 0 zeros the term whatever prev_logprobs holds (NeMo-RL main allows it too)
    result = _result([*KL_IN_REWARD, "loss_fn.reference_policy_kl_penalty=0.0"])
    assert result.status == "ok"
    result = _result(["loss_fn.ais.bypass=true", "loss_fn.reference_policy_kl_penalty=0.01"])
    assert result.status == "ok"  # the KL term in the loss reads the reference, not zeros
