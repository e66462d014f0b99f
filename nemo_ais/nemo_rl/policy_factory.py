# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""``grpo.setup(policy_factory=...)``: NeMo-RL's ``Policy`` with the AIS worker.

The AIS worker is picked per training backend (:func:`ais_worker_fqn`), registered in
NeMo-RL's actor environment registry (:func:`register_ais_workers`) and passed to
``Policy`` as ``worker_extension_cls_fqn`` (:func:`make_policy_factory`). NeMo-RL is
imported inside the functions only, so importing this module needs no NeMo-RL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_ais.nemo_rl.workers import AIS_WORKER_FQNS

__all__ = ["ais_worker_fqn", "make_policy_factory", "register_ais_workers"]

_MEGATRON = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
_DTENSOR = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker"
_DTENSOR_V2 = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"


def ais_worker_fqn(policy_cfg: dict[str, Any]) -> str:
    """The AIS worker extending the NeMo-RL worker that ``Policy`` would pick."""
    if policy_cfg.get("quant_cfg") is not None:
        raise ValueError("policy.quant_cfg (ModelOpt workers) is not supported with loss_fn.ais")
    if (policy_cfg.get("megatron_cfg") or {}).get("enabled", False):
        return AIS_WORKER_FQNS[_MEGATRON]
    dtensor = policy_cfg.get("dtensor_cfg") or {}
    if dtensor.get("enabled", False):
        return AIS_WORKER_FQNS[_DTENSOR_V2 if dtensor.get("_v2", False) else _DTENSOR]
    raise ValueError(
        "policy.megatron_cfg.enabled or policy.dtensor_cfg.enabled must be true "
        "(NeMo-RL needs a training backend)"
    )


def register_ais_workers() -> None:
    """Give each AIS worker the Python environment of the NeMo-RL worker it extends."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    for base, ours in AIS_WORKER_FQNS.items():
        ACTOR_ENVIRONMENT_REGISTRY.setdefault(ours, ACTOR_ENVIRONMENT_REGISTRY[base])


def make_policy_factory(config: dict[str, Any], ais_cfg: Any) -> Callable[..., Any]:
    """``setup(policy_factory=...)``: NeMo-RL's ``Policy`` with the AIS worker.

    Every ``loss_fn.ais.mode`` gets the same worker, ``none`` included: the arms of a
    comparison then differ only in rollout precision and correction mode (same KV-scale
    calibration, same prepare step and ``ais/*`` telemetry; ``none`` applies weight 1,
    bit-identical to ``ClippedPGLossFn``).

    Raises:
        ValueError: ``data_plane.enabled`` (TransferQueue's ``TQPolicy`` is not an AIS
            worker), or no supported training backend (:func:`ais_worker_fqn`).
    """
    del ais_cfg  # the worker does not depend on the mode (kept for the launcher's call)
    if (config.get("data_plane") or {}).get("enabled", False):
        raise ValueError(
            "data_plane.enabled=true (TransferQueue) is not supported with the nemo_ais "
            "launcher (every arm, loss_fn.ais.mode=none included, trains on the AIS worker); "
            "set data_plane.enabled=false"
        )
    from nemo_rl.models.policy.lm_policy import Policy

    worker_fqn = ais_worker_fqn(config["policy"])
    register_ais_workers()

    def make_policy(**kwargs: Any) -> Any:
        return Policy(**kwargs, worker_extension_cls_fqn=worker_fqn)

    return make_policy
