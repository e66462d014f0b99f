# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Wall time of the warm start a first `nemo-ais run` trains -> docs/benchmarks.md "warm_start".

The default preset's warm start (1000 SFT steps, batch 128, ``policy.warm_start.num_threads``
torch threads), trained alone, as ``nemo-ais run`` trains it before any GRPO step when its
cache file is missing, into an empty temporary cache directory: wall time, CPU time
(user + sys of this process), and the machine's 1-minute load average before and after
(the machine may be shared: CPU time / threads is the uncontended lower bound).

    python -m benchmarks.bench_warm_start                  # the default preset
    python -m benchmarks.bench_warm_start --preset fp4     # another preset's warm start
    python -m benchmarks.bench_warm_start --curve 50 --steps 1500 --section warm_start_curve
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m benchmarks.bench_warm_start \
        --curve 50 --steps 1500 --section warm_start_curve_avx2

``--curve N`` trains the preset's warm start (``--steps`` overrides its step count) with the
held-out greedy accuracy every N steps, not cached: the SFT transition curve on this CPU
(issue 26, item 6: where the default's warm start lands, and how far another instruction
set, emulated by the two variables, moves it).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import torch

from benchmarks._record import record_section


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(preset: str) -> dict:
    """Train ``preset``'s warm start into an empty cache; wall, CPU, load, the result."""
    from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
    from nemo_ais.embedded.warmstart import build_task, warm_start

    with tempfile.TemporaryDirectory() as cache:
        raw = load_config(CONFIG_DIR / f"{preset}.yaml", [f"policy.warm_start.cache_dir={cache}"])
        cfg = resolve_arm(raw, None)
        torch.set_num_threads(cfg.policy.warm_start.num_threads)  # as nemo-ais run does
        task = build_task(cfg)
        load0, cpu0, t0 = os.getloadavg()[0], _cpu_self(), time.perf_counter()
        path = warm_start(cfg, task, progress=True)  # tqdm on stderr: steps done, s/step
        wall, cpu = time.perf_counter() - t0, _cpu_self() - cpu0
        blob = torch.load(path, weights_only=True)
    ws = cfg.policy.warm_start
    return {
        "preset": preset,
        "steps": ws.steps,
        "batch": ws.batch_size,
        "threads": ws.num_threads,
        "wall": wall,
        "cpu": cpu,
        "load": (load0, os.getloadavg()[0]),
        "accuracy": blob["greedy_accuracy"],
    }


def curve(preset: str, every: int, steps: int | None) -> str:
    """The SFT transition curve of ``preset``'s warm start on this CPU, as markdown."""
    from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
    from nemo_ais.embedded.warmstart import build_task, train_sft

    overrides = [f"policy.warm_start.steps={steps}"] if steps else []
    cfg = resolve_arm(load_config(CONFIG_DIR / f"{preset}.yaml", overrides), None)
    torch.set_num_threads(cfg.policy.warm_start.num_threads)  # as nemo-ais run does
    task = build_task(cfg)
    t0 = time.perf_counter()
    _, loss, points = train_sft(cfg, task, progress=True, curve_every=every)
    wall = time.perf_counter() - t0
    env = {k: os.environ.get(k, "unset") for k in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    rows = "\n".join(f"| {step} | {acc:.3f} | {chains:.3f} |" for step, acc, chains in points)
    stage = cfg.policy.warm_start.curriculum
    first = (
        ""
        if stage is None
        else f" after its curriculum's first stage ({stage.steps} SFT steps on chains of "
        f"{stage.chain_length} values, cached; the steps below count from there)"
    )
    return (
        f"`{preset}` preset's warm start{first}, {cfg.policy.warm_start.steps} SFT steps (batch "
        f"{cfg.policy.warm_start.batch_size}, {cfg.policy.warm_start.num_threads} torch threads), "
        f"held-out greedy exact match and chains right in either notation (the stray `=` "
        f"of the demonstrations allowed) on the {len(task.eval_problems)} held-out "
        f"problems every {every} steps; ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}, "
        f"MKL_ENABLE_INSTRUCTIONS={env['MKL_ENABLE_INSTRUCTIONS']} (torch's CPU capability: "
        f"{torch.backends.cpu.get_cpu_capability()}). Final loss {loss:.4f}; {wall:.0f} s "
        f"wall time with the evaluations.\n\n| SFT step | held-out exact match | "
        "held-out chains right |\n|---|---|---|\n" + rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--curve", type=int, default=0, help="Evaluate every N steps.")
    parser.add_argument("--steps", type=int, default=None, help="With --curve: SFT steps.")
    parser.add_argument("--section", default="warm_start_curve", help="With --curve.")
    args = parser.parse_args()
    if args.curve:
        body = curve(args.preset, args.curve, args.steps)
        print(body)
        if not args.no_record:
            record_section(args.section, "Warm-start SFT transition curve on this CPU", body)
        return
    r = measure(args.preset)
    body = (
        "| preset | SFT steps x batch | torch threads | wall time (s) | CPU time (s) "
        "| CPU / threads (s) | load avg 1 min before / after |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| `{r['preset']}` | {r['steps']} x {r['batch']} | {r['threads']} | "
        f"**{r['wall']:.1f}** | {r['cpu']:.1f} | {r['cpu'] / r['threads']:.1f} | "
        f"{r['load'][0]:.1f} / {r['load'][1]:.1f} |\n\n"
        f"Held-out greedy exact match of the warm-started policy: {r['accuracy']:.3f}. "
        f"The machine has {os.cpu_count()} cores. The warm start runs alone, before the "
        "trainer processes start; a first `nemo-ais run` (no cache file in "
        "`policy.warm_start.cache_dir`) spends this time once, then the GRPO run (section "
        "`run`). CPU / threads is the uncontended lower bound of the wall time; a load "
        "average above the core count means other processes competed for the cores."
    )
    print(body)
    if not args.no_record:
        record_section("warm_start", "Warm start of a first `nemo-ais run` (trained once, cached)", body)


if __name__ == "__main__":
    main()
