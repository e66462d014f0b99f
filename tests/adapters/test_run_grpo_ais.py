# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""launchers/run_grpo_ais.py: what can run without GPUs, vLLM or a Ray cluster.

Argument parsing, NeMo-RL's config loader with Hydra overrides, AIS validation before Ray,
the config view handed to ``setup()``, the worker selection / registration, the policy
factory and the loss swap. Needs NeMo-RL importable (marked ``nemo_rl``).
"""

from __future__ import annotations

import os
from pathlib import Path

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl_version import NEMO_RL, per_version
from shipped_configs import launcher

from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.workers import AIS_WORKER_FQNS

pytestmark = pytest.mark.nemo_rl

LAUNCHER = Path(__file__).resolve().parents[2] / "launchers" / "run_grpo_ais.py"
run = launcher()


def test_parse_args_keeps_hydra_overrides():
    args, overrides = run.parse_args(["--config", "x.yaml", "loss_fn.ais.mode=ais", "+loss_fn.ais.weight_cap=3.0"])
    assert args.config == "x.yaml"
    assert overrides == ["loss_fn.ais.mode=ais", "+loss_fn.ais.weight_cap=3.0"]


def test_load_config_dict_inherits_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("loss_fn:\n  ratio_clip_min: 0.2\n  ais:\n    mode: none\npolicy:\n  x: 1\n")
    (tmp_path / "arm.yaml").write_text("defaults: base.yaml\nloss_fn:\n  ais:\n    mode: ais\n")
    cfg = run.load_config_dict(
        str(tmp_path / "arm.yaml"), ["+loss_fn.ais.weight_cap=3.0", "loss_fn.ratio_clip_min=0.1"]
    )
    assert cfg["loss_fn"] == {"ratio_clip_min": 0.1, "ais": {"mode": "ais", "weight_cap": 3.0}}
    assert cfg["policy"] == {"x": 1}
    assert run.validate_ais(cfg).ais.weight_cap == 3.0
    # a key absent from the YAML needs Hydra's "+" (NeMo-RL's rule), with a hint
    with pytest.raises(Exception, match=r"\+loss_fn\.ais\.weight_cap"):
        run.load_config_dict(str(tmp_path / "arm.yaml"), ["loss_fn.ais.weight_cap=3.0"])


def test_validation_fails_before_ray_with_the_field_path():
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.weight_cap=0\.5 is invalid"):
        run.validate_ais({"loss_fn": {"ais": {"mode": "ais", "weight_cap": 0.5}}})
    with pytest.raises(ValueError, match=r"loss_fn\.use_importance_sampling_correction=True"):
        run.validate_ais({"loss_fn": {"use_importance_sampling_correction": True, "ais": {"mode": "ais"}}})


def test_nemo_rl_view_sets_the_is_flag_only_when_ais_owns_the_correction():
    on = {"loss_fn": {"ais": {"mode": "ais"}}}
    view = run.nemo_rl_view(on, run.validate_ais(on))
    assert view["loss_fn"]["use_importance_sampling_correction"] is True
    assert "use_importance_sampling_correction" not in on["loss_fn"]  # user config untouched
    explicit_off = {"loss_fn": {"ais": {"mode": "none"}}}  # the uncorrected FP8 arm
    view = run.nemo_rl_view(explicit_off, run.validate_ais(explicit_off))
    assert view["loss_fn"]["use_importance_sampling_correction"] is True
    plain = {"loss_fn": {"ratio_clip_min": 0.2}}  # no section: NeMo-RL as is
    assert run.nemo_rl_view(plain, run.validate_ais(plain)) is plain
    nemo_tis = {"loss_fn": {"use_importance_sampling_correction": True, "ais": {"mode": "none"}}}
    assert run.nemo_rl_view(nemo_tis, run.validate_ais(nemo_tis)) is nemo_tis


@pytest.mark.parametrize(
    ("policy", "worker"),
    [
        ({"megatron_cfg": {"enabled": True}}, "megatron.AISMegatronPolicyWorker"),
        (  # QARL: NeMo-RL's ModelOpt QAT worker, as upstream's resolve_policy_worker_cls
            {"megatron_cfg": {"enabled": True}, "quant_cfg": "nvfp4_a16_mlp_only.yaml"},
            "megatron_quant.AISMegatronQuantPolicyWorker",
        ),
        ({"dtensor_cfg": {"enabled": True}}, "dtensor.AISDTensorPolicyWorker"),
        ({"dtensor_cfg": {"enabled": True, "_v2": True}}, "dtensor_v2.AISDTensorPolicyWorkerV2"),
    ],
)
def test_ais_worker_follows_the_backend(policy, worker):
    assert run.ais_worker_fqn(policy) == "nemo_ais.nemo_rl.workers." + worker


def test_ais_worker_errors():
    with pytest.raises(ValueError, match=r"policy\.quant_cfg='q\.yaml' is invalid with policy\.dtensor"):
        run.ais_worker_fqn({"quant_cfg": "q.yaml", "dtensor_cfg": {"enabled": True, "_v2": True}})
    with pytest.raises(ValueError, match=r"megatron_cfg\.enabled or policy\.dtensor_cfg\.enabled"):
        run.ais_worker_fqn({})


def test_register_ais_workers_uses_the_prebuilt_base_venvs(tmp_path, monkeypatch):
    # upstream's worker-group resolution of these entries: tests/upstream/test_worker_venv.py
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    monkeypatch.setattr(registry, "ACTOR_ENVIRONMENT_REGISTRY", dict(registry.ACTOR_ENVIRONMENT_REGISTRY))
    monkeypatch.setenv("NEMO_RL_VENV_DIR", str(tmp_path))
    monkeypatch.delenv("NRL_FORCE_REBUILD_VENVS", raising=False)
    for base in AIS_WORKER_FQNS:
        (tmp_path / base / "bin").mkdir(parents=True)
        (tmp_path / base / "bin" / "python").touch()
    run.register_ais_workers()
    for base, ours in AIS_WORKER_FQNS.items():
        entry = registry.ACTOR_ENVIRONMENT_REGISTRY[ours]
        base_entry = registry.ACTOR_ENVIRONMENT_REGISTRY[base]
        expected = str(tmp_path / base / "bin" / "python")
        assert entry == (expected if base_entry.startswith("uv") else base_entry)


def test_policy_factory_for_every_mode_and_data_plane_error():
    # upstream's real Policy built through the factory, per arm: tests/upstream/test_arms.py
    for mode in ("none", "tis", "ais"):
        cfg = {"loss_fn": {"ais": {"mode": mode}}, "policy": {"megatron_cfg": {"enabled": True}}}
        run.validate_ais(cfg)  # every mode validates ...
        assert callable(run.make_policy_factory(cfg))  # ... and gets the same factory
    off = {"loss_fn": {}, "policy": {"megatron_cfg": {"enabled": True}}}  # no section: none
    assert callable(run.make_policy_factory(off))
    with pytest.raises(ValueError, match="data_plane"):
        run.make_policy_factory({**off, "data_plane": {"enabled": True}})


def test_swap_loss_replaces_clipped_pg_loss_only():
    cfg = {"loss_fn": {"ais": {"mode": "ais", "weight_cap": 3.0}}}
    ais_cfg = run.validate_ais(cfg)
    swapped = run.swap_loss(ClippedPGLossFn(ClippedPGLossConfig()), ais_cfg)
    assert isinstance(swapped, AISClippedPGLossFn) and swapped.ais.weight_cap == 3.0
    with pytest.raises(TypeError, match="expected ClippedPGLossFn"):
        run.swap_loss(swapped, ais_cfg)


def test_swap_loss_keeps_the_flags_setup_gave_upstreams_loss():
    # main's setup() builds ClippedPGLossFn(cfg, use_fused_linear_logprobs=<Megatron flag>);
    # the loss that trains must read logprobs the same way (nemo_rl/algorithms/loss/utils.py)
    ais_cfg = run.validate_ais({"loss_fn": {"ais": {"mode": "ais"}}})
    flags = per_version(v0_7_0={}, main={"use_fused_linear_logprobs": True})
    swapped = run.swap_loss(ClippedPGLossFn(ClippedPGLossConfig(), **flags), ais_cfg)
    assert {k: getattr(swapped, k) for k in flags} == flags
    assert hasattr(swapped, "use_fused_linear_logprobs") == (NEMO_RL == "main")


@pytest.mark.parametrize(
    ("transport", "precision", "kv", "refused"),
    [
        (None, "fp8", "fp8", False),  # the default transport: CUDA IPC / NCCL
        ("nccl_reshard", "fp8", "auto", True),
        ("nixl", "bfloat16", "fp8", True),
        ("nixl", "bfloat16", "auto", False),  # BF16 rollout: nothing of ours on the path
    ],
)
def test_refit_transports_that_bypass_the_fp8_refit_are_refused(transport, precision, kv, refused):
    cfg = {
        "policy": {
            "generation": {"refit_transport": transport, "vllm_cfg": {"precision": precision, "kv_cache_dtype": kv}}
        }
    }
    problems = run.refit_transport_problems(cfg)
    assert bool(problems) == refused
    if refused:
        assert f"policy.generation.refit_transport={transport!r}" in problems[0]


def test_worker_pythonpath_is_prepended_once():
    env = {"PYTHONPATH": os.pathsep.join(["/a", "/b"])}
    first = run.ensure_worker_pythonpath(env)
    assert first.split(os.pathsep) == [str(run.REPO_ROOT), "/a", "/b"]
    assert run.ensure_worker_pythonpath(env) == first


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (None, "percentile_of_amax"),  # absent: NeMo-RL's rule
        ({}, "percentile_of_amax"),
        ({"reduction": "element_percentile"}, "element_percentile"),
        ({"reduction": "percentile_of_amax"}, "percentile_of_amax"),
    ],
)
def test_kv_calibration_rule_reaches_the_workers_environment(section, expected):
    from nemo_ais.megatron.kv_calibration import kv_reduction_from_env

    config = {} if section is None else {"ais_kv_calibration": section}
    env = {"NEMO_AIS_KV_REDUCTION": "stale"}  # the config wins over the caller's shell
    assert run.configure_kv_calibration(config, env) == expected
    assert env == {"NEMO_AIS_KV_REDUCTION": expected}
    assert kv_reduction_from_env(env) == expected  # what the Megatron worker reads


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"reduction": "p99"}, r"ais_kv_calibration\.reduction='p99' is invalid"),
        ({"percentile": 99.0}, r"ais_kv_calibration=.*expected a mapping with the one key"),
        ("max", r"ais_kv_calibration='max' is invalid"),
    ],
)
def test_kv_calibration_rule_errors_name_the_field(section, match):
    env: dict[str, str] = {}
    with pytest.raises(ValueError, match=match):
        run.configure_kv_calibration({"ais_kv_calibration": section}, env)
    assert env == {}
