# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A dict config on ONE rank of ``compute_diagnostics``: every rank raises, nobody hangs.

The wrong config type is a local input error like a bad tensor: the rank joins the
statistics all-reduce flagged, and every rank raises the same ``ValueError`` naming the
bad rank and ``compute_diagnostics(config)``. A further all-reduce then completes on both
ranks (the group is still in step).
"""

import pytest
import torch
import torch.distributed as dist
from _harness import count_collectives, run_distributed

from nemo_ais.config import CorrectionConfig
from nemo_ais.core import compute_diagnostics

pytestmark = pytest.mark.distributed


def _dict_config_on_rank_1(rank, world_size):
    logp = torch.full((2, 3), -1.0)
    mask = torch.ones(2, 3)
    config = {"mode": "ais"} if rank == 1 else CorrectionConfig(mode="ais")
    with count_collectives() as counter:
        try:
            compute_diagnostics(logp, logp - 0.1, mask, config, group=dist.group.WORLD)
            message = None
        except ValueError as err:
            message = str(err)
    after = torch.ones(1)
    dist.all_reduce(after)  # still in step: both ranks reach the same collective
    return {"message": message, "calls": counter.names(), "after": after.item()}


def test_dict_config_on_one_rank_raises_the_same_error_everywhere():
    results = run_distributed(_dict_config_on_rank_1, world_size=2, timeout=120)
    messages = {r["message"] for r in results}
    assert len(messages) == 1, messages  # the SAME message on both ranks
    (message,) = messages
    assert message is not None
    assert "rank 1: compute_diagnostics(config): got dict, expected" in message
    assert "CorrectionConfig(**d)" in message and "rank 0:" not in message
    assert results[0]["calls"] == results[1]["calls"]  # same collectives on both ranks
    assert [r["after"] for r in results] == [2.0, 2.0]
