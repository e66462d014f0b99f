# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup: deterministic fp64-friendly defaults, CPU threads kept small."""

import os

import pytest
import torch

# Two cores on CI: keep intra-op threads small so gloo multi-process tests do not
# oversubscribe the machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
