# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Each NeMo-RL assert the pre-flight check mirrors, raised by upstream's REAL code first.

Issue 18, item 6: configs that passed ``python -m nemo_ais.preflight`` but stopped NeMo-RL
after Ray started. Each case runs ``launchers/run_grpo_ais.py`` ``main()`` into upstream's
real ``grpo.setup()`` (and, for async GRPO, its real ``async_grpo_train``) with only the
GPU / Ray-actor / download calls stood in (``_ray_boundary``), shows upstream's assert,
then shows the offline check failing the same config with a message naming the fields.
"""

from __future__ import annotations

import inspect
import os

import pytest
from _ray_boundary import ActorBoundary, AtRayBoundary, DriverBoundary, tiny_datasets
from nemo_rl.algorithms import grpo
from nemo_rl_version import NEMO_RL, per_version
from shipped_configs import CONFIG_DIR, launcher

from nemo_ais import preflight

pytestmark = pytest.mark.nemo_rl

run = launcher()
SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
SMOKE_BF16 = CONFIG_DIR / "experiments" / "smoke_bf16.yaml"
ASYNC = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1"]


class PastTheAsserts(Exception):
    """Raised by a spy on the first call ``async_grpo_train`` makes after its asserts."""


@pytest.fixture
def rig(monkeypatch, tmp_path, local_ray):
    """Boundaries installed; ``rig(path, overrides, stop=...)`` runs ``main()``."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("NEMO_AIS_REFIT", "")  # recorded: removed at teardown
    monkeypatch.delenv("NEMO_AIS_REFIT")
    monkeypatch.chdir(tmp_path)  # logger.log_dir / checkpoint_dir are relative

    def main(path, overrides, *, stop: bool, real_async: bool = False):
        ActorBoundary(stop=stop).install(monkeypatch, tmp_path)
        raw = run.load_config_dict(str(path), list(overrides))
        train, val = tiny_datasets(raw)
        driver = DriverBoundary((train, val, {"math": None}, {"math": None}))
        driver.install(monkeypatch)
        if real_async:
            monkeypatch.setattr(grpo, "async_grpo_train", REAL_ASYNC_GRPO_TRAIN)
        run.main(["--config", str(path), *overrides])
        return driver

    return main


REAL_ASYNC_GRPO_TRAIN = grpo.async_grpo_train


def _failures(path, overrides) -> dict[str, str]:
    cfg = preflight.load_config(path, overrides)
    return {r.name: r.detail for r in preflight.check_config(cfg) if r.status == "fail"}


# ------------------------------------------------------ FP8 rollout without any correction


def test_fp8_rollout_without_any_correction_stops_setup_and_fails_offline(rig):
    no_correction = ["~loss_fn.ais"]  # and use_importance_sampling_correction: false
    with pytest.raises(AssertionError, match="Importance sampling must be enabled for vLLM FP8"):
        rig(SMOKE, no_correction, stop=True)
    fp8 = _failures(SMOKE, no_correction)["fp8_rollout"]
    assert "policy.generation.vllm_cfg.precision='fp8' needs an importance-sampling" in fp8
    assert "loss_fn.ais" in fp8 and "loss_fn.use_importance_sampling_correction=true" in fp8


def test_fp8_rollout_with_nemo_rls_own_correction_passes_both(rig):
    nemo_rl_is = ["~loss_fn.ais", "loss_fn.use_importance_sampling_correction=true"]
    with pytest.raises(AtRayBoundary):  # past setup()'s FP8 assert, at the policy workers
        rig(SMOKE, nemo_rl_is, stop=True)
    assert "fp8_rollout" not in _failures(SMOKE, nemo_rl_is)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["~loss_fn.ais"],
        ["loss_fn.ais.mode=none"],
        ["loss_fn.ais.mode=none", "loss_fn.use_importance_sampling_correction=true"],
        ["~loss_fn.ais", "loss_fn.use_importance_sampling_correction=true"],
        ["loss_fn.ais.mode=tis"],
    ],
    ids=["ais", "no-section", "none", "none+nemo-rl-is", "nemo-rl-is", "tis"],
)
def test_the_flag_setup_reads_is_the_launchers_view(overrides):
    """``preflight.setup_sees_importance_sampling`` == what ``nemo_rl_view`` hands setup()."""
    raw = run.load_config_dict(str(SMOKE), overrides)
    view = run.nemo_rl_view(raw, run.validate_ais(raw))
    expected = view["loss_fn"].get("use_importance_sampling_correction", False)
    assert preflight.setup_sees_importance_sampling(raw) is expected


# ----------------------------------------------------------------------------- async GRPO


def test_async_grpo_without_the_async_engine_stops_async_grpo_train_and_fails_offline(rig):
    overrides = [*ASYNC]  # the bf16 arm: no FP8 KV cache (setup's own async assert)
    # main names its other async engines too (Dynamo, Megatron, TRT-LLM)
    message = per_version(
        v0_7_0="Async GRPO requires an async vLLM", main="Async GRPO requires Dynamo, Megatron, or an async vLLM"
    )
    with pytest.raises(AssertionError, match=message):
        rig(SMOKE_BF16, overrides, stop=False, real_async=True)
    failed = _failures(SMOKE_BF16, overrides)["async_grpo"]
    assert "grpo.async_grpo.enabled=true needs policy.generation.vllm_cfg.async_engine=true" in failed


def test_async_grpo_without_importance_sampling_stops_and_fails_offline(rig):
    overrides = [*ASYNC, "policy.generation.vllm_cfg.async_engine=true", "~loss_fn.ais"]
    with pytest.raises(AssertionError, match="Importance sampling correction must be enabled"):
        rig(SMOKE_BF16, overrides, stop=False, real_async=True)
    failed = _failures(SMOKE_BF16, overrides)["async_grpo"]
    assert "needs an importance-sampling correction" in failed
    assert "loss_fn.use_importance_sampling_correction=true" in failed


def test_async_grpo_with_engine_and_correction_passes_both(rig, monkeypatch):
    overrides = [*ASYNC, "policy.generation.vllm_cfg.async_engine=true"]

    def past_the_asserts(*args, **kwargs):
        raise PastTheAsserts

    # the first call after the asserts, in both versions (v0.7.0 and main)
    assert "router_replay_enabled" in inspect.getsource(REAL_ASYNC_GRPO_TRAIN)
    monkeypatch.setattr(grpo, "router_replay_enabled", past_the_asserts)
    with pytest.raises(PastTheAsserts):
        rig(SMOKE_BF16, overrides, stop=False, real_async=True)
    assert "async_grpo" not in _failures(SMOKE_BF16, overrides)


# ------------------------------------------------------ nodes kept from the policy

RM = ["++data.default.env_name=reward_model", "++env.reward_model.resources.gpus_per_node=1"]


def test_a_reward_model_that_leaves_the_policy_no_node_stops_setup_and_fails_offline(rig):
    overrides = [*RM, "cluster.num_nodes=2", "++env.reward_model.resources.num_nodes=2"]
    with pytest.raises(AssertionError, match="policy_nodes must be > 0"):
        rig(SMOKE, overrides, stop=True)
    assert (
        "leaves the policy no GPUs: the reward model (env.reward_model.resources) takes 2 node(s)"
        in (_failures(SMOKE, overrides)["gpu_split"])
    )


def test_the_opd_teacher_nodes_are_upstreams_teacher_configs():
    """``reserved`` counts the nodes of upstream's own teacher configs (aliases sharing a model are one teacher)."""
    from nemo_rl.models.policy.teacher_worker_group import create_teacher_configs_from_opd_config

    opd = {
        "enabled": True,
        "teacher_model_by_agent_name": {"math": "Qwen/Qwen3-32B", "code": "Qwen/Qwen3-32B", "chat": "Qwen/Qwen3-8B"},
        "non_colocated_teachers": {
            "enabled": True,
            "default_teacher_cfg": {"num_nodes": 2},
            "teacher_overrides": {"chat": {"num_nodes": 1}},
        },
    }
    for dedup in (True, False):
        cfg = {"on_policy_distillation": {**opd, "deduplicate_shared_teacher_checkpoints": dedup}}
        teachers = create_teacher_configs_from_opd_config(cfg["on_policy_distillation"])
        assert preflight.layout.reserved(cfg) == (0, 0, sum(t.num_nodes for t in teachers)) == (0, 0, 3 if dedup else 5)
    cfg = {
        "on_policy_distillation": {**opd, "non_colocated_teachers": {**opd["non_colocated_teachers"], "enabled": False}}
    }
    assert preflight.layout.reserved(cfg) == (0, 0, 0)


def test_a_reward_model_in_a_list_of_datasets_is_upstreams_env_name(rig):
    """Main's data splits may be lists of datasets: ``reserved`` reads every ``env_name`` as upstream does."""
    from nemo_rl.data.datasets.utils import extract_necessary_env_names

    data = {"train": [{"env_name": "math"}, {"env_name": "reward_model"}], "validation": None}
    cfg = {"data": data, "env": {"reward_model": {"resources": {"num_nodes": 2, "gpus_per_node": 8}}}}
    if NEMO_RL == "main":  # v0.7.0 reads a dict per split only
        assert "reward_model" in extract_necessary_env_names(data)
    assert preflight.layout.reserved(cfg) == (2, 8, 0)
    assert preflight.layout.reserved({**cfg, "data": {"train": [{"env_name": "math"}]}}) == (0, 0, 0)


@pytest.mark.parametrize(
    "section",
    [
        {"on_policy_distillation": True},
        {
            "on_policy_distillation": {
                "enabled": True,
                "non_colocated_teachers": {"enabled": True},
                "teacher_model_by_agent_name": ["a"],
            }
        },
        {
            "on_policy_distillation": {
                "enabled": True,
                "teacher_model_by_agent_name": {"a": "m"},
                "non_colocated_teachers": {"enabled": True, "default_teacher_cfg": "big"},
            }
        },
        {"data": {"train": {"env_name": ["reward_model"]}}},
    ],
)
def test_a_malformed_reserving_section_is_not_a_crash_of_the_check(section):
    cfg = preflight.load_config(SMOKE)
    cfg.update(section)
    results = preflight.check_config(cfg)  # no AttributeError / TypeError: the schema is upstream's MasterConfig
    assert results and all("could not read the config" not in r.detail for r in results)
