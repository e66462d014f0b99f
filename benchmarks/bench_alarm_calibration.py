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
"""Refit-guard calibration: false positives on healthy logs, detection of planted bugs.

Usage::

    python -m benchmarks.bench_alarm_calibration RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is a ``nemo-ais run`` output; every ``logs/<arm>_seed<s>/`` holding
``train_data_step*.jsonl`` is analysed as is (healthy: the simulated refit is exact) and
with one planted bug at a middle step, written into a copy of that step's
``generation_logprobs`` (l = prev - gen at valid positions):

* ``broad x25``: every token's l times 25 (mis-scaled weights, a wrong scale layout);
* ``subset x25``: l times 25 in one sequence of every 8 (one wrong layer or expert);
* ``position x(1 + 8 t/T)``: l grows with the position t in the response (a stale KV scale).

A healthy step with an alarm is a false positive; a planted step with an alarm is a
detection. The default :class:`~nemo_ais.alarms.AlarmConfig` is used. The table is written
to the ``alarm_calibration`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks._record import record_section
from nemo_ais.alarms import AlarmConfig
from nemo_ais.analyze import analyze_run

PLANTS = {
    "broad x25": lambda i, t, n, span: 25.0,
    "subset x25": lambda i, t, n, span: 25.0 if i % 8 == 0 else 1.0,
    "position x(1 + 8 t/T)": lambda i, t, n, span: 1.0 + 8.0 * t / max(span - 1, 1),
}


def _plant(path: Path, factor) -> None:
    """Scale l = prev - gen at the valid positions of every row of one step's file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        prev, gen = row["prev_logprobs"][0], row["generation_logprobs"][0]
        mask = row["token_loss_mask"][0]
        valid = [t for t, m in enumerate(mask) if m]
        for k, t in enumerate(valid):
            gen[t] = prev[t] - factor(i, k, len(rows), len(valid)) * (prev[t] - gen[t])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _steps(log_dir: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("train_data_step")) for p in log_dir.glob("*.jsonl"))


def _alarmed_steps(log_dir: Path, out: Path) -> set[int]:
    result = analyze_run(log_dir, out, alarm_config=AlarmConfig(), plots=False)
    return {row["step"] for row in result.rows if row["alarms"]}


def main(run_dirs: list[str]) -> str:
    config = AlarmConfig()
    healthy_steps = healthy_alarms = 0
    detected = {name: [0, 0] for name in PLANTS}
    logs = [d for r in run_dirs for d in sorted(Path(r, "logs").iterdir()) if d.is_dir()]
    with tempfile.TemporaryDirectory() as tmp:
        for log_dir in logs:
            steps = _steps(log_dir)
            eligible = [s for s in steps if s > steps[0] + config.min_history - 1]
            fired = _alarmed_steps(log_dir, Path(tmp, "out"))
            healthy_steps += len(eligible)
            healthy_alarms += len(fired & set(eligible))
            planted_step = eligible[len(eligible) // 2]
            for name, factor in PLANTS.items():
                copy = Path(tmp, "planted")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(log_dir, copy)
                _plant(copy / f"train_data_step{planted_step}.jsonl", factor)
                detected[name][1] += 1
                detected[name][0] += planted_step in _alarmed_steps(copy, Path(tmp, "out"))
    lines = [
        f"Logs: {', '.join(f'`{d.parent.parent.name}/{d.name}`' for d in logs)}; default "
        f"`AlarmConfig` (jump_factor {config.jump_factor}, tail_jump_factor "
        f"{config.tail_jump_factor}, min_history {config.min_history}).",
        "",
        "| case | steps | steps with an alarm | rate |",
        "|---|---|---|---|",
        f"| healthy (false positives) | {healthy_steps} | {healthy_alarms} | "
        f"{healthy_alarms / max(healthy_steps, 1):.3f} |",
    ]
    for name, (hit, n) in detected.items():
        lines.append(f"| planted: {name} (detection) | {n} | {hit} | {hit / max(n, 1):.3f} |")
    table = "\n".join(lines)
    record_section("alarm_calibration", "Refit-guard calibration (nemo-ais analyze)", table)
    return table


if __name__ == "__main__":
    print(main(sys.argv[1:]))
