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
"""The worker-side AIS hook: prepare step before ``train()``, EMA state with checkpoints.

Plain torch (no NeMo-RL import), so it is unit-testable on CPU with a stand-in worker.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from nemo_ais.core import AISState
from nemo_ais.nemo_rl.seam import prepare_global_batches

__all__ = ["AISTrainMixin", "ais_state_path"]

logger = logging.getLogger(__name__)


def ais_state_path(weights_path: str) -> str:
    """Where the EMA state of alpha is saved next to a policy checkpoint's weights."""
    return os.path.normpath(weights_path) + ".ais_state.json"


class AISTrainMixin:
    """Put before a NeMo-RL policy worker implementation in the bases.

    ``train(data, loss_fn, ...)``: when ``loss_fn`` is an AIS loss (any mode, ``none``
    included: its statistics feed the ``ais/*`` telemetry, its weights stay 1), runs
    :func:`~nemo_ais.nemo_rl.seam.prepare_global_batches` on this worker's shard over the
    data-parallel group returned by :meth:`_ais_dp_group` -- one all-reduce per global
    batch, on every rank of every pipeline stage (all stages hold the data; a DP group
    never mixes stages, so all its ranks make the same calls) -- then calls the base
    ``train``. The EMA state advances once per global batch (not in ``eval_mode``) and
    is saved / restored with the policy checkpoint.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ais_state = AISState()
        weights_path = kwargs.get("weights_path")
        if weights_path and os.path.exists(ais_state_path(weights_path)):
            with open(ais_state_path(weights_path)) as f:
                self.ais_state.load_state_dict(json.load(f))
            logger.info("restored AIS state %s", self.ais_state.state_dict())

    def _ais_dp_group(self) -> torch.distributed.ProcessGroup:
        """The group NeMo-RL sums ``global_valid_toks`` over (backend specific)."""
        raise NotImplementedError

    def _ais_device(self) -> torch.device | None:
        return (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        )

    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """AIS prepare step, then NeMo-RL's ``train`` unchanged."""
        if hasattr(loss_fn, "attach_diagnostics"):  # any AIS loss; NeMo-RL's own: untouched
            group = self._ais_dp_group()
            global_batch_size = gbs if gbs is not None else self.cfg["train_global_batch_size"]
            prepare_global_batches(
                data,
                loss_fn,
                loss_fn.ais,
                local_batch_size=global_batch_size // torch.distributed.get_world_size(group),
                group=group,
                state=None if eval_mode else self.ais_state,
                device=self._ais_device(),
            )
        return super().train(data, loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs, **kwargs)

    def save_checkpoint(self, weights_path: str, *args: Any, **kwargs: Any) -> Any:
        """NeMo-RL's checkpoint, plus the AIS EMA state (global rank 0 writes it)."""
        out = super().save_checkpoint(weights_path, *args, **kwargs)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            with open(ais_state_path(weights_path), "w") as f:
                json.dump(self.ais_state.state_dict(), f)
        return out
