# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Parallel sizes of a colocated config: the trainer (Megatron or DTensor) and the vLLM engines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nemo_ais.preflight.loader import get

_SHARE_KEY = "policy.generation.vllm_cfg.gpu_memory_utilization"


def memory_share_problem(share: Any) -> str | None:
    """VLLM's share of each GPU's memory (``gpu_memory_utilization``) is a fraction in (0, 1]."""
    if share is None or (type(share) in (int, float) and 0 < share <= 1):
        return None
    return f"{_SHARE_KEY}={share!r} is invalid: expected a fraction in (0, 1] (vLLM's share of each GPU's memory)"


TRAINER_KEYS: dict[str, dict[str, str]] = {
    "megatron": {
        "tp": "policy.megatron_cfg.tensor_model_parallel_size",
        "pp": "policy.megatron_cfg.pipeline_model_parallel_size",
        "cp": "policy.megatron_cfg.context_parallel_size",
        "ep": "policy.megatron_cfg.expert_model_parallel_size",
        "etp": "policy.megatron_cfg.expert_tensor_parallel_size",
    },
    "dtensor": {"tp": "policy.dtensor_cfg.tensor_parallel_size", "cp": "policy.dtensor_cfg.context_parallel_size"},
}
"""Trainer backend -> size -> the config key it is read from (absent: 1)."""


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes derived from a config (trainer and colocated vLLM engine); DP is floor-divided."""

    trainer: Literal["megatron", "dtensor"]
    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    vllm_tp: int
    vllm_pp: int
    vllm_ep: int
    vllm_engines: int

    def key(self, size: str) -> str:
        """The config key of a trainer size (``"tp"`` -> ``policy.<backend>_cfg....``)."""
        return TRAINER_KEYS[self.trainer][size]


def parallel_layout(cfg: Mapping[str, Any]) -> ParallelLayout:
    """Trainer (Megatron if enabled, else DTensor) and rollout (vLLM) sizes of a config."""
    world = int(get(cfg, "cluster.num_nodes", 1)) * int(get(cfg, "cluster.gpus_per_node", 1))
    trainer = "megatron" if get(cfg, "policy.megatron_cfg.enabled", False) else "dtensor"
    keys = TRAINER_KEYS[trainer]
    tp, pp, cp, ep, etp = (
        int(get(cfg, keys[size], 1)) if size in keys else 1 for size in ("tp", "pp", "cp", "ep", "etp")
    )
    vcfg = "policy.generation.vllm_cfg."
    vllm_tp = int(get(cfg, vcfg + "tensor_parallel_size", 1))
    vllm_pp = int(get(cfg, vcfg + "pipeline_parallel_size", 1))
    vllm_ep = int(get(cfg, vcfg + "expert_parallel_size", 1))
    return ParallelLayout(
        trainer=trainer,
        world=world,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=world // max(1, tp * pp * cp),
        vllm_tp=vllm_tp,
        vllm_pp=vllm_pp,
        vllm_ep=vllm_ep,
        vllm_engines=world // max(1, vllm_tp * vllm_pp),
    )
