# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Per-GPU and per-node memory budget of a colocated NeMo-RL v0.7.0 GRPO config (an ESTIMATE).

GiB (2**30 bytes) per GPU for each phase of a colocated step (train, logprob, refit, generate), and host RAM per node.
Terms, phases, fixed runtime estimates: docs/cluster.md ("What is counted"); validate with NeMo-RL's own memory logs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_ais.preflight.checks.formats import WEIGHT_BYTES, kept_in_bf16, quantized_linears, rollout_format
from nemo_ais.preflight.cli import split_args
from nemo_ais.preflight.layout import memory_share_problem, parallel_layout, pipeline_stages, size_problems
from nemo_ais.preflight.loader import get, is_mixin, load_config
from nemo_ais.preflight.model_shapes import ModelShape, resolve_model_shape

__all__ = [
    "GIB",
    "HBM_GIB",
    "TRAINER_IDLE_GIB",
    "TRAINER_RUNTIME_GIB",
    "VLLM_ASLEEP_GIB",
    "VLLM_RUNTIME_GIB",
    "Budget",
    "TrainerState",
    "activation_bytes_per_token_layer",
    "activations_gib",
    "budget",
    "kv_bytes_per_token",
    "logits_gib",
    "main",
    "markdown_table",
    "model_shape",
    "trainer_params",
    "trainer_state",
    "vllm_weights_gib",
]

PROG = "python -m nemo_ais.preflight.memory_budget"
GIB = 2**30
HBM_GIB = 80.0  # H100 80GB; CUDA reports 79.6 GiB, so this leaves no headroom on its own
# Megatron worker: CUDA context, NCCL communicators, cuBLAS/TE workspaces, fragmentation.
TRAINER_RUNTIME_GIB = 3.0
TRAINER_IDLE_GIB = 1.5  # the same worker fully offloaded (context + NCCL buffers)
VLLM_ASLEEP_GIB = 1.5  # a sleeping vLLM worker: CUDA context and CUDA-graph pools
VLLM_RUNTIME_GIB = 4.0  # inside vLLM's share: profiled peak activations, CUDA graphs, sampler


def model_shape(model_name: str) -> ModelShape:
    """The model's shapes: its config.json, else the table (:func:`resolve_model_shape`).

    Raises:
        KeyError: neither has them (the message says where it looked).
    """
    found = resolve_model_shape(model_name)
    if found.shape is None:
        raise KeyError(found.detail)
    return found.shape


@dataclass(frozen=True)
class Budget:
    """Memory per GPU (GiB, the busiest rank) and host RAM per node of one config."""

    name: str
    model: str
    layout: str
    gpu_gib: float
    params_per_gpu: int  # trainer parameters on the busiest pipeline stage
    weights: float
    grads: float
    optimizer: float
    activations: float
    activation_checkpointing: bool
    logits: float
    logprob_logits: float
    vllm_share: float
    vllm_weights: float
    kv_cache: float
    kv_max_len_seqs: float  # max_model_len sequences the KV cache of one engine holds
    resident_master: float  # fp32 master left on the GPU while vLLM runs (no precision-aware)
    train: float
    logprob: float
    refit: float
    generate: float
    host_per_gpu: float
    host_per_node: float

    @property
    def peak(self) -> float:
        """The largest per-GPU phase."""
        return max(self.train, self.logprob, self.refit, self.generate)

    def problems(self) -> list[str]:
        """Why the config does not fit (empty when it fits)."""
        out = []
        for phase in ("train", "logprob", "refit", "generate"):
            value = getattr(self, phase)
            if value > self.gpu_gib:
                out.append(
                    f"{self.name}: {phase} needs {value:.1f} GiB per GPU > {self.gpu_gib:.0f} GiB "
                    f"(over by {value - self.gpu_gib:.1f} GiB)"
                )
        if self.kv_max_len_seqs < 1:
            out.append(
                f"{self.name}: the vLLM KV cache ({self.kv_cache:.1f} GiB) holds {self.kv_max_len_seqs:.2f} "
                "max_model_len sequences, vLLM needs >= 1 (raise gpu_memory_utilization or vLLM TP)"
            )
        return out


def trainer_params(cfg: Mapping[str, Any], shape: ModelShape) -> tuple[int, int]:
    """(dense, expert) parameters on the busiest pipeline stage of one trainer GPU."""
    lay = parallel_layout(cfg)
    stages = pipeline_stages(cfg, shape.num_layers, lay.pp)
    per_layer_dense = (shape.attention_params() + shape.mlp_params()) / lay.tp
    per_layer_dense += shape.replicated_params()
    per_layer_expert = shape.expert_params() / (lay.ep * lay.etp)
    best = (0, 0)
    for i, n_layers in enumerate(stages):
        last = i == len(stages) - 1
        embeds = (i == 0) + (last and not (shape.tie_word_embeddings and lay.pp == 1))
        dense = n_layers * per_layer_dense + embeds * shape.embedding_params() / lay.tp
        dense += shape.hidden_size if last else 0  # final norm
        expert = n_layers * per_layer_expert
        if dense + expert > sum(best):
            best = (round(dense), round(expert))
    return best


def _optimizer_bytes(cfg: Mapping[str, Any]) -> tuple[float, float]:
    """(GPU, host) bytes per parameter of Adam state before distributed-optimizer sharding."""
    opt = "policy.megatron_cfg.optimizer."
    if get(cfg, opt + "optimizer", "adam") != "adam":
        raise ValueError(f"{opt}optimizer: only adam is budgeted")
    if get(cfg, opt + "optimizer_cpu_offload", False):
        return 0.0, 12.0
    return (10.0 if get(cfg, opt + "use_precision_aware_optimizer", False) else 12.0), 0.0


def _sequence_split(cfg: Mapping[str, Any], tp: int) -> int:
    """How many ways the norms' activations are split: TP with sequence parallelism, else 1."""
    return tp if get(cfg, "policy.megatron_cfg.sequence_parallel", False) else 1


def activation_bytes_per_token_layer(cfg: Mapping[str, Any], shape: ModelShape) -> float:
    """BF16 bytes one token keeps for one layer's backward, no checkpointing (docs/cluster.md)."""
    lay = parallel_layout(cfg)
    h, d = shape.hidden_size, shape.head_dim
    norms = 4 * h / _sequence_split(cfg, lay.tp)
    attention = 2 * (shape.num_attention_heads + shape.num_key_value_heads) * d / lay.tp
    mlp = 3 * shape.intermediate_size / lay.tp if not shape.num_experts else 0.0
    moe = shape.experts_per_token * (h + 3 * shape.moe_intermediate_size) / (lay.tp * lay.etp)
    return 2 * (norms + attention + mlp + moe)


def _micro_batch_tokens(cfg: Mapping[str, Any], kind: str) -> int:
    """Tokens of one train / logprob micro-batch: packed budget, else batch x max length."""
    if get(cfg, "policy.sequence_packing.enabled", False):
        return int(get(cfg, f"policy.sequence_packing.{kind}_mb_tokens"))
    batch = "train_micro_batch_size" if kind == "train" else "logprob_batch_size"
    return int(get(cfg, f"policy.{batch}")) * int(get(cfg, "policy.max_total_sequence_length"))


def activations_gib(cfg: Mapping[str, Any], shape: ModelShape, stage_layers: int) -> float:
    """Activations held on pipeline stage 0 for the micro-batches in flight (estimate)."""
    lay = parallel_layout(cfg)
    tokens = _micro_batch_tokens(cfg, "train") / lay.cp
    n_micro = int(get(cfg, "policy.train_global_batch_size")) // (
        lay.dp * int(get(cfg, "policy.train_micro_batch_size"))
    )
    in_flight = max(1, min(lay.pp, n_micro))
    full = activation_bytes_per_token_layer(cfg, shape)
    if get(cfg, "policy.megatron_cfg.activation_checkpointing", False):
        kept = 2 * shape.hidden_size / _sequence_split(cfg, lay.tp)
        return tokens * (in_flight * stage_layers * kept + full) / GIB
    return tokens * in_flight * stage_layers * full / GIB


def logits_gib(cfg: Mapping[str, Any], shape: ModelShape, tokens: float, grad: bool) -> float:
    """fp32 logits + fp32 log-softmax (+ the saved fp32 softmax) (+ BF16 logits if deferred)."""
    lay = parallel_layout(cfg)
    per_elem = 12.0 if grad else 8.0
    per_elem += 2.0 if get(cfg, "policy.megatron_cfg.defer_fp32_logits", False) else 0.0
    return tokens / lay.cp * shape.vocab_size / lay.tp * per_elem / GIB


def vllm_weights_gib(cfg: Mapping[str, Any], shape: ModelShape) -> float:
    """One vLLM rank's weights: quantized decoder linears (+ scales), BF16 elsewhere."""
    lay = parallel_layout(cfg)
    per_param = WEIGHT_BYTES[rollout_format(cfg)]
    bf16 = kept_in_bf16(cfg, shape.num_layers)
    total = 0.0
    for lin in quantized_linears(shape, lay.vllm_tp, lay.vllm_ep):
        for i in range(shape.num_layers):
            kept = all(bf16(name.format(i=i)) for name in lin.names)
            total += lin.params * (2.0 if kept else per_param)
    n_embed = 1 if shape.tie_word_embeddings else 2
    other = shape.num_layers * shape.replicated_params() + shape.hidden_size
    other += n_embed * shape.embedding_params() / lay.vllm_tp
    return (total + 2.0 * other) / lay.vllm_pp / GIB


def kv_bytes_per_token(cfg: Mapping[str, Any], shape: ModelShape) -> float:
    """K and V of one token on one vLLM rank (FP8 KV cache: 1 B, else 2 B)."""
    lay = parallel_layout(cfg)
    fp8 = str(get(cfg, "policy.generation.vllm_cfg.kv_cache_dtype", "auto")).startswith("fp8")
    kv_heads = max(shape.num_key_value_heads / lay.vllm_tp, 1)
    return 2 * shape.num_layers / lay.vllm_pp * kv_heads * shape.head_dim * (1 if fp8 else 2)


def _layout(cfg: Mapping[str, Any]) -> str:
    lay = parallel_layout(cfg)
    ep = f" EP{lay.ep}" if lay.ep > 1 else ""
    gpus = f"{lay.world} GPU" + ("s" if lay.world > 1 else "")
    return f"{gpus}: TP{lay.tp} PP{lay.pp} CP{lay.cp}{ep} DP{lay.dp}; vLLM TP{lay.vllm_tp}"


@dataclass(frozen=True)
class TrainerState:
    """Megatron state on the busiest GPU, in GiB (``params`` is a count)."""

    params: int
    weights: float
    grads: float
    optimizer: float  # on the GPU while training
    resident_master: float  # part of ``optimizer`` that stays on the GPU during generation
    host_optimizer: float  # with optimizer_cpu_offload: the whole Adam shard, in host RAM


def trainer_state(config: Mapping[str, Any], shape: ModelShape) -> TrainerState:
    """Weights, grads and Adam shards of one trainer GPU (docs/cluster.md)."""
    lay = parallel_layout(config)
    dense, expert = trainer_params(config, shape)
    # Distributed optimizer shards: dense parameters over DP x CP, experts over expert DP.
    distributed = get(config, "policy.megatron_cfg.optimizer.use_distributed_optimizer", True)
    dp_dense = lay.dp * lay.cp if distributed else 1
    dp_expert = lay.world // (lay.pp * lay.ep * lay.etp) if distributed else 1
    sharded = dense / dp_dense + expert / dp_expert
    gpu_b, host_b = _optimizer_bytes(config)
    ddp = "policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32"
    # Plain Adam's fp32 master is the inner optimizer's params, not its state: move_optimizer("cpu") leaves it on GPU.
    resident_b = 4.0 if gpu_b == 12.0 else 0.0
    return TrainerState(
        params=dense + expert,
        weights=2.0 * (dense + expert) / GIB,
        grads=(4.0 if get(config, ddp, False) else 2.0) * (dense + expert) / GIB,
        optimizer=gpu_b * sharded / GIB,
        resident_master=resident_b * sharded / GIB,
        host_optimizer=host_b * sharded / GIB,
    )


def budget(config: Mapping[str, Any], name: str = "config", gpu_gib: float = HBM_GIB) -> Budget:
    """Memory budget of one resolved, colocated Megatron + vLLM config (docs/cluster.md).

    Raises:
        KeyError: the model's shapes are unknown (:func:`model_shape`).
        ValueError: not a Megatron config, not colocated, or an optimizer other than Adam.
    """
    if not get(config, "policy.megatron_cfg.enabled", False):
        raise ValueError(f"{name}: policy.megatron_cfg.enabled is false; only Megatron is budgeted")
    if sizes := size_problems(config):
        raise ValueError("; ".join(sizes))
    if not get(config, "policy.generation.colocated.enabled", True):
        raise ValueError(f"{name}: policy.generation.colocated.enabled is false; only colocated")
    shape = model_shape(get(config, "policy.model_name"))
    st = trainer_state(config, shape)
    layers = max(pipeline_stages(config, shape.num_layers, parallel_layout(config).pp))
    activations = activations_gib(config, shape, layers)
    logits = logits_gib(config, shape, _micro_batch_tokens(config, "train"), grad=True)
    lp_logits = logits_gib(config, shape, _micro_batch_tokens(config, "logprob"), grad=False)
    lp_optimizer = 0.0 if get(config, "policy.offload_optimizer_for_logprob") else st.optimizer
    # The raw value, as the offline check reads it: float() would pass a YAML true or "0.5".
    gmu = get(config, "policy.generation.vllm_cfg.gpu_memory_utilization")
    if gmu is None:
        raise ValueError("policy.generation.vllm_cfg.gpu_memory_utilization is not set")
    if problem := memory_share_problem(gmu):
        raise ValueError(problem)
    share = gmu * gpu_gib
    vllm_weights = vllm_weights_gib(config, shape)
    kv_cache = share - vllm_weights - VLLM_RUNTIME_GIB
    max_len = int(get(config, "policy.generation.vllm_cfg.max_model_len"))
    asleep = TRAINER_RUNTIME_GIB + VLLM_ASLEEP_GIB
    offloaded = st.weights + st.grads + st.optimizer - st.resident_master + st.host_optimizer
    return Budget(
        name=name,
        model=str(get(config, "policy.model_name")),
        layout=_layout(config),
        gpu_gib=gpu_gib,
        params_per_gpu=st.params,
        weights=st.weights,
        grads=st.grads,
        optimizer=st.optimizer,
        activations=activations,
        activation_checkpointing=bool(get(config, "policy.megatron_cfg.activation_checkpointing")),
        logits=logits,
        logprob_logits=lp_logits,
        vllm_share=share,
        vllm_weights=vllm_weights,
        kv_cache=kv_cache,
        kv_max_len_seqs=kv_cache * GIB / (kv_bytes_per_token(config, shape) * max_len),
        resident_master=st.resident_master,
        train=st.weights + st.grads + st.optimizer + activations + logits + asleep,
        logprob=st.weights + lp_optimizer + lp_logits + asleep,
        refit=st.weights + st.resident_master + vllm_weights + TRAINER_RUNTIME_GIB,
        generate=share + st.resident_master + TRAINER_IDLE_GIB,
        host_per_gpu=offloaded + vllm_weights,
        host_per_node=(offloaded + vllm_weights) * int(get(config, "cluster.gpus_per_node", 1)),
    )


_COLUMNS: tuple[tuple[str, Callable[[Budget], str]], ...] = (
    ("config", lambda b: b.name),
    ("model / layout", lambda b: f"{b.model}; {b.layout}"),
    ("params/GPU", lambda b: f"{b.params_per_gpu / 1e9:.2f} B"),
    ("weights + grads + Adam", lambda b: f"{b.weights:.1f} + {b.grads:.1f} + {b.optimizer:.1f}"),
    ("activations", lambda b: f"{b.activations:.1f}" + (" (ckpt)" if b.activation_checkpointing else "")),
    ("logits", lambda b: f"{b.logits:.1f}"),
    ("**train**", lambda b: f"**{b.train:.1f}**"),
    ("logprob", lambda b: f"{b.logprob:.1f}"),
    ("refit", lambda b: f"{b.refit:.1f}"),
    ("vLLM share (weights, KV)", lambda b: f"{b.vllm_share:.1f} ({b.vllm_weights:.1f}, {b.kv_cache:.1f})"),
    ("KV seqs", lambda b: f"{b.kv_max_len_seqs:.0f}"),
    ("**generate**", lambda b: f"**{b.generate:.1f}**"),
    ("**host/node**", lambda b: f"**{b.host_per_node:.0f}**"),
    ("fits", lambda b: "yes" if not b.problems() else "**NO**"),
)
"""The budget table's columns: (header, the cell of one :class:`Budget`)."""


def markdown_table(budgets: Sequence[Budget]) -> str:
    """One markdown row per budget (GiB per GPU; host RAM in GiB per node)."""
    rows = [[h for h, _ in _COLUMNS], *([cell(b) for _, cell in _COLUMNS] for b in budgets)]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(_COLUMNS))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """CLI: print the markdown budget table of each full config; exit 1 if one does not fit."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Estimated per-GPU / per-node memory of NeMo-RL GRPO configs (colocated)."
    )
    parser.add_argument("configs", nargs="+", help="YAML files, then Hydra-style overrides (k=v)")
    parser.add_argument("--gpu-gib", type=float, default=HBM_GIB, help="GPU memory (GiB)")
    args = parser.parse_args(argv)
    paths, overrides = split_args(args.configs)
    if not paths:  # an argument without .yaml reads as an override: there would be nothing to budget
        parser.error(f"give at least one .yaml config, then key=value overrides (got {args.configs})")
    budgets, problems = [], []
    for path in paths:
        try:
            cfg = load_config(path, overrides)
            if not is_mixin(cfg):
                budgets.append(budget(cfg, name=Path(path).stem, gpu_gib=args.gpu_gib))
        except (OSError, KeyError, TypeError, ValueError) as err:
            problems.append(f"{path}: cannot budget: {err}")
        except ZeroDivisionError:  # the sizes themselves are checked (size_problems): a derived one is 0
            problems.append(
                f"{path}: cannot budget: the parallel sizes leave no data-parallel rank (DP = GPUs / (TP x PP x CP) < 1;"
                f" python -m nemo_ais.preflight {' '.join([path, *overrides])} names the sizes)"
            )
    print(markdown_table(budgets))
    for model in sorted({b.model for b in budgets}):  # where each model's shapes came from
        print(f"shapes: {resolve_model_shape(model).detail}", file=sys.stderr)
    problems += [p for b in budgets for p in b.problems()]
    print(*problems, sep="\n", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
