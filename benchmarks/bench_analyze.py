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
"""Peak memory and throughput of `nemo-ais analyze` on a ~1 GB log -> docs/benchmarks.md "analyze".

Generates a NeMo-RL-layout log directory in a temporary directory (one JSON object per
sample, every value a batch of one, the keys of ``grpo_train``'s logging step: long
sequences of float32 log-probs with an FP8-like mismatch), runs ``python -m nemo_ais
analyze`` on it in a fresh subprocess, and reports the wall time, the subprocess's peak
RSS (``ru_maxrss``), the RSS of the same interpreter after only the imports (the baseline),
and positions / valid tokens per second. The generated directory is deleted afterwards.

    python -m benchmarks.bench_analyze                      # ~1 GB: 8 steps x 464 rows x 4096
    python -m benchmarks.bench_analyze --rows 32 --no-record   # a quick smoke run
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
    out = subprocess.run(
        [sys.executable, "-c", probe, *cmd], check=True, capture_output=True, text=True
    )
    wall, rss = out.stdout.split()[-2:]
    return float(wall), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=464, help="Samples per step.")
    parser.add_argument("--length", type=int, default=4096, help="Prompt + response positions.")
    parser.add_argument("--no-record", action="store_true", help="Do not rewrite the docs.")
    parser.add_argument("--note", default="", help="A sentence on the machine's load.")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench_analyze_", dir="/tmp"))
    try:
        log_dir = tmp / "logs"
        log_dir.mkdir()
        t0 = time.perf_counter()
        size, positions, valid = write_logs(log_dir, args.steps, args.rows, args.length)
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
        assert steps_done == args.steps, steps_done
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()[0]
    table = (
        "| log size | steps x rows x positions | wall (s) | CPU (s) | peak RSS (MiB) | "
        "RSS after imports only (MiB) | positions/s | valid tokens/s |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {size / 2**30:.2f} GiB | {args.steps} x {args.rows} x {args.length} | {wall:.1f} | "
        f"{cpu:.1f} | **{rss:.0f}** | {base_rss:.0f} | {positions / wall:,.0f} | "
        f"**{valid / wall:,.0f}** |"
    )
    notes = (
        f"\n\nGenerating the log took {gen_s:.0f} s (not timed above). Positions are the "
        "aligned `[:, 1:]` positions read (prompt and padding included), valid tokens those "
        "with token_loss_mask x sample_loss_mask = 1. The reader streams each file in chunks "
        "of 2^20 positions and keeps at most 128 MiB of aligned chunks per step for the `ais` "
        "pass (the rest is spilled to a temporary directory): the peak RSS depends on the "
        "size of one step file (here 128 MiB of JSON), not on the number of steps. Load "
        f"average (1 min) before / after: {load_before:.1f} / {load_after:.1f}."
        + (f" {args.note}" if args.note else "")
    )
    print(table + notes)
    if not args.no_record:
        record_section(
            "analyze", "Offline analysis (`nemo-ais analyze`) of a ~1 GB log", table + notes
        )


if __name__ == "__main__":
    main()
