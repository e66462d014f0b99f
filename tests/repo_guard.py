# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Tests write only under their tmp dirs (``tests/conftest.py`` wraps every test in this).

NeMo-RL's real ``Logger`` (started by the tests that drive ``grpo.setup()``) opens a
TensorBoard ``SummaryWriter`` on ``logger.log_dir``, which the shipped configs give as a
relative path (``logs/grpo_ais/...``). The tests ``monkeypatch.chdir(tmp_path)`` first, but
the writer's thread flushes later (every 120 s, and at exit) to that relative path, by
then relative to the repository: ``FileNotFoundError`` from a thread at the end of a run,
or files in the repository. :func:`writes_stay_in_tmp` closes every writer the test
started while the test's working directory is still current, then fails the test if it
left a new entry at the top of the repository.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["writes_stay_in_tmp"]


@contextlib.contextmanager
def writes_stay_in_tmp(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """Record the ``SummaryWriter``s started inside; close them on exit; guard ``repo``.

    ``monkeypatch`` must be undone after this exits (pytest's fixture is: it is set up
    before the fixture that uses it), so a ``chdir`` it made still holds when the writers
    close. Yields the list of writers started.

    Raises:
        pytest.fail.Exception: a new file or directory at the top of ``repo``, named.
    """
    before = set(os.listdir(repo))
    writers: list = []
    module = sys.modules.get("torch.utils.tensorboard.writer")  # imported with nemo_rl's logger
    if module is not None:
        real_init = module.SummaryWriter.__init__

        def init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            writers.append(self)

        monkeypatch.setattr(module.SummaryWriter, "__init__", init)
    try:
        yield writers
    finally:
        for writer in writers:  # flushes to the test's directory, then stops the thread
            writer.close()
    left = sorted(set(os.listdir(repo)) - before)
    if left:
        pytest.fail(
            f"the test left {left} in the repository {repo}: tests write under their "
            "tmp_path (or chdir to it with monkeypatch.chdir)",
            pytrace=False,
        )
