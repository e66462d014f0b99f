# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``benchmarks/bench_dose_levels.py``: the pilot runs on the base config of the study it serves."""

from benchmarks.bench_dose_levels import GRID, pilot_config
from nemo_ais.embedded.config import CONFIG_DIR, load_config


def test_the_recorded_base_is_the_one_the_dose_preset_pins(tmp_path):
    dose = load_config(CONFIG_DIR / "dose.yaml", [])
    pilot = pilot_config(tmp_path)
    for key in ("warm_start", "optimizer"):
        assert pilot["policy"][key] == dose["policy"][key]  # 550 steps, lr 1e-4
    assert pilot["policy"]["warm_start"]["steps"] == 550
    assert len(pilot["experiment"]["include"]) == sum(len(v) for v in GRID.values())
    every = {arm["loss_fn"]["ais"]["mode"] for arm in pilot["experiment"]["arms"].values()}
    assert every == {"none"}  # the uncorrected arm only: nothing else is read


def test_the_default_base_is_the_plateau_warm_start_and_formats_filter(tmp_path):
    default = load_config(CONFIG_DIR / "default.yaml", [])
    pilot = pilot_config(tmp_path, "default", ("fp8",))
    assert pilot["policy"]["warm_start"] == default["policy"]["warm_start"]
    assert pilot["policy"]["warm_start"]["steps"] == 1000
    assert pilot["policy"]["optimizer"]["lr"] == default["policy"]["optimizer"]["lr"]
    arms = pilot["experiment"]["arms"]
    assert list(arms) == [f"fp8-k{k:g}-none" for k in GRID[("fp8", "fp8")]]
    assert {a["rollout"]["kv_cache"] for a in arms.values()} == {"fp8"}
