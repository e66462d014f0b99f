# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A dict where a config object is expected: a TypeError naming the parameter and the fix.

Every public function or class of the package that takes a config model (grep: parameters
typed ``CorrectionConfig``, ``Fp8SyncConfig``, ``RolloutPrecisionConfig``, ``KVScaleConfig``,
``AlarmConfig``) is called with the section as a plain dict, as it appears in a YAML file.
The error must name ``<function>: <parameter>``, say it got a dict, name the expected class
and how to build it; following that hint must then work. ``AISClippedPGLossFn`` takes a
mapping on purpose (NeMo-RL passes dicts) and is not listed.
"""

import re

import pytest
import torch

from nemo_ais.alarms import AlarmConfig, AlarmMonitor
from nemo_ais.analyze import analyze_run
from nemo_ais.analyze.replay import replay_step
from nemo_ais.config import CorrectionConfig, PGLossConfig, config_type_error, require_config
from nemo_ais.core import (
    clipped_pg_loss,
    compute_diagnostics,
    compute_statistics,
    correction_weights,
    diagnostics_from_stats,
)
from nemo_ais.fp8 import Fp8SyncConfig, KVScaleCalibrator, KVScaleConfig, fp8_weight_stream
from nemo_ais.nemo_rl import refit
from nemo_ais.nemo_rl.seam import global_batch_diagnostics, loss_from_prepared, prepare_global_batches
from nemo_ais.refit.stream import RefitConfig, plan_fp8_sync, plan_tensor
from nemo_ais.rollout.twin import Fp8RolloutConfig, Fp8Twin, RolloutPrecisionConfig

AIS = {"mode": "tis", "weight_cap": 2.0}  # a loss_fn.ais section as YAML gives it
SYNC = {"family": "multiplier"}
ROLLOUT = {"kv_cache_fp8": False}
KV = {"percentile": 99.0}
ALARMS = {"window": 5}

LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]])
ROLLOUT_LOGP = torch.tensor([[-1.5, -2.0, -0.25], [-0.3, -0.9, -4.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
WEIGHT = "model.layers.0.self_attn.q_proj.weight"


def _message(where, cls, module):
    name = cls.__name__
    return (
        rf"^{re.escape(where)}: got dict, expected {re.escape(module)}\.{name}.*; build one "
        rf"with {name}\(\*\*d\) or {name}\.model_validate\(d\)$"
    )


# (call with the dict, where, expected class, its module)
CASES = {
    "compute_statistics": (
        lambda: compute_statistics(LOGP, ROLLOUT_LOGP, MASK, AIS),
        "compute_statistics(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "correction_weights": (
        lambda: correction_weights(LOGP, ROLLOUT_LOGP, MASK, AIS),
        "correction_weights(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "compute_diagnostics": (
        lambda: compute_diagnostics(LOGP, ROLLOUT_LOGP, MASK, AIS),
        "compute_diagnostics(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "diagnostics_from_stats": (
        lambda: diagnostics_from_stats(compute_statistics(LOGP, ROLLOUT_LOGP, MASK, CorrectionConfig()), AIS),
        "diagnostics_from_stats(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "clipped_pg_loss_config": (
        lambda: clipped_pg_loss(LOGP, LOGP, ROLLOUT_LOGP, LOGP, MASK, AIS),
        "clipped_pg_loss(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "clipped_pg_loss_pg": (
        lambda: clipped_pg_loss(LOGP, LOGP, ROLLOUT_LOGP, LOGP, MASK, CorrectionConfig(), pg={}),
        "clipped_pg_loss(pg)",
        PGLossConfig,
        "nemo_ais.config",
    ),
    "loss_from_prepared_config": (  # raised before the prepared diagnostics are looked up
        lambda: loss_from_prepared(LOGP, {}, (), AIS, PGLossConfig(), global_valid_seqs=None, global_valid_toks=None),
        "loss_from_prepared(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "loss_from_prepared_pg": (
        lambda: loss_from_prepared(
            LOGP, {}, (), CorrectionConfig(), {}, global_valid_seqs=None, global_valid_toks=None
        ),
        "loss_from_prepared(pg)",
        PGLossConfig,
        "nemo_ais.config",
    ),
    "global_batch_diagnostics": (  # raised before any batch is read or any collective
        lambda: global_batch_diagnostics([], AIS, group=None),
        "global_batch_diagnostics(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "prepare_global_batches": (
        lambda: prepare_global_batches({}, None, AIS, local_batch_size=1, group=None),
        "prepare_global_batches(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "plan_tensor": (
        lambda: plan_tensor(WEIGHT, (256, 256), torch.bfloat16, SYNC),
        "plan_tensor(config)",
        RefitConfig,
        "nemo_ais.refit.config",
    ),
    "plan_fp8_sync": (
        lambda: plan_fp8_sync([(WEIGHT, torch.empty(256, 256, device="meta"))], SYNC),
        "plan_refit(config)",
        RefitConfig,
        "nemo_ais.refit.config",
    ),
    "fp8_weight_stream": (  # raised at the call, before the first next()
        lambda: fp8_weight_stream([(WEIGHT, torch.ones(128, 128))], SYNC),
        "refit_stream(config)",
        RefitConfig,
        "nemo_ais.refit.config",
    ),
    "Fp8Twin": (  # the earlier name of RolloutTwin; Fp8RolloutConfig subclasses the config
        lambda: Fp8Twin(torch.nn.Linear(2, 2), ROLLOUT),
        "RolloutTwin(config)",
        RolloutPrecisionConfig,
        "nemo_ais.rollout.config",
    ),
    "KVScaleCalibrator": (
        lambda: KVScaleCalibrator(2, KV),
        "KVScaleCalibrator(config)",
        KVScaleConfig,
        "nemo_ais.refit.kv_scales",
    ),
    "AlarmMonitor": (lambda: AlarmMonitor(ALARMS), "AlarmMonitor(config)", AlarmConfig, "nemo_ais.alarms"),
    "AlarmMonitor_empty_dict": (  # {} is falsy: it used to become the defaults silently
        lambda: AlarmMonitor({}),
        "AlarmMonitor(config)",
        AlarmConfig,
        "nemo_ais.alarms",
    ),
    "analyze_run_config": (
        lambda: analyze_run("no_such_dir", config=AIS),
        "analyze_run(config)",
        CorrectionConfig,
        "nemo_ais.config",
    ),
    "analyze_run_alarm_config": (
        lambda: analyze_run("no_such_dir", alarm_config={}),
        "analyze_run(alarm_config)",
        AlarmConfig,
        "nemo_ais.alarms",
    ),
    "replay_step": (lambda: replay_step(None, AIS), "replay_step(config)", CorrectionConfig, "nemo_ais.config"),
    "refit.install": (lambda: refit.install(object(), SYNC), "install(config)", RefitConfig, "nemo_ais.refit.config"),
    "refit.install_on_import": (
        lambda: refit.install_on_import(SYNC, target="nemo_ais_no_such_module"),
        "install_on_import(config)",
        RefitConfig,
        "nemo_ais.refit.config",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dict_config_is_a_type_error_naming_the_parameter(case):
    call, where, cls, module = CASES[case]
    with pytest.raises(TypeError, match=_message(where, cls, module)):
        call()


def test_install_on_import_left_no_hook_behind():
    # the check runs before the import hook is registered
    import sys

    with pytest.raises(TypeError, match=r"install_on_import\(config\)"):
        refit.install_on_import(SYNC, target="nemo_ais_no_such_module")
    assert not any(getattr(f, "target", None) == "nemo_ais_no_such_module" for f in sys.meta_path)


def test_following_the_hint_works_and_gives_the_real_values():
    cfg = CorrectionConfig(**AIS)
    # tis: w = min(exp(logp_old - logp_rollout), C) on valid tokens, 0 elsewhere
    w = correction_weights(LOGP, ROLLOUT_LOGP, MASK, cfg)
    expected = torch.tensor([[min(2.0, float(torch.exp(torch.tensor(0.5)))), 1.0, 0.0], [1.0, 2.0, 1.0]])
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-6)  # exp(0.7) = 2.01 capped at 2
    d = compute_diagnostics(LOGP, ROLLOUT_LOGP, MASK, CorrectionConfig.model_validate(AIS))
    assert (d.n_seq, d.n_tok) == (2.0, 5.0)
    assert plan_tensor(WEIGHT, (256, 256), torch.bfloat16, Fp8SyncConfig(**SYNC)).action == ("quantize")
    assert AlarmMonitor(AlarmConfig(**ALARMS)).config.window == 5
    assert KVScaleCalibrator(2, KVScaleConfig(**KV)).config.percentile == 99.0
    twin = Fp8Twin(_tiny_qwen2(), Fp8RolloutConfig(**ROLLOUT))
    assert not twin.kv_cache_fp8 and len(twin.fp8_module_names) == 7  # q/k/v/o/gate/up/down


def _tiny_qwen2():
    from tiny_models import tiny_lm

    return tiny_lm(vocab_size=32, hidden_size=128, num_hidden_layers=1)


def test_none_stays_the_default_where_it_is_allowed():
    assert AlarmMonitor(None).config == AlarmConfig()
    assert KVScaleCalibrator(1, None).config == KVScaleConfig()


def test_the_wrong_section_and_a_non_mapping_are_named_too():
    with pytest.raises(
        TypeError,
        match=r"^correction_weights\(config\): got PGLossConfig, expected "
        r"nemo_ais\.config\.CorrectionConfig \(PGLossConfig is a different section\)$",
    ):
        correction_weights(LOGP, ROLLOUT_LOGP, MASK, PGLossConfig())
    with pytest.raises(
        TypeError,
        match=r"^RolloutTwin\(config\): got str, expected "
        r"nemo_ais\.rollout\.config\.RolloutPrecisionConfig or None$",
    ):
        Fp8Twin(torch.nn.Linear(2, 2), "fp8")


def test_require_config_accepts_subclasses_and_returns_the_error_for_flagging():
    from nemo_ais.alarms import AISAlarmsConfig

    require_config(AISAlarmsConfig(), AlarmConfig, "f(config)")  # a subclass is an AlarmConfig
    assert config_type_error(CorrectionConfig(), CorrectionConfig, "f(config)") is None
    err = config_type_error(AIS, CorrectionConfig, "f(config)")
    assert isinstance(err, TypeError) and str(err).startswith("f(config): got dict")


def test_stats_object_is_not_a_config():
    # a positional slip: statistics where the config goes
    stats = compute_statistics(LOGP, ROLLOUT_LOGP, MASK, CorrectionConfig())
    with pytest.raises(TypeError, match=r"^correction_weights\(config\): got AISStats, expected"):
        correction_weights(LOGP, ROLLOUT_LOGP, MASK, stats)


def test_loss_from_prepared_refuses_no_pg():
    """``pg`` is required (an AttributeError on ``pg.positive_example_nll_weight`` before)."""
    with pytest.raises(
        TypeError, match=r"^loss_from_prepared\(pg\): got NoneType, expected nemo_ais\.config\.PGLossConfig"
    ):
        loss_from_prepared(LOGP, {}, (), CorrectionConfig(), None, global_valid_seqs=None, global_valid_toks=None)
