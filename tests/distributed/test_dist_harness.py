# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Self-tests of the gloo harness: results, collective counting, failures and deadlocks."""

from __future__ import annotations

import importlib
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist
from _harness import assert_same_bits, count_collectives, float_bits, run_distributed
from torch.distributed import all_reduce as imported_all_reduce

pytestmark = pytest.mark.distributed

# read when a rank imports this module to unpickle its function (see the test below)
_PROBE_AT_IMPORT = os.environ.get("NEMO_AIS_HARNESS_PROBE")


def _count_worker(rank: int, world_size: int, scale: float) -> dict:
    with count_collectives(module_prefixes=(__name__,)) as counter:
        t = torch.full((3,), scale * rank, dtype=torch.float64)
        dist.all_reduce(t)
        imported_all_reduce(t, op=dist.ReduceOp.MAX)  # bound by name: caught too
        objs = [None] * world_size
        dist.all_gather_object(objs, {"rank": rank})  # calls all_gather inside: counted once
        dist.barrier()
    return {
        "t": t.tolist(),
        "names": counter.names(),
        "nbytes": [c.nbytes for c in counter.calls],
        "ops": [c.op for c in counter.calls],
        "objs": objs,
        "env": (dist.get_rank(), dist.get_world_size(), torch.get_num_threads()),
    }


def test_results_and_collective_counts_two_ranks():
    results = run_distributed(_count_worker, 2, args=(2.0,), timeout=120)
    # sum of [0, 2] = 2, then MAX over identical values = 2
    for rank, res in enumerate(results):
        assert res["t"] == [2.0, 2.0, 2.0]
        assert res["names"] == ["all_reduce", "all_reduce", "all_gather_object", "barrier"]
        assert res["nbytes"][:2] == [24, 24]
        assert res["ops"][:2] == [str(dist.ReduceOp.SUM), str(dist.ReduceOp.MAX)]
        assert res["objs"] == [{"rank": 0}, {"rank": 1}]
        assert res["env"] == (rank, 2, 1)


def _setup_worker(rank: int, world_size: int) -> dict:
    return {
        "probe": os.environ.get("NEMO_AIS_HARNESS_PROBE"),
        "probe_at_import": _PROBE_AT_IMPORT,
        "path": list(sys.path),
        "preloaded": "_rank_preload" in sys.modules,
    }


def test_ranks_get_the_callers_environment_and_path_at_the_call(monkeypatch, tmp_path):
    # forked from a server started earlier: what the caller set since must still arrive,
    # in fn and in fn's module as a rank imports it
    (first,) = run_distributed(_setup_worker, 1, timeout=120)  # the server runs from here on
    assert first["preloaded"]  # the ranks are forked with the preload done
    monkeypatch.setenv("NEMO_AIS_HARNESS_PROBE", "set after the server started")
    monkeypatch.syspath_prepend(str(tmp_path))
    (res,) = run_distributed(_setup_worker, 1, timeout=120)
    assert res["probe"] == res["probe_at_import"] == "set after the server started"
    assert str(tmp_path) in res["path"]


def _raise_worker(rank: int, world_size: int) -> None:
    raise ValueError(f"boom on rank {rank}")


def _hang_worker(rank: int, world_size: int) -> None:
    time.sleep(600)


def test_a_function_whose_module_fails_to_import_is_reported_with_traceback(tmp_path, monkeypatch):
    # the rank imports fn's module itself (to unpickle fn): a failure there is its report
    (tmp_path / "_harness_broken_mod.py").write_text(
        "import os\n"
        "if os.environ.get('NEMO_AIS_HARNESS_BREAK'):\n"
        "    raise RuntimeError('broken at import')\n"
        "def fn(rank, world_size):\n"
        "    return rank\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fn = importlib.import_module("_harness_broken_mod").fn
        assert run_distributed(fn, 2, timeout=120) == [0, 1]
        monkeypatch.setenv("NEMO_AIS_HARNESS_BREAK", "1")
        with pytest.raises(RuntimeError, match=r"(?s)rank 0 ---.*RuntimeError: broken at import"):
            run_distributed(fn, 2, timeout=120)
    finally:
        sys.modules.pop("_harness_broken_mod", None)


def test_rank_exception_is_reported_with_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 0 ---.*ValueError: boom on rank 0"):
        run_distributed(_raise_worker, 1, timeout=120)


def _raise_on_rank1_worker(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def test_a_rank_that_fails_alone_is_the_whole_report():
    # rank 0 finishes; rank 1's error is the report, and rank 0 is neither failed nor stuck
    with pytest.raises(RuntimeError) as info:
        run_distributed(_raise_on_rank1_worker, 2, timeout=120)
    message = str(info.value)
    assert "ValueError: boom on rank 1" in message
    assert "rank 0 ---" not in message and "still running" not in message


def _extra_barrier_worker(rank: int, world_size: int) -> int:
    if rank == 0:
        dist.barrier()  # a collective the other rank never runs
    return rank


def test_a_rank_that_adds_a_collective_is_not_matched_by_the_harness():
    # the harness's own barrier runs before fn: nothing after fn can pair with a rank's extra one
    with pytest.raises((RuntimeError, TimeoutError)):
        run_distributed(_extra_barrier_worker, 2, timeout=20)


def test_deadlock_fails_with_timeout_and_kills_ranks():
    start = time.monotonic()
    # the harness's timeout path is the same whether the rank still imports or already hangs
    with pytest.raises(TimeoutError, match=r"did not finish within 4 s"):
        run_distributed(_hang_worker, 1, timeout=4)
    assert time.monotonic() - start < 60


def test_counter_without_process_group_and_restores_functions():
    original = dist.all_reduce
    with count_collectives() as counter:
        assert dist.all_reduce is not original
    assert dist.all_reduce is original
    assert len(counter) == 0 and counter.count("all_reduce") == 0


def test_float_bits_and_assert_same_bits():
    assert float_bits(1.0) == "3ff0000000000000"
    assert float_bits(torch.tensor(-0.0)) == "8000000000000000"
    assert_same_bits([{"a": 0.1 + 0.2}, {"a": 0.30000000000000004}])
    with pytest.raises(AssertionError, match=r"'a' differs across ranks"):
        assert_same_bits([{"a": 0.0}, {"a": -0.0}])
