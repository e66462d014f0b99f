# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What the run's trainer is: its precision and its off-policyness, and what that means.

The method (docs/method.md) assumes a BF16 trainer updated once per rollout batch. Two departures the AIS loss accepts
silently are reported: an FP8 trainer (pi_old is then an FP8 log-prob, so the diagnostics compare two FP8 engines) and
several optimizer steps per rollout batch (pi_theta != pi_old from the second, a lag the AIS weights do not measure).
"""

from __future__ import annotations

from nemo_ais.preflight.checks.registry import Context, Verdict, check

_FP8_CFG = "policy.megatron_cfg.fp8_cfg"
_GBS = "policy.train_global_batch_size"


def _precision(ctx: Context) -> tuple[str, str]:
    """(the trainer's compute precision in words, its kind: ``fp8``, ``qat`` or ``high``)."""
    if (quant_cfg := ctx.get("policy.quant_cfg")) is not None:
        return f"ModelOpt fake-quant (policy.quant_cfg={quant_cfg!r}; QARL)", "qat"
    if ctx.get("policy.megatron_cfg.enabled", False) and ctx.get(f"{_FP8_CFG}.enabled", False):
        fp8 = ctx.get(f"{_FP8_CFG}.fp8", "e4m3")
        recipe = ctx.get(f"{_FP8_CFG}.fp8_recipe", "default")
        return f"FP8 ({_FP8_CFG}.enabled=true: {fp8}, {recipe} recipe)", "fp8"
    return f"{ctx.get('policy.precision', 'bfloat16')} (policy.precision)", "high"


@check("trainer")
def check_trainer(ctx: Context) -> Verdict:
    """The trainer's precision and optimizer steps per rollout batch, and their meaning."""
    precision, kind = _precision(ctx)
    prompts, gens, gbs = (ctx.get(k, 0) for k in ("grpo.num_prompts_per_step", "grpo.num_generations_per_prompt", _GBS))
    if not all(type(n) is int for n in (prompts, gens, gbs)):  # the batch check names the bad count
        return Verdict((), f"{precision} trainer (optimizer steps per rollout batch: see the batch check)")
    rollouts = prompts * gens
    steps = rollouts // gbs if gbs > 0 else 0
    warnings = []
    if kind == "fp8":
        warnings.append(
            f"the trainer computes in {precision}: pi_old comes from the FP8 trainer's forward, so ais/*, "
            "token_mult_prob_error and alpha measure the FP8 rollout against an FP8 trainer, not against the BF16 "
            "policy the method assumes (docs/method.md), and the trainer's own FP8 error is invisible to them. For a "
            f"BF16 trainer: {_FP8_CFG}.enabled=false (docs/migration.md)"
        )
    if steps > 1:
        warnings.append(
            f"{steps} optimizer steps per rollout batch (grpo.num_prompts_per_step x grpo.num_generations_per_prompt = "
            f"{prompts} x {gens} = {rollouts} rollouts / policy.train_global_batch_size={gbs}): global batches "
            f"2-{steps} train off-policy (pi_theta != pi_old; the PPO ratio clip bounds that lag), while the AIS "
            "weights and alpha, formed per global batch from pi_old / mu, measure the rollout mismatch only, not the "
            f"lag. For one on-policy step per rollout batch: policy.train_global_batch_size={rollouts} "
            "(docs/migration.md)"
        )
    policy = "on-policy" if steps == 1 else f"{steps} steps, off-policy after the first"
    return Verdict(
        (),
        f"{precision} trainer, {steps} optimizer step(s) per rollout batch ({policy})"
        + (": the setting the diagnostics assume" if kind == "high" and steps == 1 else ""),
        warnings,
    )
