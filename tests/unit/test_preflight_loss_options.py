# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The offline ``loss_fn.ais`` check on NeMo-RL's surrogate options (issue 17, item 6).

With a correction mode, core's loss reads ``loss_fn``'s surrogate knobs: the check
validates them as ``PGLossConfig`` (NeMo-RL's asserts on ``use_cispo`` /
``sequence_level_importance_ratios`` included) and against the mode, as ``AISLossConfig``
does after Ray started; mode ``tbpo`` warns for the token-clip knobs it does not read.
"""

from __future__ import annotations

from shipped_configs import CONFIG_DIR

from nemo_ais import preflight as pf

SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"


def _results(overrides) -> dict[str, list]:
    cfg = pf.load_config(str(SMOKE), list(overrides))
    out: dict[str, list] = {}
    for r in pf.check_config(cfg):
        if r.name == "loss_fn.ais":
            out.setdefault(r.status, []).append(r.detail)
    return out


def test_nemo_rl_options_core_implements_pass_offline():
    options = [
        "loss_fn.use_cispo=true",
        "loss_fn.ratio_clip_c=null",
        "loss_fn.use_on_policy_kl_approximation=true",
        "loss_fn.positive_example_nll_weight=0.1",
    ]
    results = _results(["loss_fn.ais.mode=tis", *options])
    assert "fail" not in results and results["ok"], results


def test_cispo_with_dual_clip_fails_offline_naming_the_field():
    results = _results(["loss_fn.ais.mode=ais", "loss_fn.use_cispo=true", "loss_fn.ratio_clip_c=3.0"])
    (detail,) = results["fail"]
    assert "loss_fn.ratio_clip_c=3.0 is invalid with use_cispo=True: expected null" in detail


def test_gspo_with_token_level_loss_fails_offline():
    results = _results(["loss_fn.ais.mode=ais", "loss_fn.sequence_level_importance_ratios=true"])
    (detail,) = results["fail"]
    assert "loss_fn.sequence_level_importance_ratios=True is invalid with token_level_loss" in (detail)


def test_tbpo_with_cispo_fails_offline():
    results = _results(["loss_fn.ais.mode=tbpo", "loss_fn.use_cispo=true"])
    (detail,) = results["fail"]
    assert "loss_fn.use_cispo=True is invalid with loss_fn.ais.mode='tbpo'" in detail


def test_mode_none_leaves_the_surrogate_to_nemo_rl():
    # mode none runs ClippedPGLossFn unchanged: its own asserts, not ours
    results = _results(["loss_fn.ais.mode=none", "loss_fn.use_cispo=true", "loss_fn.ratio_clip_c=3.0"])
    assert "fail" not in results


def test_tbpo_warns_that_the_token_clip_knobs_are_unused_naming_them():
    results = _results(["loss_fn.ais.mode=tbpo", "loss_fn.token_level_loss=false", "loss_fn.ratio_clip_c=3.0"])
    assert "fail" not in results
    (warning,) = results["warn"]
    for field in ("loss_fn.ratio_clip_min=", "loss_fn.ratio_clip_max=", "loss_fn.ratio_clip_c=3.0"):
        assert field in warning, warning
    assert "not used by loss_fn.ais.mode='tbpo'" in warning
    assert "loss_fn.ais.tbpo.clip_low/clip_high" in warning


def test_tbpo_without_dual_clip_names_only_the_knobs_that_are_set():
    (warning,) = _results(["loss_fn.ais.mode=tbpo", "loss_fn.token_level_loss=false", "loss_fn.ratio_clip_c=null"])[
        "warn"
    ]
    assert "loss_fn.ratio_clip_c" not in warning and "loss_fn.ratio_clip_min=" in warning


def test_other_modes_do_not_warn_about_the_token_clip():
    assert "warn" not in _results(["loss_fn.ais.mode=ais", "loss_fn.ratio_clip_c=3.0"])


def test_vapo_weight_under_grpo_is_warned_as_a_no_op():
    # GRPO's training batch has no `rewards` (v0.7.0 and main): the term is 0 upstream too
    results = _results(["loss_fn.ais.mode=tis", "loss_fn.positive_example_nll_weight=0.1"])
    assert "fail" not in results
    (warning,) = results["warn"]
    assert "loss_fn.positive_example_nll_weight=0.1 has no effect under GRPO" in warning
    assert "warn" not in _results(["loss_fn.ais.mode=tis"])
