# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""``loss_fn``: our sections validate, and NeMo-RL's loss options that AIS replaces stay off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_ais.alarms import AISAlarmsConfig
from nemo_ais.config import CorrectionConfig, validate_section
from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.loader import get

__all__ = ["AIS_CONFLICTS", "NO_CORRECTION_HINT", "ais_conflicts", "setup_sees_importance_sampling"]

NO_CORRECTION_HINT = (
    "add a loss_fn.ais section (our correction; mode: none is the deliberately uncorrected "
    "arm) or set loss_fn.use_importance_sampling_correction=true (NeMo-RL's own)"
)
"""How to give a config the importance-sampling correction NeMo-RL's asserts require."""


def setup_sees_importance_sampling(cfg: Mapping[str, Any]) -> bool:
    """``loss_fn.use_importance_sampling_correction`` as NeMo-RL reads it under our launcher.

    NeMo-RL asserts the flag for an FP8 rollout (``grpo.setup``) and for async GRPO
    (``async_grpo_train``). ``launchers/run_grpo_ais.py`` hands ``setup()`` a view with the
    flag on whenever ``loss_fn.ais`` owns the correction, which is whenever the section is
    present (``nemo_rl_view``; a test compares the two on every case); without the
    section the flag is the user's.
    """
    loss = get(cfg, "loss_fn", {})
    return bool(loss.get("use_importance_sampling_correction", False)) or "ais" in loss


# NeMo-RL loss_fn options that must stay at their "off" value when loss_fn.ais.mode is not
# none: (off value, why). With mode none the AIS loss is NeMo-RL's ClippedPGLossFn unchanged.
# The one table for both this offline check and nemo_ais.nemo_rl.loss.AISLossConfig.
_AIS_CONFLICT_TABLE: dict[str, tuple[Any, str]] = {
    "use_importance_sampling_correction": (
        False,
        "AIS is itself the importance-sampling correction; enabling both weights the loss twice",
    ),
    "truncated_importance_sampling_type": (
        None,
        "AIS replaces NeMo-RL's truncated IS; use loss_fn.ais.mode (tis, icepop, seq_mask_geo)",
    ),
    "sequence_level_importance_ratios": (False, "not supported with AIS (GSPO ratios)"),
    "force_on_policy_ratio": (False, "AIS needs prev_logprobs, which this option skips"),
    "use_cispo": (False, "not supported with AIS"),
    "use_on_policy_kl_approximation": (False, "not supported with AIS"),
    "positive_example_nll_weight": (0.0, "not supported with AIS (VAPO NLL term)"),
}
AIS_CONFLICTS: dict[str, Any] = {knob: off for knob, (off, _) in _AIS_CONFLICT_TABLE.items()}
"""NeMo-RL ``loss_fn`` option -> the value it must keep when ``loss_fn.ais.mode`` is not none."""


def ais_conflicts(loss_fn: Mapping[str, Any], mode: str) -> list[str]:
    """One message per NeMo-RL ``loss_fn`` option that conflicts with ``loss_fn.ais.mode``.

    Args:
        loss_fn: the ``loss_fn`` section (absent keys count as off).
        mode: the validated ``loss_fn.ais.mode``; ``"none"`` conflicts with nothing.
    """
    if mode == "none":
        return []
    return [
        f"loss_fn.{knob}={loss_fn[knob]!r} conflicts with loss_fn.ais.mode={mode!r}: {why} "
        f"(set loss_fn.{knob}: {'null' if off is None else str(off).lower()}, or "
        "loss_fn.ais.mode: none to use NeMo-RL's own loss)"
        for knob, (off, why) in _AIS_CONFLICT_TABLE.items()
        if loss_fn.get(knob, off) != off
    ]


@check("loss_fn.ais", mixins=True)
def check_loss_sections(ctx: Context) -> Verdict:
    """``loss_fn.ais`` is a CorrectionConfig, ``loss_fn.ais_alarms`` an AISAlarmsConfig, no conflict."""
    loss = ctx.get("loss_fn", {})
    if "ais" not in loss:
        return Verdict(warnings=["no loss_fn.ais section: the AIS loss is not configured"])
    problems = []
    try:
        ais = validate_section(CorrectionConfig, loss["ais"], "loss_fn.ais")
    except (TypeError, ValueError) as err:
        problems.append(str(err).replace("\n", "; "))
        ais = None
    raw = loss["ais"] if isinstance(loss["ais"], dict) else {}
    mode = ais.mode if ais else raw.get("mode", "ais")
    problems += ais_conflicts(loss, mode)
    if loss.get("ais_alarms") is not None:  # the refit guard (absent: off)
        try:
            validate_section(AISAlarmsConfig, loss["ais_alarms"], "loss_fn.ais_alarms")
        except (TypeError, ValueError) as err:
            problems.append(str(err).replace("\n", "; "))
    return Verdict(problems, f"mode={ais.mode if ais else '?'}, validated")
