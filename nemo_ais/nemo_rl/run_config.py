# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The ``MasterConfig`` the launcher hands NeMo-RL: driver view inside, the user's config outside.

``grpo.setup()`` gets a view of the user's config (NeMo-RL's IS correction flag on); a dump
of that view, re-run with upstream's ``run_grpo.py``, would correct twice, so
:class:`AISMasterConfig` dumps the user's ``loss_fn`` plus :data:`RUN_MARKER_KEY`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from nemo_rl.algorithms.grpo import MasterConfig
from pydantic import PrivateAttr

RUN_MARKER_KEY = "nemo_ais_run"
"""Top-level key of the logged / checkpointed config that says which loss ran."""

LOSS_CLASS = "nemo_ais.nemo_rl.AISClippedPGLossFn"
RELAUNCH = "launchers/run_grpo_ais.py --config <this file> (not NeMo-RL's run_grpo.py)"


class AISMasterConfig(MasterConfig):
    """NeMo-RL's ``MasterConfig`` whose ``model_dump()`` is the user's config plus a marker."""

    _user_loss_fn: dict[str, Any] = PrivateAttr(default_factory=dict)
    _marker: dict[str, Any] = PrivateAttr(default_factory=dict)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The view's dump with ``loss_fn`` the user's and :data:`RUN_MARKER_KEY` added."""
        out = super().model_dump(**kwargs)
        if "loss_fn" in out:
            out["loss_fn"] = copy.deepcopy(self._user_loss_fn)
        out[RUN_MARKER_KEY] = copy.deepcopy(self._marker)
        return out


def ais_master_config(config: Mapping[str, Any], view: Mapping[str, Any], ais_cfg: Any) -> AISMasterConfig:
    """``MasterConfig`` of the driver ``view`` that logs and saves the user's ``config``.

    ``ais_cfg`` is the validated ``loss_fn``; the marker's ``driver_view`` holds the
    ``loss_fn`` keys upstream's driver read with another value.
    """
    view = {k: v for k, v in view.items() if k != RUN_MARKER_KEY}  # a re-run saved config
    master = AISMasterConfig(**view)
    user = dict(config.get("loss_fn") or {})
    master._user_loss_fn = copy.deepcopy(user)
    changed = (view.get("loss_fn") or {}).items()
    master._marker = {
        "loss": LOSS_CLASS,
        "mode": ais_cfg.ais.mode,
        "bypass": ais_cfg.ais.bypass,
        "relaunch": RELAUNCH,
        "driver_view": {f"loss_fn.{k}": v for k, v in changed if k not in user or user[k] != v},
    }
    return master
