# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``grpo.setup(policy_factory=...)``: NeMo-RL's ``Policy`` with the AIS worker (lazy imports)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nemo_ais.nemo_rl.workers import AIS_WORKER_FQNS
from nemo_ais.rules.config_keys import get

_MEGATRON = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
_DTENSOR = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker"
_DTENSOR_V2 = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
_MEGATRON_QUANT = "nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker.MegatronQuantPolicyWorker"


def ais_worker_fqn(policy_cfg: dict[str, Any]) -> str:
    """The AIS worker extending the worker ``Policy`` would pick (``quant_cfg``: Megatron QAT only).

    Raises:
        ValueError: ``policy.quant_cfg`` with DTensor, or no training backend enabled.
    """
    quantized = policy_cfg.get("quant_cfg") is not None
    if get(policy_cfg, "megatron_cfg.enabled", False):
        return AIS_WORKER_FQNS[_MEGATRON_QUANT if quantized else _MEGATRON]
    dtensor = policy_cfg.get("dtensor_cfg") or {}
    if dtensor.get("enabled", False) and quantized:
        raise ValueError(
            f"policy.quant_cfg={policy_cfg['quant_cfg']!r} is invalid with policy.dtensor_cfg.enabled=true: expected "
            "policy.megatron_cfg.enabled=true (NeMo-RL's DTensor ModelOpt workers raise NotImplementedError; nemo_ais "
            "wraps the Megatron one) or policy.quant_cfg=null"
        )
    if dtensor.get("enabled", False):
        return AIS_WORKER_FQNS[_DTENSOR_V2 if dtensor.get("_v2", False) else _DTENSOR]
    raise ValueError(
        "policy.megatron_cfg.enabled or policy.dtensor_cfg.enabled must be true (NeMo-RL needs a training backend)"
    )


def ais_worker_python(base_fqn: str) -> str:
    """The Python executable of the NeMo-RL worker ``base_fqn``, for the AIS worker on top.

    The container prebuilds venvs only under upstream's fqns, so the AIS worker runs in its base worker's venv: a
    non-``uv`` registry entry as is, else the prebuilt ``<venv dir>/<base_fqn>/bin/python`` (unless
    ``NRL_FORCE_REBUILD_VENVS=true``), else ``create_local_venv_on_each_node`` under ``base_fqn`` (needs Ray).
    """
    from nemo_rl.distributed.ray_actor_environment_registry import get_actor_python_env
    from nemo_rl.utils import venvs

    entry = get_actor_python_env(base_fqn)
    if not entry.startswith("uv"):
        return entry
    venv_dir = os.path.normpath(os.environ.get("NEMO_RL_VENV_DIR", venvs.DEFAULT_VENV_DIR))
    prebuilt = os.path.join(venv_dir, base_fqn, "bin", "python")
    force = os.environ.get("NRL_FORCE_REBUILD_VENVS", "false").lower() == "true"
    if os.path.exists(prebuilt) and not force:
        return prebuilt
    return venvs.create_local_venv_on_each_node(py_executable=entry, venv_name=base_fqn)


def register_ais_workers(worker_fqn: str | None = None) -> None:
    """Register AIS worker ``worker_fqn`` (None: all) with the Python of the worker it extends."""
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    for base, ours in AIS_WORKER_FQNS.items():
        if worker_fqn is None or ours == worker_fqn:
            registry.ACTOR_ENVIRONMENT_REGISTRY[ours] = ais_worker_python(base)


def make_policy_factory(config: dict[str, Any]) -> Callable[..., Any]:
    """``setup(policy_factory=...)``: NeMo-RL's ``Policy`` with the AIS worker, for every mode.

    Raises:
        ValueError: ``data_plane.enabled`` (``TQPolicy`` is not an AIS worker), or no backend.
    """
    if get(config, "data_plane.enabled", False):
        raise ValueError(
            "data_plane.enabled=true (TransferQueue) is not supported with the nemo_ais launcher (every arm, "
            "loss_fn.ais.mode=none included, trains on the AIS worker); set data_plane.enabled=false"
        )
    from nemo_rl.models.policy.lm_policy import Policy

    worker_fqn = ais_worker_fqn(config["policy"])

    def make_policy(**kwargs: Any) -> Any:
        register_ais_workers(worker_fqn)  # here: Ray is up if a venv must be built
        return Policy(**kwargs, worker_extension_cls_fqn=worker_fqn)

    return make_policy
