# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What ``loss_fn.ais.bypass`` saves in the embedded recipe: s/step with and without.

With bypass the recipe skips the trainer's pi_old forward over the rollout batch (pi_old :=
the rollout's log-probs, :mod:`nemo_ais.embedded.recipe`). This runs the default preset's
``fp8-ais`` arm (one seed, ``--steps`` GRPO steps, no evaluation in between, no
checkpoints) with ``loss_fn.ais.bypass`` false and true, alternating, ``--repeats`` times,
each run a fresh ``nemo-ais run`` subprocess with the warm start cached, and reports the
median over every step of every run of ``time/step`` and of its ``time/logprobs`` phase
(the pi_old forward) from ``metrics.jsonl``. Records section ``bypass_embedded``; the
cluster path's measurement is section ``prev_logprobs`` (``bench_prev_logprobs.py``).

    python -m benchmarks.bench_bypass [--steps 20] [--repeats 3] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

from benchmarks._record import record_section
from benchmarks.bench_embedded import run_command


def run_once(bypass: bool, steps: int, root: Path, tag: str) -> list[dict]:
    """One ``nemo-ais run`` of the fp8-ais arm; its train records."""
    name = f"bypass-{'on' if bypass else 'off'}-{tag}"
    overrides = [
        "logger.plots=false",
        "checkpointing.enabled=false",
        "experiment.include=[fp8-ais]",
        "experiment.seeds=[0]",
        f"grpo.max_num_steps={steps}",
        f"grpo.val_period={steps}",
        f"loss_fn.ais.bypass={str(bypass).lower()}",
    ]
    cmd = run_command([], root, name, Path("runs/.cache"), overrides)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    lines = (root / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-root", default="runs/bench")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    root = Path(args.run_root)
    recs: dict[bool, list[dict]] = {False: [], True: []}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        for bypass in (False, True):  # alternating: both see the same machine load
            recs[bypass] += run_once(bypass, args.steps, root, str(r))
            load.append(os.getloadavg()[0])
    med = {
        b: {k: statistics.median(x.get(f"time/{k}", 0.0) for x in v) for k in ("step", "logprobs")}
        for b, v in recs.items()
    }
    rows = [
        "| loss_fn.ais.bypass | steps timed | s/step (median) | pi_old forward s/step (median) |",
        "|---|---:|---:|---:|",
    ]
    for b in (False, True):
        rows.append(f"| {str(b).lower()} | {len(recs[b])} | {med[b]['step']:.3f} | {med[b]['logprobs']:.3f} |")
    saved = 1.0 - med[True]["step"] / med[False]["step"]
    body = "\n".join(rows) + (
        f"\n\nSaved: **{saved:.1%}** of the step time (s/step with bypass / without = "
        f"{med[True]['step'] / med[False]['step']:.2f}). The default preset's `fp8-ais` arm "
        f"(2 gloo trainer processes, FP8 twin rollouts), seed 0, {args.steps} GRPO steps per "
        f"run, {args.repeats} runs of each setting alternating, warm start cached; medians "
        "over every step of every run of `time/step` and `time/logprobs` (metrics.jsonl, "
        f"rank 0). Load average (1 min): {min(load):.1f} to {max(load):.1f} on "
        f"{os.cpu_count()} cores. The step time falls by "
        f"{med[False]['step'] - med[True]['step']:.3f} s against "
        f"{med[False]['logprobs'] - med[True]['logprobs']:.3f} s of the skipped phase "
        "(`time/logprobs`: the pi_old forward and the entropy computed from it); the rest is "
        "not attributed (the other phases' medians on a shared machine). On the cluster path "
        "the trainer-side saving is section `prev_logprobs`."
    )
    print(body)
    if not args.no_record:
        record_section("bypass_embedded", "Bypass in the embedded recipe: s/step with and without", body)


if __name__ == "__main__":
    main()
