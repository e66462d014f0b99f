# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""FP8 rollout: NeMo-RL's FP8 flag rules and vLLM's 128 x 128 block-FP8 weight shards.

MXFP8 (``precision: fp8`` + ``is_mx: true``, NeMo-RL main) shares the flag rules but not
the 128 x 128 tiles: its shards are checked by :mod:`.formats` (``vllm_mxfp8_shards``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_ais.preflight.checks.loss import NO_CORRECTION_HINT, setup_sees_importance_sampling
from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.loader import get
from nemo_ais.preflight.model_shapes import ModelShape
from nemo_ais.rules.config_keys import section_enabled
from nemo_ais.rules.format_geometry import FP8_BLOCK, fp8_refit_block_problem, fp8_refit_precision_problem

_FP8_KV_DTYPES = ("fp8", "fp8_e4m3")
_KV_DTYPES = ("auto", *_FP8_KV_DTYPES)


def fp8_kv_refit_problems(cfg: Mapping[str, Any]) -> list[str]:
    """Settings with which calibrated FP8 KV scales cannot reach vLLM at every refit, one line each.

    NeMo-RL v0.7.0 refits before the first KV calibration if ``grpo.val_at_start``: the first rollout's scales are 1.0.
    """
    kv = str(get(cfg, "policy.generation.vllm_cfg.kv_cache_dtype", "auto") or "auto")
    if not kv.startswith("fp8") or not get(cfg, "grpo.val_at_start", False):
        return []
    return [
        f"grpo.val_at_start=true with policy.generation.vllm_cfg.kv_cache_dtype={kv!r} is "
        "invalid: expected false (NeMo-RL v0.7.0 refits before the first KV-scale "
        "calibration, so the engine would run with every q/k/v scale at 1.0)"
    ]


@check("fp8_rollout")
def check_fp8_rollout(ctx: Context) -> Verdict:
    """FP8 weights need a correction; an FP8 KV cache FP8 weights, Megatron, PP 1, no async."""
    vllm = ctx.get("policy.generation.vllm_cfg", {})
    precision = vllm.get("precision")
    kv = vllm.get("kv_cache_dtype", "auto")
    problems = []
    vllm_backend = ctx.get("policy.generation.backend", "vllm") == "vllm"
    if vllm_backend and precision == "fp8" and not setup_sees_importance_sampling(ctx.cfg):
        # grpo.setup (v0.7.0, main) asserts use_importance_sampling_correction when vllm_cfg["precision"] == "fp8"
        problems.append(
            f"policy.generation.vllm_cfg.precision='fp8' needs an importance-sampling correction: {NO_CORRECTION_HINT} "
            "(NeMo-RL's grpo.setup asserts 'Importance sampling must be enabled for vLLM FP8 generation')"
        )
    if kv not in _KV_DTYPES:
        problems.append(f"policy.generation.vllm_cfg.kv_cache_dtype={kv!r} is invalid: expected one of {_KV_DTYPES}")
    elif kv in _FP8_KV_DTYPES:
        if precision != "fp8":
            problems.append(
                f"policy.generation.vllm_cfg.kv_cache_dtype={kv!r} needs "
                f"policy.generation.vllm_cfg.precision='fp8' (got {precision!r})"
            )
        if not ctx.get("policy.megatron_cfg.enabled", False):
            problems.append("an FP8 KV cache needs the Megatron backend (policy.megatron_cfg.enabled)")
        pp = ctx.get("policy.megatron_cfg.pipeline_model_parallel_size", 1)
        if pp != 1:
            problems.append(
                f"an FP8 KV cache needs policy.megatron_cfg.pipeline_model_parallel_size=1 "
                f"(got {pp}; asserted by NeMo-RL v0.7.0 grpo.setup)"
            )
        # upstream's grpo.setup asserts "not async rollouts": vLLM's async engine (async GRPO needs it too)
        if vllm_backend and vllm.get("async_engine", False):
            problems.append(
                "an FP8 KV cache does not support async rollouts (policy.generation.vllm_cfg.async_engine=true; "
                "NeMo-RL's grpo.setup asserts 'Async rollouts is not supported with kv cache fp8 enabled')"
            )
        problems += fp8_kv_refit_problems(ctx.cfg)
    refit = ctx.get("ais_fp8_refit")
    if section_enabled(refit):
        block = fp8_refit_block_problem(refit["block"]) if "block" in refit else None
        problems += [p for p in (fp8_refit_precision_problem(precision), block) if p]
    warnings = []
    if precision == "fp8":
        counts = {end: vllm.get(f"num_{end}_layers_in_bf16", 0) for end in ("first", "last")}
        bad = {end: n for end, n in counts.items() if type(n) is not int or n < 0}
        problems += [
            f"policy.generation.vllm_cfg.num_{end}_layers_in_bf16={n!r} is invalid: expected an integer >= 0"
            for end, n in bad.items()
        ]
        n_bf16 = 0 if bad else sum(counts.values())
        if ctx.shape is not None and n_bf16 > ctx.shape.num_layers:
            problems.append(
                f"num_first_layers_in_bf16 + num_last_layers_in_bf16 = {n_bf16} exceeds the "
                f"model's {ctx.shape.num_layers} layers"
            )
        if n_bf16 and ctx.nemo_rl is not None and ctx.nemo_rl.nests_bf16_layers:
            warnings.append(
                f"policy.generation.vllm_cfg.num_first_layers_in_bf16 / num_last_layers_in_bf16 on {ctx.nemo_rl.name}: "
                "its init_fp8 hands vLLM those layers' names as one nested list in ignored_layers (NeMo-RL main "
                "flattens it), which vLLM's by-name match does not look into, so they are likely quantized anyway; "
                "nemo_ais's FP8 refit keeps them in BF16 and stops at the first refit naming the layer. Use NeMo-RL "
                "main, or name the linears in quantization_ignored_layer_kws"
            )
        if not (vllm.get("use_deep_gemm") or vllm.get("is_mx")):  # MXFP8 never uses DeepGEMM
            warnings.append(
                "policy.generation.vllm_cfg.use_deep_gemm is false: FP8 runs on vLLM's slower CUTLASS block-FP8 kernels"
            )
    return Verdict(problems, f"precision={precision}, kv_cache_dtype={kv}", warnings)


def block_quantized_shards(shape: ModelShape, tp: int, ep: int) -> dict[str, float]:
    """Per-rank sizes of the block-quantized dims of one vLLM TP rank.

    Output dim of column-parallel layers, input dim of row-parallel ones; K = hidden is
    never split. Values are floats when TP does not divide a dim (then never a multiple).
    """
    kv_per_rank = max(shape.num_key_value_heads / tp, 1)  # vLLM replicates KV heads if TP > kv
    shards: dict[str, float] = {
        "hidden_size (K of q/k/v, gate/up)": shape.hidden_size,
        "q_proj out / o_proj in = heads x head_dim / TP": (shape.num_attention_heads * shape.head_dim / tp),
        "k/v_proj out = max(kv_heads / TP, 1) x head_dim": kv_per_rank * shape.head_dim,
    }
    if shape.num_experts:
        # With expert parallelism vLLM keeps each expert whole on one rank.
        expert_tp = 1 if ep > 1 else tp
        shards[f"expert gate/up out / down in = moe_intermediate / {expert_tp}"] = (
            shape.moe_intermediate_size / expert_tp
        )
    else:
        shards["gate/up out / down in = intermediate / TP"] = shape.intermediate_size / tp
    return shards


@check("vllm_fp8_shards", needs_shape=True)
def check_vllm_fp8_shards(ctx: Context) -> Verdict | None:
    """Block FP8 (MXFP8: ``vllm_mxfp8_shards``): every per-rank block dim is a multiple of 128."""
    vllm = ctx.get("policy.generation.vllm_cfg", {})
    if vllm.get("precision") != "fp8" or vllm.get("is_mx", False):
        return None
    assert ctx.shape is not None  # needs_shape
    lay = ctx.layout
    problems = [
        f"{name} = {size:g} is not divisible by {FP8_BLOCK} at vLLM tensor_parallel_size="
        f"{lay.vllm_tp} (block-FP8 weights need 128-aligned shards)"
        for name, size in block_quantized_shards(ctx.shape, lay.vllm_tp, lay.vllm_ep).items()
        if size != int(size) or int(size) % FP8_BLOCK
    ]
    return Verdict(problems, f"all block-quantized shards at TP={lay.vllm_tp} are multiples of {FP8_BLOCK}")
