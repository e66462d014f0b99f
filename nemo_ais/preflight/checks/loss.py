# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``loss_fn``: our sections validate, and NeMo-RL's loss options that AIS replaces stay off."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nemo_ais.alarms import AISAlarmsConfig
from nemo_ais.config import CorrectionConfig, pg_loss_section, surrogate_conflicts, validate_section
from nemo_ais.modes import MODES
from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.loader import get
from nemo_ais.rules.loss_conflicts import (
    AIS_CONFLICTS as AIS_CONFLICTS,
    ais_conflicts,
    bypass_kl_in_reward_problems,
    unknown_ais_sections,
)

NO_CORRECTION_HINT = (
    "add a loss_fn.ais section (our correction; mode: none is the deliberately uncorrected "
    "arm) or set loss_fn.use_importance_sampling_correction=true (NeMo-RL's own)"
)
"""How to give a config the importance-sampling correction NeMo-RL's asserts require."""


def setup_sees_importance_sampling(cfg: Mapping[str, Any]) -> bool:
    """``loss_fn.use_importance_sampling_correction`` as NeMo-RL reads it under our launcher.

    The launcher turns the flag on whenever ``loss_fn.ais`` is present (``nemo_rl_view``);
    NeMo-RL asserts it for an FP8 rollout and for async GRPO.
    """
    loss = get(cfg, "loss_fn", {})
    return bool(loss.get("use_importance_sampling_correction", False)) or "ais" in loss


def tbpo_unused_warnings(loss_fn: Mapping[str, Any], mode: str) -> list[str]:
    """A warning naming the ``loss_fn`` options set that ``mode``'s own surrogate does not read."""
    record = MODES.get(mode)
    unused = [f for f in record.unused_options if loss_fn.get(f) is not None] if record else []
    if not unused:
        return []
    named = ", ".join(f"loss_fn.{f}={loss_fn[f]!r}" for f in unused)
    return [f"{named} not used by loss_fn.ais.mode={mode!r}: {record.unused_why}"]


def _validated(problems: list[str], validate: Callable[..., Any], *args: Any) -> Any:
    """``validate(*args)``, or None with its error added to ``problems`` on one line."""
    try:
        return validate(*args)
    except (TypeError, ValueError) as err:
        problems.append(str(err).replace("\n", "; "))
        return None


@check("loss_fn.ais", mixins=True)
def check_loss_sections(ctx: Context) -> Verdict:
    """``loss_fn.ais`` is a CorrectionConfig, ``loss_fn.ais_alarms`` an AISAlarmsConfig, no conflict.

    The surrogate knobs: :class:`~nemo_ais.config.PGLossConfig`, as ``AISLossConfig`` checks them.
    """
    loss = ctx.get("loss_fn", {})
    if "ais" not in loss:  # the launcher's loss is then mode none: its one conflict still holds
        return Verdict(ais_conflicts(loss, "none"), warnings=["no loss_fn.ais section: the AIS loss is not configured"])
    problems = unknown_ais_sections(loss)
    ais = _validated(problems, validate_section, CorrectionConfig, loss["ais"], "loss_fn.ais")
    raw = loss["ais"] if isinstance(loss["ais"], dict) else {}
    mode = ais.mode if ais else raw.get("mode", "ais")
    problems += ais_conflicts(loss, mode)
    if mode != "none":  # core's loss reads the surrogate knobs
        pg = _validated(problems, pg_loss_section, loss)
        problems += surrogate_conflicts(ais, pg) if ais and pg is not None else []
    if loss.get("ais_alarms") is not None:  # the refit guard (absent: off)
        _validated(problems, validate_section, AISAlarmsConfig, loss["ais_alarms"], "loss_fn.ais_alarms")
    warnings = tbpo_unused_warnings(loss, mode)
    nll = loss.get("positive_example_nll_weight") or 0
    if isinstance(nll, int | float) and nll > 0:
        warnings.append(
            f"loss_fn.positive_example_nll_weight={nll!r} has no effect under GRPO: NeMo-RL's GRPO training batch "
            "carries no `rewards` (v0.7.0 and main), so the VAPO term is 0 in NeMo-RL's own loss and in ours"
        )
    return Verdict(problems, f"mode={ais.mode if ais else '?'}, validated", warnings)


def bypass_problems(cfg: Mapping[str, Any]) -> list[str]:
    """``loss_fn.ais.bypass`` (pi_old := mu) on NeMo-RL: what its ``prev_logprobs`` skip needs.

    The launcher sets ``force_on_policy_ratio``, so ``grpo_train`` skips the ``prev_logprobs`` forward and asserts one
    update per rollout batch; mode ``none`` (NeMo-RL's loss) and a KL term in the reward read its placeholder zeros.
    """
    if get(cfg, "loss_fn.ais.bypass", False) is not True:
        return []
    problems = bypass_kl_in_reward_problems(get(cfg, "loss_fn", {}))
    if get(cfg, "loss_fn.ais.mode", "ais") == "none":
        problems.append(
            "loss_fn.ais.bypass=true needs a correction mode: with loss_fn.ais.mode=none the "
            "loss is NeMo-RL's ClippedPGLossFn, which reads the prev_logprobs bypass skips"
        )
    prompts = get(cfg, "grpo.num_prompts_per_step")
    generations = get(cfg, "grpo.num_generations_per_prompt")
    gbs = get(cfg, "policy.train_global_batch_size")
    if None not in (prompts, generations, gbs) and int(prompts) * int(generations) != int(gbs):
        problems.append(
            f"loss_fn.ais.bypass=true needs one update per rollout batch: policy.train_global_batch_size={gbs} must "
            f"equal grpo.num_prompts_per_step * grpo.num_generations_per_prompt = {int(prompts) * int(generations)} "
            "(pi_old := mu holds only before the first update; NeMo-RL's setup() asserts the same for the "
            "force_on_policy_ratio skip it uses)"
        )
    return problems


@check("loss_fn.ais.bypass")
def check_bypass(ctx: Context) -> Verdict | None:
    """``loss_fn.ais.bypass``: a correction mode and one update per rollout batch."""
    if ctx.get("loss_fn.ais.bypass", False) is not True:
        return None
    warnings = []
    if ctx.get("grpo.seq_logprob_error_threshold") is not None:
        warnings.append(
            "loss_fn.ais.bypass=true with grpo.seq_logprob_error_threshold set: NeMo-RL then "
            "computes prev_logprobs anyway (no time saved); the loss still uses pi_old := mu"
        )
    return Verdict(bypass_problems(ctx.cfg), "pi_old := mu, prev_logprobs forward skipped", warnings)
