# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the end-to-end modules."""

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One warm-start cache for every e2e module.

    A cache file is named by the hash of the model, data and warm-start config, so runs of
    one config train their warm start once per session and runs of another config never
    read it.
    """
    return tmp_path_factory.mktemp("warmstart_cache")
