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
"""The ``MasterConfig`` the launcher hands NeMo-RL: driver view inside, the user's config outside.

``launchers/run_grpo_ais.py`` gives ``grpo.setup()`` / ``grpo_train`` a *view* of the
user's config (:func:`run_grpo_ais.nemo_rl_view`): NeMo-RL's
``loss_fn.use_importance_sampling_correction`` on (its FP8 / async asserts) and, under
``loss_fn.ais.bypass``, ``loss_fn.force_on_policy_ratio`` on (the ``prev_logprobs``
skip). Those flags drive upstream's driver; the loss that trains is the AIS loss.

NeMo-RL writes ``master_config.model_dump()`` to every logger (``Logger.log_hyperparams``
in ``grpo.setup``: W&B, TensorBoard, MLflow, ...) and into each checkpoint's
``config.yaml`` (``CheckpointManager.init_tmp_checkpoint``); nothing else calls it. A
dump of the view would record a config that, re-run with upstream's ``run_grpo.py``,
corrects twice (NeMo-RL's IS on top of ``loss_fn.ais``) or trains on the zeroed
``prev_logprobs``. :class:`AISMasterConfig` therefore dumps the user's own ``loss_fn``
and adds :data:`RUN_MARKER_KEY`, which says which loss ran, how to re-run the config and
which keys the driver saw differently. Attribute access (``master_config.loss_fn``) is
unchanged: upstream's driver still reads the view.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from nemo_rl.algorithms.grpo import MasterConfig
from pydantic import PrivateAttr

__all__ = ["RUN_MARKER_KEY", "AISMasterConfig", "ais_master_config"]

RUN_MARKER_KEY = "nemo_ais_run"
"""Top-level key of the logged / checkpointed config that says which loss ran."""

LOSS_CLASS = "nemo_ais.nemo_rl.AISClippedPGLossFn"
RELAUNCH = "launchers/run_grpo_ais.py --config <this file> (not NeMo-RL's run_grpo.py)"


class AISMasterConfig(MasterConfig):
    """NeMo-RL's ``MasterConfig`` whose ``model_dump()`` is the user's config plus a marker.

    Built by :func:`ais_master_config`; the fields hold the driver view.
    """

    _user_loss_fn: dict[str, Any] = PrivateAttr(default_factory=dict)
    _marker: dict[str, Any] = PrivateAttr(default_factory=dict)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The view's dump with ``loss_fn`` the user's and :data:`RUN_MARKER_KEY` added."""
        out = super().model_dump(**kwargs)
        if "loss_fn" in out:
            out["loss_fn"] = copy.deepcopy(self._user_loss_fn)
        out[RUN_MARKER_KEY] = copy.deepcopy(self._marker)
        return out


def _changed(user: Mapping[str, Any], view: Mapping[str, Any]) -> dict[str, Any]:
    """``loss_fn.<key>: value`` for every key whose value the driver view changed."""
    return {f"loss_fn.{k}": v for k, v in view.items() if k not in user or user[k] != v}


def ais_master_config(
    config: Mapping[str, Any], view: Mapping[str, Any], ais_cfg: Any
) -> AISMasterConfig:
    """``MasterConfig`` of the driver ``view`` that logs and saves the user's ``config``.

    Args:
        config: the user's resolved config (after Hydra overrides).
        view: :func:`run_grpo_ais.nemo_rl_view` of it (may be ``config`` itself).
        ais_cfg: the validated ``loss_fn`` (:class:`~nemo_ais.nemo_rl.AISLossConfig`).

    Returns:
        :class:`AISMasterConfig` whose fields are the view's and whose ``model_dump()`` has
        the user's ``loss_fn`` and the :data:`RUN_MARKER_KEY` section: ``loss`` (the class),
        ``mode`` and ``bypass`` (``loss_fn.ais``), ``relaunch`` and ``driver_view`` (the
        ``loss_fn`` keys upstream's driver read with another value).
    """
    view = {k: v for k, v in view.items() if k != RUN_MARKER_KEY}  # a re-run saved config
    master = AISMasterConfig(**view)
    user_loss_fn = dict(config.get("loss_fn") or {})
    master._user_loss_fn = copy.deepcopy(user_loss_fn)
    master._marker = {
        "loss": LOSS_CLASS,
        "mode": ais_cfg.ais.mode,
        "bypass": ais_cfg.ais.bypass,
        "relaunch": RELAUNCH,
        "driver_view": _changed(user_loss_fn, view.get("loss_fn") or {}),
    }
    return master
