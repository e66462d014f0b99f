# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Wall time of `nemo-ais run` (default, --quick, --preset evidence) -> docs/benchmarks.md "run".

Runs the CLI in a subprocess and reports its wall time, the CPU time of it and all its
trainer processes (user + sys), the machine's load average before and after (the CI machine
may be shared: CPU time / cores is the uncontended lower bound of the wall time), and the
per-phase split from metrics.jsonl.

    python -m benchmarks.bench_embedded                         # --quick, then the default run
    python -m benchmarks.bench_embedded --presets default       # only the default run
    python -m benchmarks.bench_embedded --presets quick default evidence --keep-cache
    python -m benchmarks.bench_embedded --presets dose --keep-cache --section run_dose
    python -m benchmarks.bench_embedded --arm-times runs/dose --preset-include dose

``--arm-times RUN_DIR`` times nothing: it tabulates the per-arm wall time of a finished run
(``time/step`` + ``time/eval`` of rank 0 from its metrics.jsonl, summed over seeds) and the
sum over the arms a preset includes by default (``--preset-include``): what a run of that
subset would spend in its GRPO steps, as measured in the same run (arms are independent runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks._record import record_section
from nemo_ais.cli import PRESETS


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _phase_table(run_dir: Path) -> str:
    sums: dict[str, float] = defaultdict(float)
    n_steps = 0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for k, v in rec.items():
            if k.startswith("time/"):
                sums[k[5:]] += v
        n_steps += rec["kind"] == "train"
    rows = [f"| {k} | {v:.1f} |" for k, v in sorted(sums.items())]
    return (
        f"Per-phase wall time on rank 0, summed over {n_steps} GRPO steps (all arms x seeds):\n\n"
        "| phase | seconds |\n|---|---|\n" + "\n".join(rows)
    )


def _warm_start_file(preset: str, cache: Path, overrides: list[str]) -> Path:
    """The warm-start cache file the run of ``preset`` will use."""
    from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
    from nemo_ais.embedded.warmstart import warm_start_path

    raw = load_config(CONFIG_DIR / f"{preset}.yaml", [f"policy.warm_start.cache_dir={cache}", *overrides])
    return warm_start_path(resolve_arm(raw, None))


def arm_minutes(run_dir: Path) -> dict[str, float]:
    """Minutes of ``time/step`` + ``time/eval`` (rank 0) per arm of a finished run, all seeds."""
    minutes: dict[str, float] = defaultdict(float)
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        minutes[rec["arm"]] += (rec.get("time/step", 0.0) + rec.get("time/eval", 0.0)) / 60
    return dict(minutes)


def arm_times_md(run_dir: Path, preset: str) -> str:
    """Per-arm minutes of ``run_dir`` and their sum over ``preset``'s default ``include``."""
    from nemo_ais.embedded.config import CONFIG_DIR, load_config

    minutes = arm_minutes(run_dir)
    include = load_config(CONFIG_DIR / f"{preset}.yaml")["experiment"]["include"]
    missing = [a for a in include if a not in minutes]
    if missing:
        raise SystemExit(f"{run_dir}: no records of the arms {missing} of --preset {preset}")
    rows = [f"| {a} | {m:.1f} | {'yes' if a in include else 'no'} |" for a, m in minutes.items()]
    total, subset = sum(minutes.values()), sum(minutes[a] for a in include)
    return (
        f"Per-arm wall time of `{run_dir}` (rank 0, `time/step` + `time/eval` summed over its "
        "seeds; process start-up and warm-start loading not included):\n\n"
        f"| arm | minutes | in `--preset {preset}`'s default include |\n|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\nAll arms: **{total:.1f} min**; the {len(include)} arms `--preset {preset}` "
        f"runs by default: **{subset:.1f} min** ({subset / total:.2f} of the run)."
    )


def preset_flags(preset: str) -> list[str]:
    """The ``nemo-ais run`` flags that select ``preset`` (none for the default)."""
    return [] if preset == "default" else ["--quick"] if preset == "quick" else ["--preset", preset]


def run_command(flags: list[str], root: Path, name: str, cache: Path, overrides: list[str]) -> list[str]:
    """``python -m nemo_ais run FLAGS --overwrite`` into ``root/name``, no progress bar."""
    return [
        sys.executable,
        "-m",
        "nemo_ais",
        "run",
        *flags,
        "--overwrite",
        f"logger.run_dir={root}",
        f"logger.name={name}",
        f"policy.warm_start.cache_dir={cache}",
        "logger.progress_bar=false",
        *overrides,
    ]


def measure(preset: str, root: Path, keep_cache: bool, overrides: list[str]) -> dict:
    """Run the CLI once; wall time, CPU time of it and its trainer processes, load."""
    cache = root / ".cache"
    if not keep_cache:
        shutil.rmtree(cache, ignore_errors=True)
    flag = preset_flags(preset)
    cmd = run_command(flag, root, preset, cache, overrides)
    warm = "reused" if _warm_start_file(preset, cache, overrides).is_file() else "trained"
    load0 = os.getloadavg()[0]
    cpu0 = _cpu_children()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    wall = time.perf_counter() - t0
    cpu = _cpu_children() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return {
        "preset": " ".join(["nemo-ais run", *flag, *overrides]),
        "warm": warm,
        "wall": wall,
        "cpu": cpu,
        "load": (load0, os.getloadavg()[0]),
        "run_dir": root / preset,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["quick", "default"],
        choices=["default", *PRESETS],
        help="Presets to time, in order (default: quick default).",
    )
    parser.add_argument("--keep-cache", action="store_true", help="Reuse a cached warm start (first run too).")
    parser.add_argument("--run-root", default="runs/bench")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--section", default="run", help="docs/benchmarks.md section to record (default run).")
    parser.add_argument("--overrides", nargs="*", default=[], help="key=value for every run.")
    parser.add_argument("--arm-times", type=Path, default=None, help="Tabulate a finished run's per-arm times.")
    parser.add_argument("--preset-include", default="dose", help="With --arm-times.")
    args = parser.parse_args()
    if args.arm_times is not None:
        body = arm_times_md(args.arm_times, args.preset_include)
        print(body)
        if not args.no_record:
            record_section(args.section, f"Per-arm time of a finished run: --preset {args.preset_include}", body)
        return

    root = Path(args.run_root)
    rows = []
    for i, preset in enumerate(args.presets):
        # the cache is emptied before the first run unless --keep-cache
        rows.append(measure(preset, root, args.keep_cache or i > 0, args.overrides))
    cores = os.cpu_count() or 1
    table = [
        "| command | warm start | wall time (s) | CPU time, all processes (s) "
        "| CPU / cores (s) | load avg 1 min before / after |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| `{r['preset']}` | {r['warm']} | **{r['wall']:.1f}** | {r['cpu']:.1f} | "
            f"{r['cpu'] / cores:.1f} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
        )
    body = (
        "\n".join(table)
        + "\n\n"
        + "\n\n".join(f"`{r['preset']}`: " + _phase_table(r["run_dir"]) for r in rows)
        + f"\n\nThe machine has {cores} cores. CPU / cores is the uncontended lower bound of "
        f"the wall time; a load average above {cores} means other processes competed for the "
        "cores during the measurement (the wall time is then an upper bound for an idle "
        "machine)."
    )
    print(body)
    if not args.no_record:
        title = "Embedded experiment wall time (`nemo-ais run`)"
        if args.section != "run":
            title += f": {', '.join(args.presets)}"
        record_section(args.section, title, body)


if __name__ == "__main__":
    main()
