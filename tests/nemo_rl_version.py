# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The NeMo-RL version this test session drives (``--nemo-rl``; set by tests/conftest.py).

``from nemo_rl_version import NEMO_RL, per_version``. A test that pins a behaviour NeMo-RL
changed between the supported versions states the expected value of each version with
:func:`per_version`, so running it against the other version checks the other value.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

NEMO_RL = os.environ["NEMO_AIS_TEST_NEMO_RL"]  # "v0.7.0" | "main"


def per_version(*, v0_7_0: T, main: T) -> T:
    """The value this session's NeMo-RL version is expected to give."""
    return {"v0.7.0": v0_7_0, "main": main}[NEMO_RL]
