# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Refit-guard calibration: false positives on healthy runs, detection of planted refit bugs.

Usage (from the directory whose ``runs/.cache`` holds the warm starts)::

    python -m benchmarks.bench_alarm_calibration --run-plants PLANTED_DIR
    python -m benchmarks.bench_alarm_calibration HEALTHY_RUN_DIR [...] --planted PLANTED_DIR

``--run-plants`` runs :data:`PLANTS`: short ``nemo-ais run`` s whose rollout engine (the
twin) goes wrong at refit ``from_refit`` (:mod:`nemo_ais.rollout.faults`, enabled by
``NEMO_AIS_PLANT_REFIT_FAULT=1`` for these subprocesses only), each into
``PLANTED_DIR/<plant>``. The second form analyses every ``logs/<arm>_seed<s>/`` of the
healthy runs (``nemo-ais run --preset ...`` outputs: exact simulated refit, no bug) and of
the planted runs with ``nemo-ais analyze``'s per-step diagnostics, then replays the refit
guard (:class:`~nemo_ais.alarms.AlarmMonitor`) over them for each point of
:data:`GRID`. A healthy step with an alarm (after ``min_history`` steps) is a false
positive; a planted run is caught if an alarm fires at or after its first bad refit (the
delay is the first such step minus ``from_refit``). The table goes to the
``alarm_calibration`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._record import record_section
from nemo_ais.alarms import AlarmConfig, AlarmMonitor
from nemo_ais.analyze import analyze_run
from nemo_ais.rollout.faults import FAULT_ENV

FROM_REFIT = 14  # the first bad refit: 13 healthy steps of history before it
PLANT_STEPS = 22  # GRPO steps of a planted run
PLANT_SEEDS = (0, 1)
GATE_UP = r"mlp\.(gate|up)_proj"  # veRL #7519: 'mlp.gate' also matched gate_up_proj
# alarms without a jump threshold to replay: taken as analyze logged them (refit_readback:
# exact, threshold 0; the KV position check; non-finite log-probs)
OFFLINE_KINDS = ("kv_scale_position", "nonfinite", "refit_readback")


@dataclass(frozen=True)
class Plant:
    """One planted refit bug: the preset and arms it runs in, and the twin's fault."""

    name: str
    preset: str
    arms: tuple[str, ...]
    kind: str
    modules: str = "."
    expected_visible: bool = True  # False: the bug lowers or keeps the mismatch (see note)
    extra: tuple[str, ...] = ()  # further overrides of the run

    @property
    def slug(self) -> str:
        """The run's directory name: preset and plant."""
        return _slug(f"{self.preset} {self.name}")


PLANTS = (
    Plant("scale_layout (all linears)", "default", ("fp8-none",), "scale_layout"),
    Plant("scale_layout (layer 1 down_proj)", "default", ("fp8-none",), "scale_layout", r"layers\.1\.mlp\.down_proj"),
    Plant("bf16_layer gate/up (QaRL, FP8)", "evidence", ("fp8-qarl",), "bf16_layer", GATE_UP),
    Plant("bf16_layer gate/up (QaRL, NVFP4 W4A4)", "fp4", ("nvfp4_w4a4-qarl",), "bf16_layer", GATE_UP),
    Plant("bf16_layer gate/up (BF16 trainer)", "default", ("fp8-none",), "bf16_layer", GATE_UP, expected_visible=False),
    Plant("stale_kv_scale (FP8 KV)", "default", ("fp8-none",), "stale_kv_scale"),
    Plant("stale_kv_scale (NVFP4 KV)", "fp4", ("nvfp4_w4a4-none",), "stale_kv_scale"),
)

# The same bugs on fp4-long (99-token chain responses, 16 per step; its 100-step warm start
# is 5x cheaper than default's 550): quick's FP8 arm, and QaRL's trainer on it by override.
ALIGNED = ("policy.rollout_aligned_quantization=true",)
PLANTS_LONG = (
    Plant("scale_layout (all linears)", "fp4-long", ("fp8-none",), "scale_layout"),
    Plant("scale_layout (layer 1 down_proj)", "fp4-long", ("fp8-none",), "scale_layout", r"layers\.1\.mlp\.down_proj"),
    Plant("bf16_layer gate/up (QaRL, FP8)", "fp4-long", ("fp8-none",), "bf16_layer", GATE_UP, extra=ALIGNED),
    Plant("bf16_layer gate/up (QaRL, NVFP4 W4A4)", "fp4-long", ("nvfp4_w4a4-qarl",), "bf16_layer", GATE_UP),
    Plant(
        "bf16_layer gate/up (BF16 trainer)", "fp4-long", ("fp8-none",), "bf16_layer", GATE_UP, expected_visible=False
    ),
    Plant("stale_kv_scale (FP8 KV)", "fp4-long", ("fp8-none",), "stale_kv_scale"),
    Plant("stale_kv_scale (NVFP4 KV)", "fp4-long", ("nvfp4_w4a4-none",), "stale_kv_scale"),
)

# (jump_factor, min_jump, min_history) replayed over every log
GRID = tuple(
    itertools.product(
        (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0), (0.001, 0.003, 0.01, 0.02, 0.03), (3, 5, 8)
    )
)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_plants(out_root: Path, plants: tuple[Plant, ...] = PLANTS) -> dict[str, float]:
    """Run ``plants`` (``nemo-ais run`` subprocesses); wall seconds per plant."""
    env = {**os.environ, FAULT_ENV: "1"}
    walls = {}
    for plant in plants:
        fault = f"{{kind: {plant.kind}, from_refit: {FROM_REFIT}, modules: '{plant.modules}'}}"
        cmd = [
            sys.executable,
            "-m",
            "nemo_ais",
            "run",
            *(["--preset", plant.preset] if plant.preset != "default" else []),
            "--overwrite",
            f"logger.run_dir={out_root}",
            f"logger.name={plant.slug}",
            "logger.progress_bar=false",
            "logger.plots=false",
            f"grpo.max_num_steps={PLANT_STEPS}",
            "grpo.val_period=0",  # evaluation at the start and the end only
            "checkpointing.enabled=false",
            f"experiment.include=[{','.join(plant.arms)}]",
            f"experiment.seeds=[{','.join(map(str, PLANT_SEEDS))}]",
            f"rollout.quantizer.refit_fault={fault}",
            *plant.extra,
        ]
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        walls[plant.name] = time.perf_counter() - start
        print(f"{plant.name}: {walls[plant.name]:.0f} s", flush=True)
    return walls


def _log_dirs(run_dir: Path) -> list[Path]:
    return sorted(d for d in Path(run_dir, "logs").iterdir() if any(d.glob("*.jsonl")))


def _diagnostics(log_dir: Path, tmp: Path) -> list[tuple[int, dict, bool, bool]]:
    """Per step: (step, the ``ais/*`` diagnostics, whether the offline-only alarms fired,
    whether ``refit_readback`` did)."""
    result = analyze_run(log_dir, tmp / "out", plots=False)
    out = []
    for row in result.rows:
        diag = {k.removeprefix("ais/"): v for k, v in row.items() if k.startswith("ais/")}
        offline = any(row[f"ais_alarm/{kind}"] for kind in OFFLINE_KINDS)
        out.append((row["step"], diag, offline, bool(row["ais_alarm/refit_readback"])))
    return out


def _alarmed(steps: list[tuple], config: AlarmConfig, offline: bool = True) -> list[tuple[int, bool]]:
    """(step, any alarm) with ``config``'s jump thresholds (:data:`OFFLINE_KINDS` as logged,
    or left out with ``offline=False``: what the mismatch alarms alone see)."""
    monitor = AlarmMonitor(config)
    return [(step, bool(monitor.observe(step, diag)) or (offline and off)) for step, diag, off, _ in steps]


def calibrate(healthy_dirs: list[Path], planted_dir: Path | None) -> str:
    """Analyse the logs, replay :data:`GRID`, record and return the markdown."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        healthy = {d: _diagnostics(d, Path(tmp)) for r in healthy_dirs for d in _log_dirs(r)}
        planted = {}
        for plant in (*PLANTS, *PLANTS_LONG) if planted_dir is not None else ():
            run = Path(planted_dir, plant.slug)
            if run.is_dir():
                planted[plant] = {d: _diagnostics(d, Path(tmp)) for d in _log_dirs(run)}
    analyse_s = time.perf_counter() - t0
    # the planted runs' steps before their bad refit are healthy too (one copy per arm x seed)
    prefixes = {}
    for plant, logs in planted.items():
        for d, steps in logs.items():
            key = (plant.preset, plant.arms, plant.extra, d.name)
            prefixes.setdefault(key, [s for s in steps if s[0] < FROM_REFIT])
    healthy_logs = [*healthy.values(), *prefixes.values()]
    default = AlarmConfig()
    rows = []
    for jump, floor, history in GRID:
        config = AlarmConfig(jump_factor=jump, min_jump=floor, min_history=history)
        fp = n = 0
        for steps in healthy_logs:
            for i, (_, fired) in enumerate(_alarmed(steps, config)):
                if i >= history:
                    n, fp = n + 1, fp + fired
        by_jump = {}  # the readback catches every plant at every grid point (first table)
        for plant, logs in planted.items():
            delays = []
            for steps in logs.values():
                fired = _alarmed(steps, config, offline=False)
                late = [s for s, hit in fired if hit and s >= FROM_REFIT]
                delays.append(late[0] - FROM_REFIT if late else None)
            by_jump[plant] = delays
        rows.append((jump, floor, history, fp, n, by_jump))
    visible = [p for p in planted if p.expected_visible]

    def score(row):  # zero false positives, most visible plants caught by the mismatch
        fp, by_jump = row[3], row[5]  # alarms (the readback's catches do not depend on
        hits = sum(d is not None for p in visible for d in by_jump[p])  # the grid), then
        # the highest thresholds
        return (fp, -hits, -row[0], -row[1], row[2])

    best = min(rows, key=score)
    body = _table(healthy, prefixes, planted, rows, best, default, analyse_s)
    record_section("alarm_calibration", "Refit-guard calibration (nemo-ais analyze)", body)
    return body


def _jumps(steps: list[tuple]) -> tuple[float, float]:
    """Severity D over the median of the 10 steps before: at FROM_REFIT, and the largest after."""
    ratios = {}
    for i, (step, diag, *_) in enumerate(steps):
        if step >= FROM_REFIT and i >= 1:
            median = statistics.median(d["severity"] for _, d, *_ in steps[max(0, i - 10) : i])
            ratios[step] = diag["severity"] / median if median > 0 else math.inf
    return ratios.get(FROM_REFIT, math.nan), max(ratios.values(), default=math.nan)


def _readback_cell(logs: dict[Path, list[tuple]]) -> str:
    at = sum(any(s == FROM_REFIT and rb for s, *_, rb in steps) for steps in logs.values())
    early = sum(rb for steps in logs.values() for s, *_, rb in steps if s < FROM_REFIT)
    return f"{at}/{len(logs)}; {early}"


def _caught(delays: list[int | None]) -> str:
    hit = [d for d in delays if d is not None]
    lag = f"; delay {', '.join(map(str, hit))}" if hit else ""
    return f"{len(hit)}/{len(delays)}{lag}"


def _table(healthy, prefixes, planted, rows, best, default, analyse_s) -> str:
    runs: dict[str, list[int]] = {}
    for d, steps in healthy.items():
        runs.setdefault(d.parent.parent.name, []).append(len(steps))
    arms = sorted({f"`{p}` {' '.join((*a, *e))}" for p, a, e, _ in prefixes})
    lines = [
        "Healthy runs (exact simulated refit, no bug; every arm x seed log of each): "
        + "; ".join(f"`{r}` {len(v)} logs, {sum(v)} steps" for r, v in sorted(runs.items()))
        + f"; and the steps 1-{FROM_REFIT - 1} of the planted runs ({len(prefixes)} arm x "
        f"seed logs, {sum(map(len, prefixes.values()))} steps: {', '.join(arms)}). A healthy "
        "step counts once it has `min_history` steps before it.",
        "",
        f"Planted runs: {len(PLANT_SEEDS)} seeds x {PLANT_STEPS} steps each, the twin's refit "
        f"wrong from refit (= step) {FROM_REFIT} on (`nemo_ais.rollout.faults`); a run is "
        f"caught when an alarm fires at a step >= {FROM_REFIT}; delay = that step - "
        f"{FROM_REFIT}. Analysis of all logs: {analyse_s:.0f} s.",
        "",
        "| plant | preset | arm | fault | D at the bad refit / median D of the 10 steps "
        "before (per seed) | largest such ratio from the bad refit on | `refit_readback` "
        "(runs caught at their bad refit; steps before it with one) |",
        "|---|---|---|---|---|---|---|",
    ]
    for plant, logs in planted.items():
        first, later = zip(*(_jumps(steps) for steps in logs.values()), strict=True)
        lines.append(
            f"| {plant.name} | `{plant.preset}` | {', '.join((*plant.arms, *plant.extra))} | "
            f"`{plant.kind}` on `{plant.modules}` | {', '.join(f'{r:.2f}' for r in first)} | "
            f"{', '.join(f'{r:.2f}' for r in later)} | {_readback_cell(logs)} |"
        )
    head = "| jump_factor | min_jump | min_history | healthy steps with an alarm |"
    lines += [
        "",
        "Per grid point: healthy steps with any alarm (the readback's included: it fires on "
        "none), and each plant's runs caught by the mismatch alarms alone (the readback "
        "catches every run at its bad refit at every grid point: table above).",
        "",
        head + "".join(f" {p.name} |" for p in planted),
    ]
    lines.append("|---" * (4 + len(planted)) + "|")
    current = (default.jump_factor, default.min_jump, default.min_history)
    for jump, floor, history, fp, n, by_jump in rows:
        note = " (default)" if (jump, floor, history) == current else ""
        note += " (best)" if (jump, floor, history) == best[:3] else ""
        cells = [f"{jump:g}{note}", f"{floor:g}", f"{history}", f"{fp}/{n} ({fp / max(n, 1):.4f})"]
        cells += [_caught(by_jump[p]) for p in planted]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Best (fewest false positives, then the most runs of the visible plants caught by the "
        f"mismatch alarms, then "
        f"the highest thresholds: the most margin): jump_factor {best[0]:g}, min_jump "
        f"{best[1]:g}, min_history {best[2]}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("healthy", nargs="*", type=Path)
    parser.add_argument("--planted", type=Path, default=None)
    parser.add_argument("--run-plants", type=Path, default=None)
    parser.add_argument("--family", choices=("default", "fp4-long"), default="default")
    args = parser.parse_args(argv)
    if args.run_plants is not None:
        walls = run_plants(args.run_plants, PLANTS if args.family == "default" else PLANTS_LONG)
        return json.dumps(walls)
    return calibrate(args.healthy, args.planted)


if __name__ == "__main__":
    print(main())
