# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Peak memory and throughput of `nemo-ais analyze` on ~1 GB logs -> docs/benchmarks.md "analyze".

Generates NeMo-RL-layout log directories in a temporary directory (one JSON object per
sample, every value a batch of one, the keys of ``grpo_train``'s logging step: long
sequences of float32 log-probs with an FP8-like mismatch), runs ``python -m nemo_ais
analyze`` on each in a fresh subprocess, and reports the wall time, the subprocess's peak
RSS (``ru_maxrss``), the RSS of the same interpreter after only the imports (the baseline),
and positions / valid tokens per second. Two cases by default, both ~1 GiB: 8 step files
of ~128 MiB, and ONE step file of ~1 GiB (the per-step memory budget at work). The
generated directories are deleted afterwards.

    python -m benchmarks.bench_analyze                      # both ~1 GiB cases
    python -m benchmarks.bench_analyze --steps 1 --rows 32 --no-record   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._record import record_section

PROMPT = 256


def write_logs(log_dir: Path, steps: int, rows: int, length: int) -> tuple[int, int, int]:
    """Write the logs; return (bytes, aligned positions, valid tokens)."""
    positions = valid = 0
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        lengths = torch.randint(length // 2, length + 1, (rows,), generator=g)
        pos = torch.arange(length)
        token_mask = ((pos >= PROMPT) & (pos < lengths[:, None])).to(torch.int64)
        prev = (-torch.rand(rows, length, generator=g) * 3).float()
        gen = (prev + 0.01 * step * torch.randn(rows, length, generator=g)).float()
        prev, gen = torch.where(pos >= PROMPT, prev, 0.0), torch.where(pos >= PROMPT, gen, 0.0)
        ids = torch.randint(0, 150_000, (rows, length), generator=g)
        adv = torch.randn(rows, generator=g)
        positions += rows * (length - 1)
        valid += int(token_mask[:, 1:].sum())
        with (log_dir / f"train_data_step{step}.jsonl").open("w") as f:
            for i in range(rows):
                sample = {
                    "content": [f"sample {i}"],
                    "rewards": [float(adv[i] > 0)],
                    "input_lengths": [int(lengths[i])],
                    "token_ids": [ids[i].tolist()],
                    "token_loss_mask": [token_mask[i].tolist()],
                    "sample_loss_mask": [1.0],
                    "advantages": [[float(adv[i])] * length],
                    "generation_logprobs": [gen[i].tolist()],
                    "prev_logprobs": [prev[i].tolist()],
                    "idx": i,
                }
                f.write(json.dumps(sample) + "\n")
    size = sum(p.stat().st_size for p in log_dir.iterdir())
    return size, positions, valid


def _child_maxrss_mb(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of ``cmd`` run alone in a fresh child (ru_maxrss is per child)."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "rc = subprocess.run(sys.argv[1:]).returncode; w = time.perf_counter() - t; "
        "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd], check=True, capture_output=True, text=True)
    wall, rss = out.stdout.split()[-2:]
    return float(wall), float(rss)


# (steps, rows per step, positions per row): ~1 GiB each; many step files, then one.
CASES = ((8, 464, 4096), (1, 3712, 4096))


def run_case(steps: int, rows: int, length: int) -> dict[str, float]:
    """Generate one log directory, analyse it in a child; the measurements."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_analyze_", dir="/tmp"))
    try:
        log_dir = tmp / "logs"
        log_dir.mkdir()
        t0 = time.perf_counter()
        size, positions, valid = write_logs(log_dir, steps, rows, length)
        gen_s = time.perf_counter() - t0
        _, base_rss = _child_maxrss_mb(
            [sys.executable, "-c", "import nemo_ais.analyze, nemo_ais.cli, matplotlib.pyplot"]
        )
        cmd = [sys.executable, "-m", "nemo_ais", "analyze", str(log_dir), "--no-progress"]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall, rss = _child_maxrss_mb(cmd)
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        steps_done = len((log_dir / "ais_analysis" / "analysis.jsonl").read_text().splitlines())
        assert steps_done == steps, steps_done
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "size": size,
        "positions": positions,
        "valid": valid,
        "gen_s": gen_s,
        "base_rss": base_rss,
        "wall": wall,
        "cpu": cpu,
        "rss": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="One case: step files.")
    parser.add_argument("--rows", type=int, default=None, help="One case: samples per step.")
    parser.add_argument("--length", type=int, default=4096, help="Prompt + response positions.")
    parser.add_argument("--no-record", action="store_true", help="Do not rewrite the docs.")
    args = parser.parse_args()
    cases = CASES
    if args.steps is not None or args.rows is not None:
        cases = ((args.steps or 1, args.rows or 464, args.length),)
    load_before = os.getloadavg()[0]
    lines = [
        "| log size | steps x rows x positions | wall (s) | CPU (s) | peak RSS (MiB) | "
        "RSS after imports only (MiB) | positions/s | valid tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    gen_s = 0.0
    above = []
    for steps, rows, length in cases:
        r = run_case(steps, rows, length)
        gen_s += r["gen_s"]
        above.append(f"{r['size'] / steps / 2**20:.0f} MiB step files: +{r['rss'] - r['base_rss']:.0f} MiB")
        lines.append(
            f"| {r['size'] / 2**30:.2f} GiB ({r['size'] / steps / 2**20:.0f} MiB per step) | "
            f"{steps} x {rows} x {length} | {r['wall']:.1f} | {r['cpu']:.1f} | "
            f"**{r['rss']:.0f}** | {r['base_rss']:.0f} | {r['positions'] / r['wall']:,.0f} | "
            f"**{r['valid'] / r['wall']:,.0f}** |"
        )
    load_after = os.getloadavg()[0]
    table = "\n".join(lines)
    notes = (
        f"\n\nGenerating the logs took {gen_s:.0f} s (not timed above). Positions are the "
        "aligned `[:, 1:]` positions read (prompt and padding included), valid tokens those "
        "with token_loss_mask x sample_loss_mask = 1. What bounds the memory is the per-step "
        "budget, not the log: the reader streams each file in chunks of 2^20 positions, and "
        "per step at most 128 MiB of aligned chunks (`memory_budget_bytes`) stay in memory "
        "for the `ais` pass; the rest is spilled to a temporary directory and read back. "
        "Peak RSS above the imports: "
        + "; ".join(above)
        + ". That is the 128 MiB budget, the chunk being parsed (Python lists of one JSON "
        "row batch) and, once a step exceeds the budget, the spill's write and read buffers, "
        "plus allocator slack. It does not grow with the number of steps (8 step files of "
        "128 MiB peak lower than one of 1 GiB); the part of a step file beyond the budget "
        "costs a disk round trip instead of memory. Load average (1 min) before / after: "
        f"{load_before:.1f} / {load_after:.1f} on this {os.cpu_count()}-core machine."
    )
    print(table + notes)
    if not args.no_record:
        record_section("analyze", "Offline analysis (`nemo-ais analyze`) of ~1 GB logs", table + notes)


if __name__ == "__main__":
    main()
