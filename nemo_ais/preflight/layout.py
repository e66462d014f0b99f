# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Parallel sizes of a config: the trainer (Megatron or DTensor) and the vLLM engines, on their GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nemo_ais.rules.config_keys import get, has

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

_VLLM_SIZES = tuple(f"policy.generation.vllm_cfg.{size}_parallel_size" for size in ("tensor", "pipeline", "expert"))


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes derived from a config (trainer and vLLM engines); DP is floor-divided.

    ``world``: the training GPUs; ``rollout_gpus``: the vLLM engines' (both the whole cluster when colocated).
    ``whole_cluster``: colocated and nothing reserved (:func:`reserved`), so both are every GPU of the cluster.
    """

    trainer: Literal["megatron", "dtensor"]
    world: int
    rollout_gpus: int
    colocated: bool
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
    whole_cluster: bool

    def key(self, size: str) -> str:
        """The config key of a trainer size (``"tp"`` -> ``policy.<backend>_cfg....``)."""
        return TRAINER_KEYS[self.trainer][size]


def size_problems(cfg: Mapping[str, Any]) -> list[str]:
    """A message per GPU count or parallel size set to anything but an integer >= 1 (NeMo-RL types them ``int``)."""
    trainer = "megatron" if get(cfg, "policy.megatron_cfg.enabled", False) else "dtensor"
    keys = ("cluster.num_nodes", "cluster.gpus_per_node", *TRAINER_KEYS[trainer].values(), *_VLLM_SIZES)
    return [
        f"{key}={value!r} is invalid: expected an integer >= 1"
        for key in keys
        if has(cfg, key) and (type(value := get(cfg, key, None)) is not int or value < 1)
    ]


_RESOURCES = "policy.generation.colocated.resources."


def _colocated(cfg: Mapping[str, Any]) -> bool:
    return get(cfg, "policy.generation.colocated.enabled", True) is not False


def _int(value: Any, default: int = 0) -> int:
    return value if type(value) is int else default


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if a mapping, else {} (a malformed section is upstream's schema error, not a split)."""
    return value if isinstance(value, Mapping) else {}


def reserved(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(reward-model nodes, reward-model GPUs per node, OPD teacher nodes)`` that GRPO ``setup`` keeps from the policy.

    The reward model counts when a data split's ``env_name`` is ``reward_model`` (a split may be a list of datasets,
    main) with its ``env.reward_model.resources``; the teachers when ``on_policy_distillation.non_colocated_teachers``
    is enabled (``num_nodes`` per distinct teacher model, default 1).
    """
    data = _mapping(get(cfg, "data", None))
    splits = [data.get(split) for split in ("train", "validation", "default")]
    datasets = [d for s in splits for d in (s if isinstance(s, list) else [s])]
    rm_used = any(_mapping(d).get("env_name") == "reward_model" for d in datasets)
    rm = _mapping(get(cfg, "env.reward_model.resources", None)) if rm_used else {}
    rm_nodes, rm_gpus = _int(rm.get("num_nodes")), _int(rm.get("gpus_per_node"))
    opd = _mapping(get(cfg, "on_policy_distillation", None))
    teachers = _mapping(opd.get("non_colocated_teachers"))
    if not (opd.get("enabled") and teachers.get("enabled")):  # truthy, as upstream's bool()
        return rm_nodes, rm_gpus, 0
    default, overrides = _mapping(teachers.get("default_teacher_cfg")), _mapping(teachers.get("teacher_overrides"))
    models: dict[Any, str] = {}  # one teacher per model when deduplicated (upstream's default)
    dedup = opd.get("deduplicate_shared_teacher_checkpoints", True)
    for alias, model in _mapping(opd.get("teacher_model_by_agent_name")).items():
        models.setdefault(model if dedup and isinstance(model, str) else alias, alias)
    nodes = sum(_int({**default, **_mapping(overrides.get(a))}.get("num_nodes", 1), 1) for a in models.values())
    return rm_nodes, rm_gpus, nodes


def _policy_nodes(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(cluster nodes, policy nodes, reward-model GPUs on a one-node cluster)``, as GRPO ``setup`` derives them."""
    nodes = int(get(cfg, "cluster.num_nodes", 1))
    rm_nodes, rm_gpus, teacher_nodes = reserved(cfg)
    return nodes, (nodes if nodes == 1 else nodes - rm_nodes) - teacher_nodes, rm_gpus if nodes == 1 else 0


def gpu_split(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """``(training GPUs, rollout GPUs)`` as NeMo-RL's GRPO ``setup`` splits the cluster.

    The policy gets the nodes the reward model and non-colocated OPD teachers leave (:func:`reserved`; on one node, the
    GPUs the reward model leaves). Colocated: all of them for both. Otherwise one policy node gives the engines
    ``colocated.resources.gpus_per_node`` of its GPUs, several give them ``colocated.resources.num_nodes`` whole nodes.
    :func:`split_problems` says when the split is invalid.
    """
    _, policy_nodes, rm_gpus = _policy_nodes(cfg)
    gpus_per_node = int(get(cfg, "cluster.gpus_per_node", 1))
    if _colocated(cfg):
        gpus = max(0, policy_nodes) * (gpus_per_node - rm_gpus)
        return gpus, gpus
    if policy_nodes == 1:
        rollout = _int(get(cfg, _RESOURCES + "gpus_per_node"))
        return gpus_per_node - rollout - rm_gpus, rollout
    rollout_nodes = _int(get(cfg, _RESOURCES + "num_nodes"))
    return max(0, policy_nodes - rollout_nodes) * gpus_per_node, rollout_nodes * gpus_per_node


def split_problems(cfg: Mapping[str, Any]) -> list[str]:
    """What NeMo-RL's GRPO ``setup`` asserts of the policy's nodes and of a non-colocated GPU split."""
    nodes, policy_nodes, rm_gpus = _policy_nodes(cfg)
    gpus_per_node = int(get(cfg, "cluster.gpus_per_node", 1))
    if policy_nodes < 1 or gpus_per_node - rm_gpus < 1:
        rm_nodes, _, teacher_nodes = reserved(cfg)
        return [
            f"cluster.num_nodes={nodes} x cluster.gpus_per_node={gpus_per_node} leaves the policy no GPUs: the reward "
            f"model (env.reward_model.resources) takes {rm_nodes} node(s) or {rm_gpus} GPU(s) of one node, the "
            f"non-colocated OPD teachers {teacher_nodes} node(s)"
        ]
    if _colocated(cfg):
        return []
    rollout_gpus, rollout_nodes = get(cfg, _RESOURCES + "gpus_per_node"), get(cfg, _RESOURCES + "num_nodes")
    problems = []
    if policy_nodes == 1:
        bound = f"cluster.gpus_per_node={gpus_per_node}" + (f" - {rm_gpus} of the reward model" if rm_gpus else "")
        if type(rollout_gpus) is not int or not 0 < rollout_gpus < gpus_per_node - rm_gpus:
            problems.append(
                f"{_RESOURCES}gpus_per_node={rollout_gpus!r} is invalid on one node: expected the engines' GPUs, "
                f"an integer in [1, {bound}) (the rest train)"
            )
        if rollout_nodes not in (None, 1):
            problems.append(f"{_RESOURCES}num_nodes={rollout_nodes!r} is invalid on one node: expected 1 or null")
        return problems
    bound = f"cluster.num_nodes={nodes}" + (f" - {nodes - policy_nodes} reserved" if policy_nodes < nodes else "")
    if type(rollout_nodes) is not int or not 0 < rollout_nodes < policy_nodes:
        problems.append(
            f"{_RESOURCES}num_nodes={rollout_nodes!r} is invalid: expected the engines' nodes, an integer in "
            f"[1, {bound}) (the rest train)"
        )
    if rollout_gpus != gpus_per_node:
        problems.append(
            f"{_RESOURCES}gpus_per_node={rollout_gpus!r} is invalid with {policy_nodes} nodes: expected "
            f"cluster.gpus_per_node={gpus_per_node} (the engines take whole nodes)"
        )
    return problems


def parallel_layout(cfg: Mapping[str, Any]) -> ParallelLayout:
    """Trainer (Megatron if enabled, else DTensor) and rollout (vLLM) sizes of a config (:func:`size_problems` none)."""
    world, rollout_gpus = gpu_split(cfg)
    trainer = "megatron" if get(cfg, "policy.megatron_cfg.enabled", False) else "dtensor"
    keys = TRAINER_KEYS[trainer]
    tp, pp, cp, ep, etp = (
        int(get(cfg, keys[size], 1)) if size in keys else 1 for size in ("tp", "pp", "cp", "ep", "etp")
    )
    vllm_tp, vllm_pp, vllm_ep = (int(get(cfg, key, 1)) for key in _VLLM_SIZES)
    return ParallelLayout(
        trainer=trainer,
        world=world,
        rollout_gpus=rollout_gpus,
        colocated=_colocated(cfg),
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=world // max(1, tp * pp * cp),
        vllm_tp=vllm_tp,
        vllm_pp=vllm_pp,
        vllm_ep=vllm_ep,
        vllm_engines=rollout_gpus // max(1, vllm_tp * vllm_pp),
        whole_cluster=_colocated(cfg) and not any(reserved(cfg)),
    )


_STAGE = "policy.megatron_cfg.num_layers_in_{}_pipeline_stage"


def pipeline_stages(cfg: Mapping[str, Any], num_layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline stage, by Megatron-Core's ``TransformerConfig`` rule.

    Uneven first / last stages leave the other layers to split evenly over the middle stages, each stage >= 1 layer.

    Raises:
        ValueError: a stage size that is not an integer >= 1, or a split Megatron-Core refuses (names the fields).
    """
    first, last = (get(cfg, _STAGE.format(end)) for end in ("first", "last"))
    if pp == 1 and first is None and last is None:
        return [num_layers]
    for end, size in (("first", first), ("last", last)):
        if size is not None and (type(size) is not int or size < 1):
            raise ValueError(f"{_STAGE.format(end)}={size!r} is invalid: expected an integer >= 1")
    middle_layers = num_layers - (first or 0) - (last or 0)
    middle_stages = pp - (first is not None) - (last is not None)
    pp_key = TRAINER_KEYS["megatron"]["pp"]
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages) or middle_layers % max(1, middle_stages):
        set_ = [f"{_STAGE.format(end)}={size}" for end, size in (("first", first), ("last", last)) if size is not None]
        uneven = f" after {', '.join(set_)}" if set_ else ""
        raise ValueError(
            f"{pp_key}={pp} does not split the {num_layers} layers{uneven}: {middle_layers} layers left for "
            f"{middle_stages} stage(s), expected an equal number >= 1 each (Megatron-Core's rule; set "
            "num_layers_in_first/last_pipeline_stage for an uneven first or last stage)"
        )
    middle = [middle_layers // middle_stages] * middle_stages if middle_stages else []
    return [first] * (first is not None) + middle + [last] * (last is not None)
