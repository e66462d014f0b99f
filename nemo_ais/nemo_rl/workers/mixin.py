# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The worker-side AIS hook (plain torch): prepare step and refit guard before ``train()``."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from nemo_ais.alarms import AlarmConfig, AlarmMonitor, RefitAlarmError, alarm_metrics
from nemo_ais.core import AISDiagnostics, AISState
from nemo_ais.nemo_rl.seam import LOSS_KEYS, prepare_global_batches

logger = logging.getLogger(__name__)


def ais_state_path(weights_path: str) -> str:
    """Where the EMA state of alpha is saved next to a policy checkpoint's weights."""
    return os.path.normpath(weights_path) + ".ais_state.json"


def ais_alarm_state_path(weights_path: str) -> str:
    """Where the refit guard's recent history is saved, next to :func:`ais_state_path`."""
    return os.path.normpath(weights_path) + ".ais_alarms.json"


class AISTrainMixin:
    """Put before a NeMo-RL policy worker implementation in the bases.

    ``train()`` with an AIS loss (any mode) first runs :func:`~nemo_ais.nemo_rl.seam.prepare_global_batches` over
    :meth:`_ais_dp_group` (one all-reduce per global batch, on every pipeline stage); the EMA state advances once per
    global batch (not in ``eval_mode``). The refit guard (``loss_fn.ais_alarms.enabled``) observes each global batch's
    diagnostics, identical on every rank: with ``fail_on_alarm`` all ranks raise together before the optimizer step.
    Both the EMA state and the guard's history are saved with the checkpoint.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ais_state = AISState()
        self.ais_alarm_monitor: AlarmMonitor | None = None
        self._ais_alarm_history: dict[str, Any] = {}
        weights_path = kwargs.get("weights_path")
        if weights_path and os.path.exists(ais_state_path(weights_path)):
            with open(ais_state_path(weights_path)) as f:
                self.ais_state.load_state_dict(json.load(f))
            logger.info("restored AIS state %s", self.ais_state.state_dict())
        elif weights_path:  # e.g. a checkpoint of upstream's entry point: alpha's EMA starts afresh
            logger.warning("no AIS state beside %s: alpha's EMA state starts afresh", weights_path)
        if weights_path and os.path.exists(ais_alarm_state_path(weights_path)):
            with open(ais_alarm_state_path(weights_path)) as f:
                self._ais_alarm_history = json.load(f)

    def _ais_dp_group(self) -> torch.distributed.ProcessGroup:
        """The group NeMo-RL sums ``global_valid_toks`` over (backend specific)."""
        raise NotImplementedError

    def _ais_device(self) -> torch.device | None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None

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
            diagnostics = prepare_global_batches(
                data,
                loss_fn,
                loss_fn.ais,
                local_batch_size=global_batch_size // torch.distributed.get_world_size(group),
                group=group,
                state=None if eval_mode else self.ais_state,
                device=self._ais_device(),
                loss_keys=getattr(loss_fn, "loss_keys", LOSS_KEYS),
            )
            alarms = getattr(loss_fn, "ais_alarms", None)
            if alarms is not None and alarms.enabled and not eval_mode:
                loss_fn.attach_alarms(self._ais_observe_alarms(alarms, diagnostics))
        return super().train(data, loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs, **kwargs)

    def begin_train_step(self, loss_fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Main's split train-step API: ``NotImplementedError`` for an AIS loss (it gets no data), else upstream's."""
        if hasattr(loss_fn, "attach_diagnostics"):
            raise NotImplementedError(
                "begin_train_step (NeMo-RL main's split train-step API, driven by TransferQueue's TQPolicy when "
                "data_plane.enabled=true) is not supported with the nemo_ais loss: its per-global-batch prepare step "
                "needs the whole global batch before the first loss call, and begin_train_step receives no data. Set "
                "data_plane.enabled=false (train() runs the prepare step)."
            )
        return super().begin_train_step(loss_fn, *args, **kwargs)

    def _ais_monitor(self, config: AlarmConfig) -> AlarmMonitor:
        """The worker's monitor; rebuilt (history kept) if the thresholds changed."""
        thresholds = AlarmConfig(**config.model_dump(include=set(AlarmConfig.model_fields)))
        thresholds = thresholds.model_copy(update={"fail_on_alarm": False})  # raised here
        monitor = self.ais_alarm_monitor
        if monitor is None or monitor.config != thresholds:
            history = monitor.state_dict() if monitor is not None else self._ais_alarm_history
            monitor = self.ais_alarm_monitor = AlarmMonitor(thresholds)
            monitor.load_state_dict(history)
        return monitor

    def _ais_observe_alarms(self, config: Any, diagnostics: list[AISDiagnostics]) -> list[dict[str, float]]:
        """Observe each global batch (step: ``ais_state.num_updates``); ``ais_alarm/*`` per batch.

        Raises:
            RefitAlarmError: ``config.fail_on_alarm`` and an alarm fired (every rank).
        """
        monitor = self._ais_monitor(config)
        first = self.ais_state.num_updates - len(diagnostics) + 1
        out = []
        for g, d in enumerate(diagnostics):
            fired = monitor.observe(first + g, d)
            for alarm in fired:
                logger.warning(
                    "AIS refit guard: global batch %d since the start of training: %s: %s",
                    first + g,
                    alarm.kind,
                    alarm.evidence,
                )
            if fired and config.fail_on_alarm:
                raise RefitAlarmError(
                    f"AIS refit guard (loss_fn.ais_alarms.fail_on_alarm=true) failed the step: "
                    f"global batch {first + g} since the start of training (global batch {g} "
                    f"of {len(diagnostics)} in this train() call): "
                    + "; ".join(f"{a.kind}: {a.evidence}" for a in fired)
                    + ". Check the FP8 refit (weights and KV-cache scales) of this step, or set "
                    "loss_fn.ais_alarms.fail_on_alarm=false to only log ais_alarm/*."
                )
            out.append(alarm_metrics(fired))
        return out

    def save_checkpoint(self, weights_path: str, *args: Any, **kwargs: Any) -> Any:
        """NeMo-RL's checkpoint, plus the AIS EMA state and refit-guard history (rank 0)."""
        out = super().save_checkpoint(weights_path, *args, **kwargs)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            os.makedirs(os.path.dirname(os.path.normpath(weights_path)) or ".", exist_ok=True)
            with open(ais_state_path(weights_path), "w") as f:
                json.dump(self.ais_state.state_dict(), f)
            # the restored history too when no train() has built the monitor since (alarms off after a resume)
            monitor = self.ais_alarm_monitor
            history = monitor.state_dict() if monitor is not None else self._ais_alarm_history
            if history:
                with open(ais_alarm_state_path(weights_path), "w") as f:
                    json.dump(history, f)
        return out


class AISDTensorMixin(AISTrainMixin):
    """:class:`AISTrainMixin` over the device mesh's ``dp`` group (no context-parallel ranks)."""

    def _ais_dp_group(self):
        return self.dp_mesh.get_group()
