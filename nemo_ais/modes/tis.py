# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mode ``tis``: truncated importance sampling, w_hat = clamp(rho, floor, C) (NeMo-RL ``tis``)."""

from __future__ import annotations

from pydantic import Field

from nemo_ais.modes._base import Mode, Replay, log_ratio
from nemo_ais.sections import Section


class TisConfig(Section):
    """``loss_fn.ais.tis``; the cap C is the shared ``loss_fn.ais.weight_cap``."""

    floor: float | None = Field(
        None, ge=0.0, lt=1.0, description="Optional lower clamp of the tis weight (None = no floor, as NeMo-RL's tis)."
    )


def _floor(config) -> float:
    return config.tis.floor if config.tis.floor is not None else 0


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat = clamp(rho, floor, C); floor = tis.floor or 0 (NeMo-RL ``tis``)."""
    log_rho = log_ratio(logp_old, logp_rollout, valid)
    w_tok = log_rho.exp().clamp_(min=_floor(config), max=config.weight_cap)
    return w_tok.mul_(valid)


def _below_floor(old, rollout, valid, config, w_hat):
    """Valid tokens that ``tis`` raises to its floor: rho < floor (floor 0 if unset)."""
    return valid & (log_ratio(old, rollout, valid).exp() < _floor(config))


MODE = Mode(
    name="tis",
    weight=weight,
    config=TisConfig,
    moved_keys={"weight_floor": "floor"},
    replay=Replay(affected=_below_floor, frac_capped=lambda diagnostics: diagnostics.frac_capped),
)
