# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Forward + backward time of ``clipped_pg_loss`` per correction mode (CPU, fp32).

Modes are timed side by side in one process, interleaved within each repeat, median after
warm-up:

* ``none``  -- uncorrected clipped surrogate (the baseline);
* ``tis``   -- truncated IS weights;
* ``ais``   -- AIS weights with the global batch's diagnostics precomputed (what every
  micro-batch pays in the NeMo-RL adapter and the embedded recipe);
* ``ais+diag`` -- AIS computing its diagnostics inside the call (statistics, the single
  all-reduce -- here group=None -- and the one host sync): paid once per global batch.

Also reports the bytes moved by the statistics all-reduce.

Usage: ``python -m benchmarks.bench_loss [--repeats 9] [--threads 2 [1 ...]] [--no-record]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks._record import record_section
from nemo_ais.config import CorrectionConfig
from nemo_ais.core import NUM_SLOTS, STATS_BYTES, clipped_pg_loss, compute_diagnostics

SHAPES = [(8, 1024), (64, 1024), (64, 4096)]
MODES = ["none", "tis", "ais", "ais+diag"]


def make_batch(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, length, generator=g) * 3
    return dict(
        logp_old=logp_old,
        logp_rollout=logp_old + 0.02 * torch.randn(batch, length, generator=g),
        logp_theta=logp_old + 0.05 * torch.randn(batch, length, generator=g),
        adv=torch.randn(batch, generator=g),
        mask=(torch.rand(batch, length, generator=g) > 0.1).float(),
    )


def step(b: dict[str, torch.Tensor], mode: str, diag) -> None:
    cfg = CorrectionConfig(mode="ais" if mode.startswith("ais") else mode)
    theta = b["logp_theta"].clone().requires_grad_()
    out = clipped_pg_loss(
        theta,
        b["logp_old"],
        b["logp_rollout"],
        b["adv"],
        b["mask"],
        cfg,
        diagnostics=diag if mode == "ais" else None,
    )
    out.loss.backward()


def time_shape(batch: int, length: int, repeats: int, warmup: int):
    """Median wall-clock and process-CPU seconds per mode (modes interleaved per repeat)."""
    b = make_batch(batch, length)
    diag = compute_diagnostics(b["logp_old"], b["logp_rollout"], b["mask"], CorrectionConfig())
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(warmup + repeats):
        for mode in MODES:
            start, start_cpu = time.perf_counter(), time.process_time()
            step(b, mode, diag)
            if i >= warmup:
                wall[mode].append(time.perf_counter() - start)
                cpu[mode].append(time.process_time() - start_cpu)
    return (
        {m: statistics.median(v) for m, v in wall.items()},
        {m: statistics.median(v) for m, v in cpu.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    lines = [
        "| threads | B x T | none (ms) | tis (ms) | ais (ms) | ais+diag (ms) | ais / none | "
        "ais / none (CPU time) | ais+diag / none |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for threads, (batch, length) in [(n, shape) for n in args.threads for shape in SHAPES]:
        torch.set_num_threads(threads)
        wall, cpu = time_shape(batch, length, args.repeats, args.warmup)
        ms = {m: v * 1e3 for m, v in wall.items()}
        lines.append(
            f"| {threads} | {batch} x {length} | {ms['none']:.2f} | {ms['tis']:.2f} | {ms['ais']:.2f} | "
            f"{ms['ais+diag']:.2f} | {wall['ais'] / wall['none']:.3f} | "
            f"{cpu['ais'] / cpu['none']:.3f} | {wall['ais+diag'] / wall['none']:.3f} |"
        )
        print(lines[-1], flush=True)
    body = "\n".join(
        [
            "Forward + backward of `clipped_pg_loss` (fp32, CPU), median of "
            f"{args.repeats} interleaved repeats after {args.warmup} warm-up rounds (wall clock; "
            "the CPU-time column uses `time.process_time`, less sensitive to other load on a "
            "shared machine). `ais` has the global batch's diagnostics precomputed (the "
            "per-micro-batch cost); `ais+diag` computes them in the call (once per global "
            "batch: float64 statistics + one host sync).",
            "",
            *lines,
            "",
            f"Load average during the run: {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at "
            f"end, on {os.cpu_count()} cores. On a shared machine the multi-thread rows are "
            "dominated by intra-op threads waiting for a core; the 1-thread rows and the "
            "CPU-time column are then the meaningful comparison.",
            "",
            f"Statistics all-reduce: ONE `all_reduce(SUM)` of {STATS_BYTES} bytes "
            f"({NUM_SLOTS} float64 values) per global batch, independent of B x T.",
        ]
    )
    print()
    print(body)
    if not args.no_record:
        record_section("loss", "Loss: clipped_pg_loss forward + backward per mode", body)


if __name__ == "__main__":
    main()
