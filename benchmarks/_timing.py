# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Timers the benchmarks share: wall clock on CPU, CUDA events on a GPU, interleaved medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

Timer = Callable[[Callable[[], object]], float]


def cpu_timer(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cuda_timer(flush: torch.Tensor | None = None) -> Timer:
    """Seconds of ``fn()`` on the GPU, synchronized, timed with CUDA events.

    Args:
        flush: a buffer written before each call to evict the previous call's data from L2
            (None: no flush).
    """

    def timer(fn: Callable[[], object]) -> float:
        if flush is not None:
            flush.fill_(1)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    return timer


def interleaved_medians(fns: dict, repeats: int, timer: Timer = cpu_timer) -> dict[str, float]:
    """Median seconds of each callable, all timed in turn within every repeat (shared machine).

    Each callable runs once first as a warm-up.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timer(fn))
    return {name: statistics.median(v) for name, v in times.items()}
