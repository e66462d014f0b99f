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
"""Parallel sizes of a colocated config: the trainer (Megatron or DTensor) and the vLLM engines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_ais.preflight.loader import get

__all__ = ["ParallelLayout", "parallel_layout"]


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes derived from a config (trainer and colocated vLLM engine); DP is floor-divided."""

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


def parallel_layout(cfg: Mapping[str, Any]) -> ParallelLayout:
    """Trainer (Megatron, else DTensor) and rollout (vLLM) sizes of a colocated config."""
    world = int(get(cfg, "cluster.num_nodes", 1)) * int(get(cfg, "cluster.gpus_per_node", 1))
    mcfg = "policy.megatron_cfg."
    if get(cfg, mcfg + "enabled", False):
        tp = int(get(cfg, mcfg + "tensor_model_parallel_size", 1))
        pp = int(get(cfg, mcfg + "pipeline_model_parallel_size", 1))
        cp = int(get(cfg, mcfg + "context_parallel_size", 1))
        ep = int(get(cfg, mcfg + "expert_model_parallel_size", 1))
        etp = int(get(cfg, mcfg + "expert_tensor_parallel_size", 1))
    else:
        tp = int(get(cfg, "policy.dtensor_cfg.tensor_parallel_size", 1))
        cp = int(get(cfg, "policy.dtensor_cfg.context_parallel_size", 1))
        pp, ep, etp = 1, 1, 1
    vcfg = "policy.generation.vllm_cfg."
    vllm_tp = int(get(cfg, vcfg + "tensor_parallel_size", 1))
    vllm_pp = int(get(cfg, vcfg + "pipeline_parallel_size", 1))
    vllm_ep = int(get(cfg, vcfg + "expert_parallel_size", 1))
    return ParallelLayout(
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
