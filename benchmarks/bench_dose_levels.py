# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The pilot of the dose-response study: the uncorrected arm's mismatch per level of the dial.

Usage::

    python -m benchmarks.bench_dose_levels OUT_DIR [--base recorded|default] [--formats fp8 ...]

Runs the study's base config's uncorrected arm (``loss_fn.ais.mode: none``) for a few GRPO steps at
each level k of ``rollout.error_scale`` on a grid, for two rollout settings (FP8 W8A8 + FP8
KV cache, NVFP4 W4A4 + NVFP4 KV cache), and records the measured mismatch only: D
(``ais/severity``), NeMo-RL's ``gen_kl_error`` (``ais/kl_k3``) and
``token_mult_prob_error``, means over steps and seeds. Nothing else of the runs is read
(no accuracy, no reward): the format and the levels of ``--preset dose`` are chosen from
this table alone, before any arm of the study runs (issue 26). ``--base recorded`` (the
default): ``_recorded.yaml``, the 550-step warm start ``--preset dose`` pins, written to the
``dose_levels`` section of ``docs/benchmarks.md``; ``--base default``: default.yaml's plateau
warm start (1000 steps, lr 3e-5), section ``dose_levels_plateau``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks._record import record_section
from nemo_ais.embedded.config import CONFIG_DIR, load_config
from nemo_ais.embedded.experiment import run_experiment

GRID = {
    ("fp8", "fp8"): (1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 64.0),
    ("nvfp4_w4a4", "nvfp4"): (0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
}
STEPS, SEEDS = 3, (0, 1)
BASES = {"recorded": ("_recorded.yaml", "dose_levels"), "default": ("default.yaml", "dose_levels_plateau")}
KEYS = {"D": "ais/severity", "gen_kl k3": "ais/kl_k3", "tmpe": "ais/token_mult_prob_error"}


def pilot_config(out: Path, base: str = "recorded", formats: tuple[str, ...] | None = None) -> dict:
    """The base config with one uncorrected arm per (format, level) and nothing else."""
    raw = load_config(
        CONFIG_DIR / BASES[base][0],
        [
            f"logger.run_dir={out}",
            "logger.name=dose-levels",
            "logger.plots=false",
            "logger.progress_bar=false",
            f"grpo.max_num_steps={STEPS}",
            f"experiment.seeds={list(SEEDS)}",
            "checkpointing.enabled=false",
        ],
    )
    arms = {
        f"{fmt}-k{k:g}-none": {
            "rollout": {"format": fmt, "kv_cache": kv, "error_scale": k},
            "loss_fn": {"ais": {"mode": "none"}},
        }
        for (fmt, kv), levels in GRID.items()
        if formats is None or fmt in formats
        for k in levels
    }
    raw["experiment"]["arms"] = arms
    raw["experiment"]["include"] = list(arms)
    raw["experiment"]["reference_arm"] = next(iter(arms))
    return raw


def mismatch_rows(metrics: Path) -> list[tuple[str, dict[str, float]]]:
    """Per arm: the means of :data:`KEYS` over its train records (nothing else is read)."""
    per_arm: dict[str, dict[str, list[float]]] = {}
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "train":
            continue
        vals = per_arm.setdefault(rec["arm"], {name: [] for name in KEYS})
        for name, key in KEYS.items():
            vals[name].append(float(rec[key]))
    return [(arm, {n: statistics.fmean(v) for n, v in vals.items()}) for arm, vals in per_arm.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="runs", type=Path)
    parser.add_argument("--base", choices=sorted(BASES), default="recorded")
    parser.add_argument("--formats", nargs="+", choices=[f for f, _ in GRID], default=None)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    config = pilot_config(args.out, args.base, tuple(args.formats) if args.formats else None)
    run_dir = run_experiment(config, overwrite=True)
    wall = time.perf_counter() - t0
    rows = mismatch_rows(run_dir / "metrics.jsonl")
    base_file, section = BASES[args.base]
    lines = [
        f"{base_file}'s uncorrected arm, {STEPS} GRPO steps x seeds {list(SEEDS)} per level; "
        f"means over steps and seeds ({wall:.0f} s wall). Only these three columns are read "
        "from the runs.",
        "",
        "| rollout | k | D | gen_kl k3 | token_mult_prob_error |",
        "|---|---|---|---|---|",
    ]
    for arm, m in rows:
        fmt, k, _ = arm.rsplit("-", 2)
        lines.append(f"| {fmt} | {k[1:]} | {m['D']:.4f} | {m['gen_kl k3']:.2e} | {m['tmpe']:.4f} |")
    title = "Dose-response pilot: the uncorrected arm's mismatch per level of the dial"
    if args.base == "default":
        title += ", at the plateau warm start"
    if args.formats:
        title += f" ({', '.join(args.formats)} only)"
    record_section(section, title, "\n".join(lines))


if __name__ == "__main__":
    main()
