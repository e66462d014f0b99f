# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NeMo-RL ``loss_fn`` options that AIS replaces: one table for the loss and the offline check."""

from __future__ import annotations

from collections.abc import Mapping
from difflib import get_close_matches
from typing import Any

AIS_SECTIONS = ("ais", "ais_alarms")
"""The ``loss_fn`` sub-sections nemo_ais reads (NeMo-RL's ``loss_fn`` allows extra keys)."""

# (off value, why) of each option of AIS_CONFLICTS; also read by nemo_ais.nemo_rl.loss.AISLossConfig. Core's use_cispo,
# sequence_level_importance_ratios, use_on_policy_kl_approximation and positive_example_nll_weight are validated by
# nemo_ais.config.PGLossConfig.
_AIS_CONFLICT_TABLE: dict[str, tuple[Any, str]] = {
    "use_importance_sampling_correction": (
        False,
        "AIS is itself the importance-sampling correction; enabling both weights the loss twice",
    ),
    "truncated_importance_sampling_type": (
        None,
        "AIS replaces NeMo-RL's truncated IS; use loss_fn.ais.mode (tis, icepop, seq_mask_geo)",
    ),
    "force_on_policy_ratio": (False, "AIS needs prev_logprobs, which this option skips"),
}
AIS_CONFLICTS: dict[str, Any] = {knob: off for knob, (off, _) in _AIS_CONFLICT_TABLE.items()}
"""NeMo-RL ``loss_fn`` option -> the value it must keep when ``loss_fn.ais.mode`` is not none."""


def unknown_ais_sections(loss_fn: Mapping[str, Any]) -> list[str]:
    """``loss_fn`` keys named like ours that are not (a typo NeMo-RL's loss config keeps)."""
    return [
        f"loss_fn.{key} is not a known section: nemo_ais reads {' and '.join('loss_fn.' + s for s in AIS_SECTIONS)}"
        + "".join(f" (did you mean loss_fn.{m}?)" for m in get_close_matches(key, AIS_SECTIONS, 1))
        for key in loss_fn
        if key.startswith("ais") and key not in AIS_SECTIONS
    ]


def ais_conflicts(loss_fn: Mapping[str, Any], mode: str) -> list[str]:
    """One message per NeMo-RL ``loss_fn`` option conflicting with ``mode`` (absent keys: off).

    Mode ``none`` is NeMo-RL's own loss, so only ``force_on_policy_ratio`` conflicts with it: the ``ais/*`` telemetry
    would be formed from the zeros that option leaves in ``prev_logprobs``.
    """
    if mode == "none":
        return (
            [
                "loss_fn.force_on_policy_ratio=True conflicts with the AIS loss (loss_fn.ais.mode none, or no "
                "loss_fn.ais, too): NeMo-RL then skips the prev_logprobs forward and leaves zeros, from which the "
                "ais/* diagnostics and the refit guard would read log(pi_old / mu) = -log(mu) (set it to false, or "
                "run it with NeMo-RL's own entry point, without nemo_ais)"
            ]
            if loss_fn.get("force_on_policy_ratio", False)
            else []
        )
    return [
        f"loss_fn.{knob}={loss_fn[knob]!r} conflicts with loss_fn.ais.mode={mode!r}: {why} (set loss_fn.{knob}: "
        f"{'null' if off is None else str(off).lower()}, or loss_fn.ais.mode: none to use NeMo-RL's own loss)"
        for knob, (off, why) in _AIS_CONFLICT_TABLE.items()
        if loss_fn.get(knob, off) != off
    ]


def bypass_kl_in_reward_problems(loss_fn: Mapping[str, Any]) -> list[str]:
    """``loss_fn.ais.bypass`` with a KL term in the reward (``use_kl_in_reward``, beta != 0).

    Bypass fills ``prev_logprobs`` with zeros, and the advantage estimator would subtract ``beta * KL`` of zeros
    (NeMo-RL main asserts against it; v0.7.0 does not).
    """
    ais = loss_fn.get("ais")
    bypass = getattr(ais, "bypass", None) if not isinstance(ais, Mapping) else ais.get("bypass")
    beta = loss_fn.get("reference_policy_kl_penalty", 0) or 0
    if bypass is not True or not loss_fn.get("use_kl_in_reward", False) or beta == 0:
        return []
    return [
        f"loss_fn.ais.bypass=true with loss_fn.use_kl_in_reward=true and loss_fn.reference_policy_kl_penalty={beta!r} "
        "is invalid: bypass skips the prev_logprobs forward (NeMo-RL fills zeros) and the reward's KL term reads "
        "prev_logprobs, so the advantages would carry the KL of zeros to the reference (NeMo-RL main asserts the same; "
        "v0.7.0 does not). Set loss_fn.use_kl_in_reward: false (the KL term in the loss), "
        "loss_fn.reference_policy_kl_penalty: 0, or loss_fn.ais.bypass: false"
    ]
