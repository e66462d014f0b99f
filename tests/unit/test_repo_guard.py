# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Tests write only under their tmp dirs (issue 28, item 10; ``tests/repo_guard.py``).

NeMo-RL's real ``Logger`` with TensorBoard on, on a relative ``log_dir`` as the shipped
configs give it (``logs/grpo_ais/...``), started after ``monkeypatch.chdir(tmp_path)``
as the tests that drive ``grpo.setup()`` do. Without the guard, the writer's later flush
(its thread's, every 120 s, or at exit) resolves the relative path against whatever the
working directory is by then (``FileNotFoundError: ... b'logs/grpo_ais/.../tensorboard/
events.out.tfevents...'`` from the thread, the warnings at the end of a full run). With
it, the writer is closed while the test's directory is current: the events land under
tmp_path, complete.
"""

from __future__ import annotations

import pytest
from repo_guard import writes_stay_in_tmp


def _logger(log_dir: str):
    from nemo_rl.utils.logger import Logger

    return Logger(
        {
            "log_dir": log_dir,
            "wandb_enabled": False,
            "swanlab_enabled": False,
            "tensorboard_enabled": True,
            "tensorboard": {},
            "mlflow_enabled": False,
            "monitor_gpus": False,
        }
    )


def _scalars(events_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_guard_closes_the_writer_where_the_test_ran(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    repo.mkdir()
    work.mkdir()
    mp = pytest.MonkeyPatch()
    try:
        with writes_stay_in_tmp(repo, mp) as writers:
            mp.chdir(work)
            logger = _logger("logs/grpo_ais/run")
            logger.log_metrics({"loss": 0.5, "reward": 0.25}, step=3, prefix="train")
    finally:
        mp.undo()  # pytest undoes the test's monkeypatch after the guard, as here
    assert writers == [logger.loggers[0].writer]
    assert writers[0].file_writer is None  # closed: flushed, its thread stopped
    assert _scalars(work / "logs/grpo_ais/run/tensorboard") == {"train/loss": [(3, 0.5)], "train/reward": [(3, 0.25)]}
    assert list(repo.iterdir()) == []


def test_a_file_left_in_the_repository_fails_the_test_naming_it(tmp_path):
    mp = pytest.MonkeyPatch()
    with pytest.raises(pytest.fail.Exception, match=r"left \['logs'\] in the repository"):
        with writes_stay_in_tmp(tmp_path, mp):
            (tmp_path / "logs").mkdir()
    mp.undo()
    with writes_stay_in_tmp(tmp_path, mp):  # what was there before the test is not its doing
        pass
    mp.undo()
