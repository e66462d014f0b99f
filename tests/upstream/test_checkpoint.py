# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every full config's ``checkpointing`` section through NeMo-RL's REAL checkpoint save.

``grpo_train`` saves with (``nemo_rl/algorithms/grpo.py``, the ``save_period`` branch)::

    checkpoint_path = checkpointer.init_tmp_checkpoint(step, grpo_save_state, master_config)
    policy.save_checkpoint(weights_path=<path>/policy/weights,
                           optimizer_path=<path>/policy/optimizer if checkpointer.save_optimizer else None,
                           tokenizer_path=<path>/policy/tokenizer,
                           checkpointing_cfg=master_config.checkpointing)

This test makes the same calls on upstream's real ``CheckpointManager`` and
``Policy.save_checkpoint``. The ``Policy`` is built without ``__init__`` (which starts
GPU workers): its ``cfg`` is the config's ``policy`` section and its ``worker_group`` a
recording stand-in of ``RayWorkerGroup`` whose ``run_all_workers_single_data`` returns
real Ray ``ObjectRef``s, so upstream's ``ray.get`` runs unpatched (``local_ray``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nemo_rl.algorithms import grpo
from nemo_rl.models.policy.lm_policy import Policy
from nemo_rl.utils.checkpoint import CheckpointManager
from nemo_rl_version import per_version
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, launcher

from nemo_ais import preflight as cc

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]

run = launcher()


class _RecordingWorkerGroup:
    """Stands in for ``RayWorkerGroup``: records each dispatch, returns real ObjectRefs."""

    def __init__(self, ray) -> None:
        self.ray = ray
        self.calls: list[tuple[str, dict]] = []

    def run_all_workers_single_data(self, method_name, *args, **kwargs):
        assert not args, "Policy dispatches by keyword"
        self.calls.append((method_name, kwargs))
        return [self.ray.put(None)]

    def shutdown(self, cleanup_method=None):
        self.calls.append(("shutdown", {"cleanup_method": cleanup_method}))
        return True


def _master_config(path: Path) -> grpo.MasterConfig:
    raw = run.load_config_dict(str(path), [])
    return grpo.MasterConfig(**run.nemo_rl_view(raw, run.validate_ais(raw)))


def _save_state() -> dict:
    """What grpo_train hands ``init_tmp_checkpoint`` at the first save of a fresh run."""
    return per_version(  # v0.7.0: a dict; main: vars() of its GRPOSaveState dataclass
        v0_7_0=lambda: grpo._default_grpo_save_state(), main=lambda: vars(grpo._initial_grpo_save_state())
    )()


def _save_like_grpo_train(policy: Policy, master_config: grpo.MasterConfig, step: int) -> Path:
    checkpointer = CheckpointManager(master_config.checkpointing)
    checkpoint_path = checkpointer.init_tmp_checkpoint(step, _save_state(), master_config)
    policy.save_checkpoint(
        weights_path=os.path.join(checkpoint_path, "policy", "weights"),
        optimizer_path=os.path.join(checkpoint_path, "policy", "optimizer") if checkpointer.save_optimizer else None,
        tokenizer_path=os.path.join(checkpoint_path, "policy", "tokenizer"),
        checkpointing_cfg=master_config.checkpointing,
    )
    return Path(checkpoint_path)


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_checkpoint_save_is_accepted_by_upstreams_policy(path, local_ray, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # checkpointing.checkpoint_dir is relative
    master_config = _master_config(path)
    policy = Policy.__new__(Policy)  # no __init__: it would start the GPU workers
    policy.cfg = master_config.policy
    policy.worker_group = _RecordingWorkerGroup(local_ray)

    checkpoint_path = _save_like_grpo_train(policy, master_config, step=3)

    assert checkpoint_path == tmp_path / master_config.checkpointing["checkpoint_dir"] / "tmp_step_3"
    assert (checkpoint_path / "training_info.json").is_file()
    assert (checkpoint_path / "config.yaml").is_file()
    policy_dir = checkpoint_path / "policy"
    # The Megatron backend (no dtensor_cfg._v2): upstream forwards no checkpointing_cfg;
    # the Megatron worker writes a Megatron-Core distributed checkpoint.
    assert master_config.policy["megatron_cfg"]["enabled"] is True
    assert master_config.checkpointing["model_save_format"] is None
    assert master_config.checkpointing["save_optimizer"] is True
    assert policy.worker_group.calls == [
        (
            "save_checkpoint",
            {
                "weights_path": str(policy_dir / "weights"),
                "optimizer_path": str(policy_dir / "optimizer"),
                "tokenizer_path": str(policy_dir / "tokenizer"),
            },
        )
    ]
    del policy.worker_group  # Policy.__del__ would shut the stand-in down


def test_a_save_format_without_dtensor_v2_is_what_upstream_rejects(local_ray, tmp_path, monkeypatch):
    # The defect this guards: NeMo-RL raises at the FIRST checkpoint save, hours into a run.
    monkeypatch.chdir(tmp_path)
    master_config = _master_config(CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml")
    master_config.checkpointing["model_save_format"] = "safetensors"
    policy = Policy.__new__(Policy)
    policy.cfg = master_config.policy
    policy.worker_group = _RecordingWorkerGroup(local_ray)
    with pytest.raises(ValueError, match="model_save_format must be None"):
        _save_like_grpo_train(policy, master_config, step=1)
    assert policy.worker_group.calls == []
    del policy.worker_group
    # ... and the offline check names the field first.
    cfg = run.load_config_dict(
        str(CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"), ["checkpointing.model_save_format=safetensors"]
    )
    with pytest.raises(ValueError, match=r"checkpointing\.model_save_format='safetensors'"):
        cc.validate_config(cfg)
