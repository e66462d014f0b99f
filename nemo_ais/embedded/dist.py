# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Data-parallel harness of the embedded recipe: gloo processes on 127.0.0.1.

:func:`launch` spawns one process per rank (none for a single rank); they join one gloo group through a rendezvous file
in a private temporary directory (no TCP port picked in advance that another process could take before the bind).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RecipeError(RuntimeError):
    """An expected failure of the embedded recipe, with a message for the user."""


@dataclass(frozen=True)
class DistContext:
    """This rank's place in the data-parallel group (``group`` None: single process)."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None

    @property
    def is_main(self) -> bool:
        """Rank 0 writes metrics, checkpoints and progress."""
        return self.rank == 0


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """In-place SUM over the DP group (no-op for one process); returns ``tensor``."""
    if ctx.group is not None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=ctx.group)
    return tensor


def _exit_with(launcher: int) -> None:
    """A rank's daemon thread: end the rank within a second of its launcher's death (no orphan writes on)."""
    while os.getppid() == launcher:
        time.sleep(1.0)
    os._exit(1)


def _worker(
    rank: int,
    world_size: int,
    store: str,
    timeout_s: float,
    num_threads: int,
    errors: Any,
    launcher: int,
    fn: Callable[..., None],
    args: tuple,
) -> None:
    threading.Thread(target=_exit_with, args=(launcher,), daemon=True).start()
    torch.set_num_threads(num_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    # init_process_group can return while a peer still runs gloo's connectFullMesh; a rank that then exits (fn without a
    # collective, e.g. a finished run resumed) closes the pair under it. One barrier, before fn only: fn's own
    # collectives stay unmatched if a rank skips or adds one.
    dist.barrier()
    try:
        fn(DistContext(rank, world_size, dist.group.WORLD), *args)
    except RecipeError as err:
        errors.put((rank, "RecipeError", str(err)))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        errors.put((rank, "KeyboardInterrupt", ""))
        raise SystemExit(130) from None
    except BaseException as err:
        errors.put((rank, type(err).__name__, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(
    fn: Callable[..., None], args: tuple, *, world_size: int, num_threads: int = 1, timeout_s: float = 600.0
) -> None:
    """Run ``fn(ctx, *args)`` on ``world_size`` data-parallel ranks (1: in this process, collectives skipped).

    Raises:
        RecipeError: a rank raised one (the same message, not a wrapped traceback), or a rank failed (its traceback).
        KeyboardInterrupt: the run was interrupted (Ctrl-C reaches every rank).
    """
    if world_size == 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(num_threads)
        try:
            fn(DistContext(0, 1, None), *args)
        finally:
            torch.set_num_threads(threads)
        return
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="nemo_ais_rdzv_") as rdzv:
        store = os.path.join(rdzv, "store")
        try:
            mp.start_processes(
                _worker,
                args=(world_size, store, timeout_s, num_threads, errors, os.getpid(), fn, args),
                nprocs=world_size,
                join=True,
                start_method="spawn",
            )
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
            _reraise(errors, err)


def _reraise(errors: Any, err: Exception) -> None:
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    reports.sort()
    if any(kind == "KeyboardInterrupt" for _, kind, _ in reports):
        raise KeyboardInterrupt
    for _rank, kind, message in reports:
        if kind == "RecipeError":
            raise RecipeError(message) from None
    if reports:
        rank, kind, message = reports[0]
        raise RecipeError(f"trainer rank {rank} failed with {kind}:\n{message}") from None
    raise RecipeError(f"a trainer process failed: {err}") from None
