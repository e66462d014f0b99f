# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The shipped presets: every arm validates, and the FP4 experiment is what its header says.

``fp4`` / ``fp4-evidence`` (issue 17): default.yaml's hyperparameters unchanged (chosen on
the bf16 arm alone), so only ``experiment``, ``logger``, the run length and the warm start's length may differ; the arm matrix is
{none, tis, seq_mis, m2po, ais, const, qarl} x {W4A4 + NVFP4 KV, W4A16 + FP8 KV} plus bf16, and
the evidence preset is the same experiment over 8 seeds.
"""

from __future__ import annotations

import pytest

from nemo_ais.cli import PRESETS
from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm

SETTINGS = {"nvfp4_w4a4": "nvfp4", "nvfp4_w4a16": "fp8"}  # format -> KV cache
CORRECTIONS = {"none": "none", "tis": "tis", "seq_mis": "seq_mis", "m2po": "m2po",
               "ais": "ais", "const": "ais", "qarl": "tbpo"}  # fmt: skip


@pytest.mark.parametrize("preset", ["default", *PRESETS])
def test_every_included_arm_of_every_preset_validates(preset):
    raw = load_config(CONFIG_DIR / f"{preset}.yaml")
    include = raw["experiment"]["include"] or list(raw["experiment"]["arms"])
    for arm in include:
        resolve_arm(raw, arm)  # raises, naming the field, on a bad arm


@pytest.mark.parametrize("preset", ["fp4", "fp4-evidence"])
def test_fp4_presets_keep_default_hyperparameters(preset):
    raw, default = (load_config(CONFIG_DIR / f"{preset}.yaml"), load_config(CONFIG_DIR / "default.yaml"))
    for section in set(raw) | set(default):
        if section not in ("experiment", "logger", "grpo", "policy"):
            assert raw[section] == default[section], section
    # recorded with default.yaml as it was then (fp4.yaml says why): 550 steps, lr 1e-4
    warm = {**default["policy"]["warm_start"], "steps": 550}
    optimizer = {**default["policy"]["optimizer"], "lr": 1e-4}
    assert raw["policy"] == {**default["policy"], "warm_start": warm, "optimizer": optimizer}
    shorter = {"max_num_steps": 20, "val_period": 5}  # the run length, from bf16's curve
    assert raw["grpo"] == {**default["grpo"], **shorter}
    assert {k: v for k, v in raw["logger"].items() if k != "name"} == {
        k: v for k, v in default["logger"].items() if k != "name"
    }
    assert raw["logger"]["name"] == preset


def test_fp4_arm_matrix_and_evidence_seeds():
    raw = load_config(CONFIG_DIR / "fp4.yaml")
    expected = ["bf16"] + [f"{fmt}-{c}" for fmt in SETTINGS for c in CORRECTIONS]
    assert raw["experiment"]["include"] == expected
    for fmt, kv in SETTINGS.items():
        for name, mode in CORRECTIONS.items():
            cfg = resolve_arm(raw, f"{fmt}-{name}")
            assert (cfg.precision.format, cfg.precision.kv_cache) == (fmt, kv)
            assert cfg.correction.mode == mode
            assert cfg.policy.rollout_aligned_quantization is (name == "qarl")
            if name == "const":
                assert (cfg.correction.mixer, cfg.correction.constant_alpha) == ("constant", 0.5)
    bf16 = resolve_arm(raw, "bf16")
    assert bf16.precision.enabled is False and bf16.correction.mode == "none"
    evidence = load_config(CONFIG_DIR / "fp4-evidence.yaml")
    assert evidence["experiment"]["seeds"] == list(range(8)) and raw["experiment"]["seeds"] == [0, 1]
    assert {k: v for k, v in evidence["experiment"].items() if k != "seeds"} == {
        k: v for k, v in raw["experiment"].items() if k != "seeds"
    }


DOSE_CORRECTIONS = {"none": "none", "tis": "tis", "ais": "ais", "const": "ais", "qarl": "tbpo"}


@pytest.mark.parametrize(("preset", "base"), [("dose", "default"), ("dose-quick", "quick")])
def test_dose_presets_are_levels_times_corrections(preset, base):
    """Issue 26: the dial's levels x {none, tis, ais, const, qarl} + bf16 on the base preset.

    Only ``experiment`` and ``logger`` differ from the base (every hyperparameter chosen on
    the bf16 arm alone); every arm's ``rollout.error_scale`` is the level its name says.
    """
    raw, ref = load_config(CONFIG_DIR / f"{preset}.yaml"), load_config(CONFIG_DIR / f"{base}.yaml")
    if preset == "dose":  # recorded with default.yaml as it was then (dose.yaml says why)
        ref["policy"]["warm_start"]["steps"] = 550
        ref["policy"]["optimizer"]["lr"] = 1e-4
    for section in set(raw) | set(ref):
        if section not in ("experiment", "logger", "grpo"):
            assert raw[section] == ref[section], section
    include = raw["experiment"]["include"]
    assert include[0] == "bf16"
    levels = sorted({float(a.split("-")[0][1:]) for a in include[1:]})
    corrections = DOSE_CORRECTIONS if preset == "dose" else {"none": "none", "ais": "ais"}
    assert include[1:] == [f"k{k:g}-{c}" for k in levels for c in corrections]
    for k in levels:
        for name, mode in corrections.items():
            cfg = resolve_arm(raw, f"k{k:g}-{name}")
            assert (cfg.precision.format, cfg.precision.kv_cache) == ("fp8", "fp8")
            assert cfg.precision.error_scale == k and cfg.correction.mode == mode
            assert cfg.policy.rollout_aligned_quantization is (name == "qarl")
            if name == "const":
                assert (cfg.correction.mixer, cfg.correction.constant_alpha) == ("constant", 0.5)
    assert resolve_arm(raw, "bf16").precision.enabled is False
    if preset == "dose":
        # >= 60 GRPO steps, >= 6 paired seeds (issue 26); the run length is default.yaml's
        assert raw["grpo"] == ref["grpo"] and raw["grpo"]["max_num_steps"] >= 60
        # two levels run by default (trimmed to fit 60 minutes); the third stays defined
        assert raw["experiment"]["seeds"] == list(range(6)) and len(levels) == 2
        defined = {a.split("-")[0] for a in raw["experiment"]["arms"]}
        assert {"k1", "k4", "k8"} <= defined
        header = (CONFIG_DIR / "dose.yaml").read_text()
        assert all(f"k = {k:g}:" in header for k in levels)  # the choice, written down
    else:
        study = load_config(CONFIG_DIR / "dose.yaml")["experiment"]["arms"]
        assert set(include) <= set(study)  # the smoke form runs arms of the study itself


def test_dose_long_is_the_two_highest_levels_for_200_steps():
    """Issue 26 item 5: the two highest levels of dose.yaml, every arm, >= 200 steps, 2 seeds."""
    raw, dose = load_config(CONFIG_DIR / "dose-long.yaml"), load_config(CONFIG_DIR / "dose.yaml")
    for section in set(raw) | set(dose):
        if section not in ("experiment", "logger", "grpo", "checkpointing"):
            assert raw[section] == dose[section], section
    assert {k: v for k, v in raw["grpo"].items() if k not in ("max_num_steps", "val_period")} == {
        k: v for k, v in dose["grpo"].items() if k not in ("max_num_steps", "val_period")
    }
    assert raw["grpo"]["max_num_steps"] >= 200 and raw["experiment"]["seeds"] == [0, 1]
    levels = sorted({a.split("-")[0] for a in dose["experiment"]["include"][1:]}, key=lambda a: float(a[1:]))
    top = levels[-2:]
    # none, tis, ais (const and qarl left out on timing, defined in dose.yaml)
    want = ["bf16"] + [f"{k}-{c}" for k in top for c in ("none", "tis", "ais")]
    assert raw["experiment"]["include"] == want
    for arm in want:  # the same arm definitions as the 60-step study
        a, b = resolve_arm(raw, arm), resolve_arm(dose, arm)
        assert (a.precision, a.correction, a.policy) == (b.precision, b.correction, b.policy)


def test_dose_99_is_dose_long_on_99_token_responses():
    """Issue 26 item 5: dose-long's arms at 60 steps on 33-value chains (99 response tokens),
    from a curriculum warm start whose first stage is default.yaml's own warm start."""
    from nemo_ais.embedded.warmstart import first_stage, warm_start_path

    raw, long_ = (load_config(CONFIG_DIR / "dose-99.yaml"), load_config(CONFIG_DIR / "dose-long.yaml"))
    dose = load_config(CONFIG_DIR / "dose.yaml")
    assert raw["experiment"]["include"] == long_["experiment"]["include"]
    assert raw["experiment"]["seeds"] == [0, 1] and raw["grpo"] == dose["grpo"]
    default = resolve_arm(load_config(CONFIG_DIR / "default.yaml"), None)
    for arm in raw["experiment"]["include"]:
        a, b = resolve_arm(raw, arm), resolve_arm(dose, arm)
        assert a.data.chain_length == 33 and a.data.num_digits == 2  # 99 tokens + <eos>
        assert a.data.model_copy(update={"chain_length": 11}) == b.data
        assert (a.precision, a.correction) == (b.precision, b.correction)
        assert a.policy.optimizer.lr == default.policy.optimizer.lr  # chosen on bf16: 3e-5
        assert a.policy.model == b.policy.model
        assert warm_start_path(first_stage(a)) == warm_start_path(default)


def test_dose_plateau_is_dose_at_the_default_runs_warm_start_and_lr():
    """Issue 26 item 6: dose.yaml's study (arms, levels, seeds, steps, statistics) at
    default.yaml's plateau warm start and GRPO lr, both chosen on the bf16 arm alone."""
    from nemo_ais.embedded.warmstart import warm_start_path

    raw, dose = load_config(CONFIG_DIR / "dose-plateau.yaml"), load_config(CONFIG_DIR / "dose.yaml")
    default = load_config(CONFIG_DIR / "default.yaml")
    for section in set(raw) | set(dose):
        if section not in ("policy", "logger"):
            assert raw[section] == dose[section], section
    assert raw["policy"] == default["policy"]  # 1000 SFT steps, lr 3e-5
    assert dose["policy"]["warm_start"]["steps"] == 550  # what dose.yaml was recorded at
    assert raw["logger"]["name"] == "dose-plateau"
    plateau, recorded = resolve_arm(raw, None), resolve_arm(default, None)
    assert warm_start_path(plateau) == warm_start_path(recorded)  # the default run's cache
