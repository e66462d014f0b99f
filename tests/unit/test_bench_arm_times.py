# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``benchmarks/bench_embedded.py --arm-times``: per-arm minutes from a run's metrics.jsonl."""

import json

import pytest

from benchmarks.bench_embedded import arm_minutes, arm_times_md


def _write(run_dir, arms):
    run_dir.mkdir()
    lines = []
    for arm in arms:
        for seed in (0, 1):
            lines.append({"kind": "train", "arm": arm, "seed": seed, "time/step": 30.0})
            lines.append({"kind": "val", "arm": arm, "seed": seed, "time/eval": 6.0})
    lines.append({"kind": "train", "arm": "k1-none", "seed": 0, "time/step": 60.0})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines))


def test_minutes_per_arm_and_the_default_include_of_the_preset(tmp_path):
    from nemo_ais.embedded.config import CONFIG_DIR, load_config

    include = load_config(CONFIG_DIR / "dose.yaml")["experiment"]["include"]
    _write(tmp_path / "dose", include)
    minutes = arm_minutes(tmp_path / "dose")
    assert minutes["bf16"] == pytest.approx(2 * (30 + 6) / 60) and minutes["k1-none"] == 1.0
    md = arm_times_md(tmp_path / "dose", "dose")
    subset = len(include) * 72 / 60
    assert f"All arms: **{subset + 1:.1f} min**" in md
    assert f"the {len(include)} arms `--preset dose` runs by default: **{subset:.1f} min**" in md
    assert "| k1-none | 1.0 | no |" in md and "| k8-qarl | 1.2 | yes |" in md


def test_a_run_without_an_arm_of_the_preset_is_refused(tmp_path):
    _write(tmp_path / "dose", ["bf16"])
    with pytest.raises(SystemExit, match=r"no records of the arms \['k4-none'"):
        arm_times_md(tmp_path / "dose", "dose")
