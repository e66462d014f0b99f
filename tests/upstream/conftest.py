# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Fixtures for tests that drive NeMo-RL v0.7.0's real driver code.

``local_ray``: one local Ray instance per session (1 CPU, no dashboard, ~6 s to start),
for upstream code that calls ``ray.get`` on what a worker group returns. Tests hand it
real ``ObjectRef``s (``ray.put(...)``) from a recording stand-in of the worker group, so
upstream's ``ray.get`` runs unpatched.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def local_ray():
    """A started local Ray (the ``ray`` module); shut down at the end of the session."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
