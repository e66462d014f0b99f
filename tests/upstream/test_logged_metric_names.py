# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The names docs/metrics.md gives the ``ais/*`` metrics on W&B / TensorBoard: ``train/ais/...``.

Checked against the NeMo-RL version this session drives: ``grpo_train`` and
``async_grpo_train`` put the workers' metrics in the step's dict and log it with
``prefix="train"`` (their source), and upstream's real ``TensorboardLogger`` and
``WandbLogger`` turn a loss key into ``train/<key>`` (TensorBoard's event file is read back;
W&B's ``run.log`` is a recorder). The doc's ``train/...`` names are loss keys with that prefix.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from nemo_rl.algorithms import grpo
from nemo_rl.utils.logger import TensorboardLogger, WandbLogger

from nemo_ais.core import METRICS
from nemo_ais.nemo_rl.loss import ALARM_METRIC_KEYS, PER_GLOBAL_BATCH_ALPHA

pytestmark = pytest.mark.nemo_rl

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
LOSS_KEYS = {m.name for m in METRICS} | set(ALARM_METRIC_KEYS)
LOSS_KEYS |= {PER_GLOBAL_BATCH_ALPHA.format(g) for g in range(2)}  # the doc's two examples


@pytest.mark.parametrize(
    ("trainer", "call"),
    [
        (grpo.grpo_train, 'logger.log_metrics(metrics, total_steps + 1, prefix="train")'),
        (grpo.async_grpo_train, 'logger.log_metrics(metrics, step + 1, prefix="train")'),
    ],
    ids=["grpo_train", "async_grpo_train"],
)
def test_grpo_logs_the_workers_metrics_under_train(trainer, call):
    source = inspect.getsource(trainer)
    assert 'metrics.update(train_results["all_mb_metrics"])' in source
    assert source.count(call) == 1


def test_tensorboard_tag_is_train_slash_the_loss_key(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorboardLogger({"log_dir": str(tmp_path)}, log_dir=str(tmp_path))
    logger.log_metrics({"ais/alpha": 0.25, "ais_alarm/tmpe_jump": 1.0}, 3, prefix="train")
    logger.writer.flush()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/ais/alpha", "train/ais_alarm/tmpe_jump"}
    (scalar,) = events.Scalars("train/ais/alpha")
    assert (scalar.step, scalar.value) == (3, 0.25)


def test_wandb_key_is_train_slash_the_loss_key():
    class Run:
        def __init__(self) -> None:
            self.logged: list[tuple[dict, dict]] = []

        def log(self, metrics, **kwargs):
            self.logged.append((metrics, kwargs))

    logger = WandbLogger.__new__(WandbLogger)  # no wandb.init: only the run's log() is used
    logger.run = Run()
    logger.log_metrics({"ais/alpha": 0.25}, 3, prefix="train")
    ((metrics, kwargs),) = logger.run.logged
    assert metrics == {"train/ais/alpha": 0.25} and kwargs["step"] == 3


def test_the_docs_train_names_are_loss_keys():
    section = DOC.read_text().split("## On W&B and TensorBoard", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`train/(ais(?:_alarm)?/\w+)`", section))
    assert {"ais/alpha", "ais/severity", "ais/ess_seq", "ais_alarm/tmpe_jump"} <= names
    assert names <= LOSS_KEYS, sorted(names - LOSS_KEYS)
