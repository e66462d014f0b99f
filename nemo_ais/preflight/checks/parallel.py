# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Parallel layout: trainer sizes vs GPUs and model, the batch split, the vLLM engines."""

from __future__ import annotations

from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.layout import memory_share_problem, pipeline_stages
from nemo_ais.rules.config_keys import has


@check("trainer_parallel")
def check_trainer_parallel(ctx: Context) -> Verdict:
    """TP x PP x CP divides the GPUs; heads, layers and experts split evenly; MoE rules."""
    lay, dims = ctx.layout, ctx.shape
    mcfg = "policy.megatron_cfg"
    megatron = lay.trainer == "megatron"
    problems = []
    model_parallel = lay.tp * lay.pp * lay.cp
    if lay.world % model_parallel:
        sizes = (
            f"TP x PP x CP = {lay.tp} x {lay.pp} x {lay.cp} = {model_parallel} "
            f"({mcfg}.tensor/pipeline/context_parallel_size)"
            if megatron
            else f"TP x CP = {lay.tp} x {lay.cp} = {model_parallel} ({lay.key('tp')} x context_parallel_size)"
        )
        gpus = "GPUs = cluster.num_nodes x cluster.gpus_per_node" if lay.whole_cluster else "training GPUs (gpu_split)"
        problems.append(f"{gpus} = {lay.world} is not divisible by {sizes}")
    if dims is not None:
        if dims.num_attention_heads % lay.tp or dims.num_key_value_heads % lay.tp:
            problems.append(
                f"{lay.key('tp')}={lay.tp} must divide the "
                f"{dims.num_attention_heads} query heads and {dims.num_key_value_heads} KV heads"
            )
        try:
            if megatron:  # DTensor has no pipeline stages: Megatron's stage keys are inert there
                pipeline_stages(ctx.cfg, dims.num_layers, lay.pp)
        except ValueError as err:
            problems.append(str(err))
        n_experts = dims.num_experts
        if n_experts == 0 and lay.ep > 1:
            problems.append(f"{mcfg}.expert_model_parallel_size={lay.ep} > 1 for a dense model")
        if n_experts and n_experts % lay.ep:
            problems.append(f"{mcfg}.expert_model_parallel_size={lay.ep} does not divide the {n_experts} experts")
        sequence_parallel = ctx.get(mcfg + ".sequence_parallel", False)
        if megatron and n_experts and lay.tp > 1 and not sequence_parallel:
            problems.append(f"MoE with tensor_model_parallel_size={lay.tp} > 1 needs {mcfg}.sequence_parallel=true")
    expert_group = lay.etp * lay.ep
    if expert_group > 1 and (lay.world % lay.pp or (lay.world // lay.pp) % expert_group):
        problems.append(
            f"ETP x EP = {lay.etp} x {lay.ep} = {expert_group} must divide GPUs / PP = "
            f"{lay.world} / {lay.pp} (expert data parallel = GPUs / (ETP x EP x PP))"
        )
    problems += _policy_backend_problems(ctx) + _batching_problems(ctx, lay.cp, megatron, lay.pp)
    mbs = ctx.get("policy.train_micro_batch_size", 1)
    lbs = ctx.get("policy.logprob_batch_size", mbs)
    # grpo.setup sets NRL_IGNORE_TP_ACCURACY_CHECK with force_on_policy_ratio (ais.bypass turns it on): no prev_logprobs
    on_policy = ctx.get("loss_fn.force_on_policy_ratio", False) or ctx.get("loss_fn.ais.bypass", False)
    if lay.tp >= 4 and mbs != lbs and not on_policy:
        problems.append(
            f"TP={lay.tp} >= 4 needs policy.train_micro_batch_size ({mbs}) == "
            f"policy.logprob_batch_size ({lbs}) (NeMo-RL's batch-variant TP accuracy check; "
            "loss_fn.ais.bypass=true or NRL_IGNORE_TP_ACCURACY_CHECK=1 on the cluster lifts it)"
        )
    detail = f"{lay.trainer}, GPUs={lay.world}: TP={lay.tp} PP={lay.pp} CP={lay.cp} -> DP={lay.dp}"
    if lay.ep > 1 or lay.etp > 1:
        detail += f"; EP={lay.ep} ETP={lay.etp} -> expert DP={lay.world // (lay.pp * expert_group)}"
    return Verdict(problems, detail)


_COUNTS = (
    "grpo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "grpo.max_num_steps",
    "policy.train_global_batch_size",
    "policy.train_micro_batch_size",
    "policy.logprob_batch_size",
)


_TOKEN_BATCHING = ("sequence_packing", "dynamic_batching")


def _policy_backend_problems(ctx: Context) -> list[str]:
    """What NeMo-RL's ``Policy.__init__`` (v0.7.0 and main) raises of the backend and the draft model, after Ray."""
    megatron, dtensor, draft, packing = (
        bool(ctx.get(f"policy.{k}.enabled", False))
        for k in ("megatron_cfg", "dtensor_cfg", "draft", "sequence_packing")
    )
    problems = []
    if megatron and dtensor:
        problems.append("policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled are exclusive: not both (Policy)")
    if draft and not megatron:
        problems.append("policy.draft.enabled=true needs the Megatron backend (policy.megatron_cfg.enabled) (Policy)")
    if draft and packing:
        problems.append("policy.draft.enabled=true does not support policy.sequence_packing.enabled=true (Policy)")
    return problems


def _batching_problems(ctx: Context, cp: int, megatron: bool, pp: int) -> list[str]:
    """What NeMo-RL's Policy and workers assert of sequence packing, dynamic batching and context parallelism."""
    packing, dynamic = (bool(ctx.get(f"policy.{k}.enabled", False)) for k in _TOKEN_BATCHING)
    problems = []
    if packing and dynamic:
        problems.append("policy.sequence_packing.enabled and policy.dynamic_batching.enabled are exclusive (Policy)")
    if dynamic and pp > 1:
        problems.append(f"policy.dynamic_batching.enabled needs pipeline_model_parallel_size=1, got {pp} (Policy)")
    if megatron and cp > 1 and not packing:
        problems.append(f"context_parallel_size={cp} > 1 needs policy.sequence_packing.enabled=true (Megatron setup)")
    if not megatron and cp > 1 and packing:
        problems.append(f"policy.dtensor_cfg.context_parallel_size={cp} > 1 with sequence packing (DTensor worker)")
    return problems


@check("batch")
def check_batch(ctx: Context) -> Verdict:
    """Rollouts per step are whole global batches; each splits into DP x micro-batches."""
    bad = [
        f"{key}={value!r} is invalid: expected an integer >= 1"
        for key in _COUNTS
        if has(ctx.cfg, key) and (type(value := ctx.get(key)) is not int or value < 1)  # null or bool is no count
    ]
    if bad:  # the arithmetic below would read them as sizes
        return Verdict(bad)
    lay = ctx.layout
    prompts = int(ctx.get("grpo.num_prompts_per_step", 0))
    gens = int(ctx.get("grpo.num_generations_per_prompt", 0))
    gbs = int(ctx.get("policy.train_global_batch_size", 0))
    mbs = int(ctx.get("policy.train_micro_batch_size", 1))
    rollouts = prompts * gens
    problems = []
    multiplier = ctx.get("grpo.batch_multiplier", 1)
    if multiplier != 1 and not ctx.get("grpo.use_dynamic_sampling", False):  # grpo.setup asserts it (v0.7.0, main)
        problems.append(
            f"grpo.batch_multiplier={multiplier!r} needs grpo.use_dynamic_sampling=true: expected 1 without it "
            "(NeMo-RL's grpo.setup asserts 'batch_multiplier>1 can only be used if use_dynamic_sampling=True')"
        )
    if gbs <= 0 or rollouts % gbs:
        problems.append(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {prompts} x {gens} "
            f"= {rollouts} is not a multiple of policy.train_global_batch_size={gbs} "
            f"(NeMo-RL asserts it at the first train step: {rollouts % gbs if gbs > 0 else rollouts} rollouts left over)"
        )
    # packed or dynamic micro-batches are cut by tokens: NeMo-RL then shards gbs over DP and never reads mbs
    by_tokens = next((k for k in _TOKEN_BATCHING if ctx.get(f"policy.{k}.enabled", False)), None)
    split = lay.dp if by_tokens else lay.dp * mbs
    if gbs % max(1, split):
        problems.append(
            f"policy.train_global_batch_size={gbs} is not divisible by DP = {lay.dp}"
            if by_tokens
            else f"policy.train_global_batch_size={gbs} is not divisible by DP x "
            f"policy.train_micro_batch_size = {lay.dp} x {mbs} = {split}"
        )
    steps = rollouts // gbs if gbs > 0 else 0
    micro = f"micro-batches by tokens ({by_tokens})" if by_tokens else f"{gbs // max(1, split)} x mbs {mbs}"
    return Verdict(
        problems, f"{rollouts} rollouts/step = {steps} x gbs {gbs}; gbs/DP = {gbs // max(1, lay.dp)} = {micro}"
    )


@check("vllm_parallel")
def check_vllm_parallel(ctx: Context) -> Verdict:
    """The vLLM TP x PP divides the GPUs; PP needs the async engine; EP and heads split evenly."""
    lay, dims = ctx.layout, ctx.shape
    vcfg = "policy.generation.vllm_cfg"
    problems = []
    engine = lay.vllm_tp * lay.vllm_pp
    if engine > lay.rollout_gpus or lay.rollout_gpus % engine:
        gpus = "GPUs" if lay.whole_cluster else "rollout GPUs (gpu_split)"
        problems.append(
            f"vLLM TP x PP = {lay.vllm_tp} x {lay.vllm_pp} = {engine} must divide the {lay.rollout_gpus} {gpus}"
        )
    if lay.vllm_pp > 1 and not ctx.get(vcfg + ".async_engine", False):
        problems.append(f"{vcfg}.pipeline_parallel_size={lay.vllm_pp} > 1 needs {vcfg}.async_engine=true")
    if lay.vllm_ep > 1:
        if lay.vllm_ep % lay.vllm_tp:
            problems.append(
                f"{vcfg}.expert_parallel_size={lay.vllm_ep} must be a multiple of "
                f"tensor_parallel_size={lay.vllm_tp} (vLLM's EP = DP x TP)"
            )
        if lay.vllm_ep != lay.vllm_tp and ctx.get(vcfg + ".async_engine", False):
            problems.append(
                f"{vcfg}.expert_parallel_size={lay.vllm_ep} != tensor_parallel_size={lay.vllm_tp} (DP inside vLLM) "
                f"needs {vcfg}.async_engine=false (NeMo-RL's VllmGeneration)"
            )
        if dims is not None and (dims.num_experts == 0 or dims.num_experts % lay.vllm_ep):
            problems.append(f"{vcfg}.expert_parallel_size={lay.vllm_ep} does not divide the {dims.num_experts} experts")
    if dims is not None:
        heads, kv = dims.num_attention_heads, dims.num_key_value_heads
        if heads % lay.vllm_tp or (kv % lay.vllm_tp and lay.vllm_tp % kv):
            problems.append(
                f"{vcfg}.tensor_parallel_size={lay.vllm_tp} must divide the {heads} query heads "
                f"and divide or be a multiple of the {kv} KV heads"
            )
    top_k = ctx.get("policy.generation.top_k")
    # a null top_p is no "off": VllmGeneration compares it with 0 and 1 (TypeError)
    top_p = ctx.cfg["policy"]["generation"]["top_p"] if has(ctx.cfg, "policy.generation.top_p") else 1.0
    if top_k is not None and top_k != -1 and not (type(top_k) is int and top_k >= 1):
        problems.append(f"policy.generation.top_k={top_k!r} is invalid: expected null or -1 (off) or an integer >= 1")
    if type(top_p) not in (int, float) or not 0 < top_p <= 1:
        problems.append(f"policy.generation.top_p={top_p!r} is invalid: expected a fraction in (0, 1] (1.0: off)")
    problems += _val_sampling_problems(ctx)
    share = memory_share_problem(ctx.get(vcfg + ".gpu_memory_utilization"))
    problems += [share] if share else []
    where = "" if lay.colocated else f" on {lay.rollout_gpus} rollout GPUs ({lay.world} train)"
    return Verdict(
        problems, f"{lay.vllm_engines} engine(s) of TP={lay.vllm_tp} PP={lay.vllm_pp} EP={lay.vllm_ep}{where}"
    )


def _val_sampling_problems(ctx: Context) -> list[str]:
    """NeMo-Gym's asserts (``should_use_nemo_gym``) and main's ``grpo.setup()`` rule for ``generation.val_*``."""
    gen, vcfg = "policy.generation.", "policy.generation.vllm_cfg."
    vllm = ctx.get(gen + "backend", "vllm") == "vllm"
    gym = bool(ctx.get("env.should_use_nemo_gym", False))
    if gym and vllm:
        needs = [key for key in ("async_engine", "expose_http_server") if not ctx.get(vcfg + key, False)]
        if needs:
            return [
                f"env.should_use_nemo_gym=true needs {', '.join(f'{vcfg}{key}=true' for key in needs)} "
                "(NeMo-RL's should_use_nemo_gym asserts it in grpo setup())"
            ]
    differ = [
        f"val_{name}={ctx.get(gen + 'val_' + name)!r} vs {name}={ctx.get(gen + name)!r}"
        for name in ("temperature", "top_p", "top_k")
        if has(ctx.cfg, gen + "val_" + name) and ctx.get(gen + "val_" + name) != ctx.get(gen + name)
    ]
    if differ and not (gym and vllm):
        return [
            f"{gen}{', '.join(differ)}: validation sampling that differs from training runs only on NeMo-Gym vLLM "
            "rollouts (env.should_use_nemo_gym=true); NeMo-RL main's grpo setup() asserts it and v0.7.0 ignores the "
            "val_* keys (expected val_temperature: ${.temperature}, val_top_p: ${.top_p}, val_top_k: ${.top_k})"
        ]
    if differ and ctx.get(gen + "val_top_k"):
        return [
            f"{gen}val_top_k={ctx.get(gen + 'val_top_k')!r}: NeMo-Gym rollouts honour only val_temperature and "
            "val_top_p (NeMo-RL main's grpo setup() asserts val_top_k null)"
        ]
    return []
