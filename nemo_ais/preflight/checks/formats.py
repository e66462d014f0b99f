# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NVFP4 (W4A16, W4A4) and MXFP8 rollouts with a BF16 trainer: NeMo-RL's switches and shards.

NeMo-RL packs NVFP4 only in its ModelOpt QAT worker (QARL, ``policy.quant_cfg``), so a BF16 trainer needs nemo_ais's
NVFP4 refit (``ais_nvfp4_refit``). Details: docs/cluster.md, "Low-precision rollout formats".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.preflight.loader import get
from nemo_ais.preflight.model_shapes import ModelShape, find_model_shape
from nemo_ais.preflight.nemo_rl_target import NEMO_RL_VERSIONS, ROLLOUT_FORMATS, NeMoRLTarget, target_from_version
from nemo_ais.rules.config_keys import section_enabled
from nemo_ais.rules.format_geometry import GEOMETRY, MX_BLOCK as MXFP8_BLOCK, NVFP4_BLOCK
from nemo_ais.rules.keep_bf16 import KeepInBf16, fp8_engine_exclusions
from nemo_ais.rules.native_kernels import HOPPER, NATIVE_KERNELS

WEIGHT_BYTES = {name: g.weight_bytes for name, g in GEOMETRY.items()} | {"nvfp4": GEOMETRY["nvfp4_w4a4"].weight_bytes}
"""Bytes per weight of a quantized linear in vLLM, per :func:`rollout_format` (``nvfp4``: mode unknown offline)."""

NVFP4_DEFAULT_IGNORE = (
    "lm_head",
    "*output_layer*",
    "*mlp.gate",
    "*router*",
    "*block_sparse_moe.gate*",
    "*self_attention*",
    "*self_attn*",
)
"""NeMo-RL's ``DEFAULT_NVFP4_IGNORE`` (v0.7.0 and main): used when ``real_quant_ignore`` is
absent; attention and the output layer stay BF16."""

_QUANT_CONFIGS = "examples/modelopt/quant_configs/"
NVFP4_QUANT_CFG_MODES = {
    _QUANT_CONFIGS + "nvfp4_a16.yaml": "w4a16",
    _QUANT_CONFIGS + "nvfp4_a16_mlp_only.yaml": "w4a16",
    _QUANT_CONFIGS + "nano3_nvfp4_weightonly.yaml": "w4a16",
    _QUANT_CONFIGS + "nvfp4_experts_weightonly.yaml": "w4a16",
    _QUANT_CONFIGS + "nano3_nvfp4_default.yaml": "w4a4",
    _QUANT_CONFIGS + "nvfp4_experts.yaml": "w4a4",
}
"""NeMo-RL's ModelOpt recipes (paths relative to its checkout) -> the NVFP4 real-quant
mode main resolves them to (NVFP4 weights; + NVFP4 inputs = W4A4). Checked against main's
own resolver in tests/upstream/test_rollout_format_support.py."""

_GEN = "policy.generation"
_VLLM = "policy.generation.vllm_cfg"
_SET_VERSION = "set NEMO_RL_DIR to the NeMo-RL checkout or pass --nemo-rl-version"


def _recipe_mode(quant_cfg: Any) -> str | None:
    """``w4a16`` / ``w4a4`` of a ModelOpt recipe path; None if not known offline."""
    return NVFP4_QUANT_CFG_MODES.get(str(quant_cfg or "").removeprefix("./"))


def rollout_format(cfg: Mapping[str, Any]) -> str:
    """The vLLM rollout's weight format from NeMo-RL's switches.

    ``nvfp4_w4a16`` | ``nvfp4_w4a4`` | ``nvfp4`` (real-quant, mode unknown offline) | ``mxfp8``
    | ``fp8`` (128 x 128 block FP8) | ``bf16``.
    """
    if get(cfg, _GEN + ".real_quant", False):
        mode = _recipe_mode(get(cfg, _GEN + ".quant_cfg"))
        return f"nvfp4_{mode}" if mode else "nvfp4"
    if get(cfg, _VLLM + ".precision") == "fp8":
        return "mxfp8" if get(cfg, _VLLM + ".is_mx", False) else "fp8"
    return "bf16"


def supported_versions(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The supported NeMo-RL versions that run the config's rollout format."""
    support = ROLLOUT_FORMATS.get(rollout_format(cfg))
    return NEMO_RL_VERSIONS if support is None else support.versions


def _selector(cfg: Mapping[str, Any], fmt: str) -> str:
    """The switches that select ``fmt`` (a :data:`ROLLOUT_FORMATS` name), as a reader finds them in the config."""
    return ROLLOUT_FORMATS[fmt].selector.format(quant_cfg=repr(get(cfg, _GEN + ".quant_cfg")))


_WHAT_INSTEAD = {
    "nvfp4_w4a4": "v0.7.0 builds a W4A16 vLLM config whatever the recipe says",
    "mxfp8": "v0.7.0 never reads is_mx and would roll out 128 x 128 block FP8",
}


def _version_problems(cfg: Mapping[str, Any], target: NeMoRLTarget) -> list[str]:
    fmt = rollout_format(cfg)
    support = ROLLOUT_FORMATS.get(fmt)
    if support is None or fmt in target.formats:
        return []
    instead = _WHAT_INSTEAD.get(fmt, "it has no such rollout")
    probe = f"no {support.probe_text!r} in {support.probe_file}"
    return [
        f"{_selector(cfg, fmt)} ({support.label}) needs NeMo-RL "
        f"{' or '.join(support.versions)}; {target.name} lacks it ({probe}; {instead})"
    ]


def _nvfp4_transport_problems(cfg: Mapping[str, Any]) -> list[str]:
    transport = get(cfg, _GEN + ".refit_transport")
    if not get(cfg, _GEN + ".real_quant", False) or transport is None:
        return []
    return [
        f"{_GEN}.refit_transport={transport!r} with {_GEN}.real_quant=true is invalid: expected null (nemo_ais's NVFP4 "
        "refit runs on the default transport; NeMo-RL main's nccl_reshard and sparse transports refuse real_quant)"
    ]


def rollout_format_problems(cfg: Mapping[str, Any], nemo_rl_version: str) -> list[str]:
    """What the launcher refuses before Ray for this NeMo-RL version, one line each.

    A rollout format the version lacks, an NVFP4 MoE refit on v0.7.0, and a real-quant NVFP4
    rollout on a non-default refit transport. ``ValueError`` for an unknown version.
    """
    target = target_from_version(nemo_rl_version)
    return (
        _version_problems(cfg, target)
        + _nvfp4_transport_problems(cfg)
        + _nvfp4_moe_refit_problems(cfg, nemo_rl_version)
    )


def is_moe(cfg: Mapping[str, Any]) -> bool:
    """The policy is a mixture of experts: a known MoE model, or expert parallelism set."""
    shape = find_model_shape(str(get(cfg, "policy.model_name", "")))
    ep = get(cfg, "policy.megatron_cfg.expert_model_parallel_size", 1) or 1
    return bool(shape is not None and shape.num_experts) or int(ep) > 1


def _nvfp4_moe_refit_problems(cfg: Mapping[str, Any], version: str) -> list[str]:
    """v0.7.0 re-processes only dense NVFP4 layers after a refit: no NVFP4 MoE refit there."""
    refit = get(cfg, "ais_nvfp4_refit")
    if version != "v0.7.0" or not refit or not refit.get("enabled", True) or not is_moe(cfg):
        return []
    return [
        f"ais_nvfp4_refit with an MoE policy ({get(cfg, 'policy.model_name')!r}) is invalid on NeMo-RL v0.7.0: its "
        "ModelOpt reload re-processes dense NVFP4 layers only, so the experts would keep their first weights after "
        "every refit; expected NeMo-RL main, or a dense model"
    ]


@check("rollout_gpu")
def check_rollout_gpu(ctx: Context) -> Verdict | None:
    """The GPU generation the rollout format needs (the configs target Hopper): a warning."""
    fmt = rollout_format(ctx.cfg)
    need = NATIVE_KERNELS.get(fmt)
    if need is None:
        return None
    if need.min_capability <= HOPPER:
        return Verdict(detail=f"{fmt} runs natively from compute capability {need.min_text}")
    return Verdict(
        warnings=[
            f"{_selector(ctx.cfg, fmt)} ({fmt}) needs GPUs of compute capability >= {need.min_text} ({need.gpus}); on "
            f"H100 / H200 (9.0) vLLM runs {need.fallback} instead, and the launcher refuses that when the engines start"
        ]
    )


@check("rollout_format")
def check_rollout_format(ctx: Context) -> Verdict | None:
    """An NVFP4 / MXFP8 rollout only on a NeMo-RL version that has it (warns if unknown)."""
    fmt = rollout_format(ctx.cfg)
    support = ROLLOUT_FORMATS.get(fmt)
    if support is None:  # bf16, block fp8, or an NVFP4 recipe whose mode is unknown
        return None
    runs_on = f"{support.label}: NeMo-RL {', '.join(support.versions)}"
    if ctx.nemo_rl is None:
        if set(support.versions) == set(NEMO_RL_VERSIONS):
            return Verdict(detail=f"{runs_on} (every supported version)")
        return Verdict(
            detail=runs_on,
            warnings=[
                f"{_selector(ctx.cfg, fmt)} needs NeMo-RL {' or '.join(support.versions)}; "
                f"{ctx.nemo_rl_detail}: not checked ({_SET_VERSION})"
            ],
        )
    return Verdict(_version_problems(ctx.cfg, ctx.nemo_rl), f"{runs_on}; {ctx.nemo_rl_detail}")


def _real_quant_problems(ctx: Context) -> list[str]:
    """What NeMo-RL (and a BF16 or QARL trainer) need around ``real_quant: true``."""
    problems = []
    if not get(ctx.cfg, _GEN + ".quant_cfg"):
        problems.append(
            f"{_GEN}.real_quant=true needs {_GEN}.quant_cfg: a ModelOpt NVFP4 recipe, e.g. "
            f"{_QUANT_CONFIGS}nvfp4_a16.yaml (without it NeMo-RL picks the plain vLLM worker "
            "and rolls out BF16; main raises 'requires a non-empty quant_cfg')"
        )
    if ctx.get(_GEN + ".backend", "vllm") != "vllm":
        problems.append(f"{_GEN}.real_quant=true needs {_GEN}.backend='vllm'")
    if ctx.get(_VLLM + ".precision") == "fp8":
        problems.append(
            f"{_GEN}.real_quant=true with {_VLLM}.precision='fp8' is invalid: expected "
            "bfloat16 (NVFP4 replaces the FP8 quantization; both would set vLLM's quantization)"
        )
    offload = ctx.get(_GEN + ".real_quant_export_cpu_offload")
    main_may_run = ctx.nemo_rl is None or "nvfp4_w4a4" in ctx.nemo_rl.formats
    if main_may_run and not isinstance(offload, bool):
        problems.append(
            f"{_GEN}.real_quant_export_cpu_offload={offload!r} is invalid: expected true or false (NeMo-RL main's "
            "configure_generation_config raises 'must be a boolean'; v0.7.0 ignores it)"
        )
    problems += _nvfp4_transport_problems(ctx.cfg)
    refit = ctx.get("ais_nvfp4_refit")
    qarl = ctx.get("policy.quant_cfg") is not None  # its QAT worker packs NVFP4: check_qarl_trainer
    if not qarl and section_enabled(refit):
        problems += _nvfp4_refit_problems(ctx.cfg, refit)
    elif not qarl:
        problems.append(
            f"ais_nvfp4_refit.enabled is {None if refit is None else refit.get('enabled')!r}: expected true with a "
            "BF16 trainer (NeMo-RL packs NVFP4 only in its ModelOpt QAT worker; its BF16 worker streams [out, in] BF16 "
            "weights that vLLM's NVFP4 parameters, uint8 [out, in/2] + scales, cannot load: nemo_ais's NVFP4 refit "
            "quantizes them in the vLLM workers)"
        )
    experts = ctx.shape is not None and ctx.shape.num_experts > 0
    if experts and ctx.layout.vllm_ep > 1:
        problems.append(
            f"{_VLLM}.expert_parallel_size={ctx.layout.vllm_ep} with {_GEN}.real_quant=true is invalid: expected 1 "
            "(NeMo-RL main's fused-MoE real-quant refit needs every expert on every vLLM rank)"
        )
    return problems


def reads_input_amax_file(refit: Any) -> bool:
    """``ais_nvfp4_refit`` is on and its format streams static input scales (W4A4): the job reads its amax file.

    The driver and every vLLM worker read ``input_amax_file``; an unset format is BlockSyncConfig's default.
    """
    fmt = refit.get("format", "nvfp4_w4a16") if section_enabled(refit) else None
    return isinstance(fmt, str) and fmt in GEOMETRY and GEOMETRY[fmt].static_input_amax


def _nvfp4_refit_problems(cfg: Mapping[str, Any], refit: Mapping[str, Any]) -> list[str]:
    """The ``ais_nvfp4_refit`` format matches the engine's; W4A4 has its input amax."""
    problems = []
    fmt = refit.get("format", "nvfp4_w4a16")  # BlockSyncConfig's default (as reads_input_amax_file)
    quant_cfg = get(cfg, _GEN + ".quant_cfg")
    mode = _recipe_mode(quant_cfg)
    if mode is not None and fmt != f"nvfp4_{mode}":
        problems.append(
            f"ais_nvfp4_refit.format={fmt!r} is invalid with {_GEN}.quant_cfg={quant_cfg!r}: expected 'nvfp4_{mode}' "
            "(the refit must stream the tensors of the NVFP4 mode vLLM is built in; W4A4 linears also take input_scale)"
        )
    if reads_input_amax_file(refit) and not refit.get("input_amax_file"):
        problems.append(
            f"ais_nvfp4_refit.input_amax_file={refit.get('input_amax_file')!r} is invalid with format {fmt!r}: "
            "expected a JSON file {module or fused group: calibrated input amax} (a BF16 trainer has no input "
            "quantizer; the refit streams input_scale = amax / (6 * 448))"
        )
    return problems


def _missing_job_file(ctx: Context, path: str) -> str | None:
    """Where ``path`` was looked for, if it is not a file there (None: it is); relative: under the job's dir."""
    if Path(path).is_absolute():
        candidate, where = Path(path), "on this node"
    elif ctx.job_dir is None:
        candidate, where = Path(path), "here (set NEMO_RL_DIR: a relative path resolves where the job runs)"
    else:
        candidate, where = Path(ctx.job_dir) / path, f"under NEMO_RL_DIR={ctx.job_dir}, where the job runs"
    return None if candidate.is_file() else where


@check("nvfp4_rollout")
def check_nvfp4_rollout(ctx: Context) -> Verdict | None:
    """Real-quant NVFP4: a recipe, BF16 precision, a BF16 trainer, nemo_ais's NVFP4 refit."""
    real_quant = ctx.get(_GEN + ".real_quant", False)
    quant_cfg = ctx.get(_GEN + ".quant_cfg")
    if not real_quant and quant_cfg is None:
        return None
    problems, warnings = [], []
    qarl = ctx.get("policy.quant_cfg") is not None
    if not real_quant:
        why = (
            "a fake-quant rollout is not the NVFP4-kernel format the comparison arms run"
            if qarl
            else "which load weights folded by NeMo-RL's QAT worker (policy.quant_cfg)"
        )
        problems.append(
            f"{_GEN}.quant_cfg={quant_cfg!r} without {_GEN}.real_quant=true selects ModelOpt fake-quant rollouts "
            f"({why}): expected {_GEN}.real_quant=true (NVFP4 kernels) or {_GEN}.quant_cfg=null"
        )
        return Verdict(problems)
    problems += _real_quant_problems(ctx)
    refit = ctx.get("ais_nvfp4_refit")
    amax_file = refit.get("input_amax_file") if section_enabled(refit) else None
    if isinstance(amax_file, str) and amax_file and (missing := _missing_job_file(ctx, amax_file)):
        warnings.append(
            f"ais_nvfp4_refit.input_amax_file={amax_file!r} is not a file {missing}: the launcher reads it before "
            "Ray (nemo-ais calibrate-input-amax writes it)"
        )
    moe_refit = _nvfp4_moe_refit_problems(ctx.cfg, "v0.7.0")
    if ctx.nemo_rl is not None and "nvfp4_w4a4" not in ctx.nemo_rl.formats:  # v0.7.0's reload
        problems += moe_refit
    elif ctx.nemo_rl is None and moe_refit:
        warnings.append(
            "ais_nvfp4_refit with an MoE policy needs NeMo-RL main (v0.7.0 re-processes dense "
            f"NVFP4 layers only after a refit); {ctx.nemo_rl_detail}: not checked"
        )
    mode = _recipe_mode(quant_cfg)
    if mode is None and quant_cfg:
        warnings.append(
            f"{_GEN}.quant_cfg={quant_cfg!r} is not one of NeMo-RL's recipes whose NVFP4 mode "
            "is known offline: main derives W4A16 / W4A4 from its quantizers when the engine "
            "starts (resolve_nvfp4_real_quant_mode); v0.7.0 always rolls out W4A16"
        )
    ignore = ctx.get(_GEN + ".real_quant_ignore")
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(p, str) for p in ignore)):
        problems.append(f"{_GEN}.real_quant_ignore={ignore!r} is invalid: expected a list of module-name patterns")
        ignore = None
    kept = "NeMo-RL's default" if ignore is None else f"{len(ignore)} pattern(s)"
    trainer = "ModelOpt QAT trainer (QARL), refit by NeMo-RL" if qarl else "BF16 trainer, refit by nemo_ais"
    return Verdict(
        problems, f"NVFP4 {(mode or 'mode unknown').upper()} real-quant, {trainer}; real_quant_ignore: {kept}", warnings
    )


def _qarl_rollout_problems(ctx: Context, quant_cfg: Any) -> list[str]:
    """The rollout a QARL trainer feeds: the same recipe, packed by NeMo-RL's worker."""
    problems = []
    rollout_cfg = ctx.get(_GEN + ".quant_cfg")
    same = str(rollout_cfg or "").removeprefix("./") == str(quant_cfg).removeprefix("./")
    if ctx.get(_GEN + ".real_quant", False) and not same:
        problems.append(
            f"{_GEN}.quant_cfg={rollout_cfg!r} is invalid with policy.quant_cfg={quant_cfg!r}: expected the same "
            "recipe (QARL: the rollout runs the trainer's quantization; NeMo-RL main raises 'Real-quant refit requires "
            "matching policy and generation quantization modes')"
        )
    enabled = [s for s in ("ais_nvfp4_refit", "ais_fp8_refit") if section_enabled(ctx.get(s))]
    return problems + [
        f"{section}.enabled=True is invalid with policy.quant_cfg={quant_cfg!r}: expected false "
        "(NeMo-RL's QAT worker exports the rollout's weights itself: packed NVFP4 for a "
        "real-quant rollout, weight_quantizer(weight) otherwise)"
        for section in enabled
    ]


@check("qarl_trainer")
def check_qarl_trainer(ctx: Context) -> Verdict | None:
    """``policy.quant_cfg``: NeMo-RL's ModelOpt QAT Megatron worker (QARL) under the AIS worker."""
    quant_cfg = ctx.get("policy.quant_cfg")
    if quant_cfg is None:
        return None
    problems, warnings = [], []
    if not ctx.get("policy.megatron_cfg.enabled", False):
        problems.append(
            f"policy.quant_cfg={quant_cfg!r} needs policy.megatron_cfg.enabled=true (NeMo-RL's "
            "DTensor ModelOpt workers raise NotImplementedError; nemo_ais wraps the Megatron one)"
        )
    fusion = ctx.get("policy.megatron_cfg.gradient_accumulation_fusion", True)
    if fusion is not False:
        problems.append(
            f"policy.megatron_cfg.gradient_accumulation_fusion={fusion!r} is invalid with policy.quant_cfg: expected "
            "false (NeMo-RL's MegatronQuantPolicyWorker asserts it; absent means Megatron-Bridge's default, true)"
        )
    problems += _qarl_rollout_problems(ctx, quant_cfg)
    mode = _recipe_mode(quant_cfg)
    if mode is None:
        warnings.append(
            f"policy.quant_cfg={quant_cfg!r} is not one of NeMo-RL's NVFP4 recipes known "
            "offline: its format is not checked against the rollout's"
        )
    return Verdict(
        problems,
        f"ModelOpt fake-quant Megatron trainer ({(mode or 'mode unknown').upper()}, "
        f"{quant_cfg}) under nemo_ais's AIS worker (QARL)",
        warnings,
    )


@check("mxfp8_rollout")
def check_mxfp8_rollout(ctx: Context) -> Verdict | None:
    """MXFP8: ``precision: fp8``; power-of-two scaling factors not switched off."""
    if not ctx.get(_VLLM + ".is_mx", False):
        return None
    problems = []
    precision = ctx.get(_VLLM + ".precision")
    if precision != "fp8":
        problems.append(
            f"{_VLLM}.is_mx=true with {_VLLM}.precision={precision!r} is invalid: expected "
            "'fp8' (NeMo-RL main's init_fp8 raises 'is_mx=True requires precision=fp8')"
        )
    for key in ("pow2_weight_scaling_factors", "pow2_activation_scaling_factors"):
        if ctx.get(f"{_VLLM}.{key}") is False:
            problems.append(
                f"{_VLLM}.{key}=false with {_VLLM}.is_mx=true is invalid: expected true "
                "(MXFP8 scales are powers of two; NeMo-RL main's init_fp8 raises)"
            )
    kws = ctx.get(_VLLM + ".quantization_ignored_layer_kws") or []
    kept = f"BF16 where a name holds {list(kws)}" if kws else "every decoder linear MXFP8"
    return Verdict(problems, f"MXFP8 (E4M3, one UE8M0 scale per 32), quantized by NeMo-RL; {kept}")


class QuantizedLinear(NamedTuple):
    """One decoder linear of a vLLM TP rank: its HF names and its input dim K per rank."""

    module: str  # "qkv_proj", "o_proj", "gate_up_proj", "down_proj" (experts: "experts ...")
    names: tuple[str, ...]  # HF module names in layer {i} (a fused vLLM module: its parts)
    k: float  # input elements per rank (a float when TP does not divide it)
    formula: str  # how k is computed, with the numbers
    params: float  # weights per rank in one layer (every expert of the rank)


def quantized_linears(shape: ModelShape, tp: int, ep: int) -> list[QuantizedLinear]:
    """The decoder linears a low-precision format quantizes, with K per vLLM TP rank.

    Column-parallel layers (q/k/v, gate/up) keep K = hidden whole; row-parallel layers split it: o_proj ``heads x
    head_dim / TP``, down_proj ``intermediate / TP`` (MoE: ``moe_intermediate / TP``, whole per expert with vLLM EP).
    """
    layer, hidden = "model.layers.{i}.", shape.hidden_size
    q_dim = shape.num_attention_heads * shape.head_dim
    kv_dim = shape.num_key_value_heads * shape.head_dim
    linears = [
        QuantizedLinear(
            "qkv_proj",
            tuple(f"{layer}self_attn.{p}_proj" for p in "qkv"),
            hidden,
            f"hidden_size = {hidden}",
            hidden * (q_dim + 2 * kv_dim) / tp,
        ),
        QuantizedLinear(
            "o_proj",
            (f"{layer}self_attn.o_proj",),
            q_dim / tp,
            f"heads x head_dim / TP = {shape.num_attention_heads} x {shape.head_dim} / {tp}",
            q_dim * hidden / tp,
        ),
    ]
    if shape.num_experts:  # vLLM expert parallelism: whole experts, split over EP ranks
        expert_tp, split = (1, ep) if ep > 1 else (tp, tp)
        mlp, inner, n = f"{layer}mlp.experts.0.", shape.moe_intermediate_size, shape.num_experts
        prefix, what = "experts ", f"moe_intermediate / {'EP: whole' if ep > 1 else 'TP'}"
    else:
        expert_tp, split, mlp, inner, n = tp, tp, f"{layer}mlp.", shape.intermediate_size, 1
        prefix, what = "", "intermediate / TP"
    linears += [
        QuantizedLinear(
            prefix + "gate_up_proj",
            (f"{mlp}gate_proj", f"{mlp}up_proj"),
            hidden,
            f"hidden_size = {hidden}",
            n * 2 * hidden * inner / split,
        ),
        QuantizedLinear(
            prefix + "down_proj",
            (f"{mlp}down_proj",),
            inner / expert_tp,
            f"{what} = {inner} / {expert_tp}",
            n * inner * hidden / split,
        ),
    ]
    return linears


def kept_in_bf16(cfg: Mapping[str, Any], num_layers: int) -> Callable[[str], bool]:
    """``HF module name -> True`` where the config's rollout keeps a linear BF16.

    :class:`~nemo_ais.rules.keep_bf16.KeepInBf16` (the twin's and the refit's rule) with the exclusions NeMo-RL's
    engine applies: ModelOpt's real-quant engine (NVFP4) ``real_quant_ignore`` (its default list when absent); NeMo-RL's
    FP8 engine (block FP8 and MXFP8, ``init_fp8``) the first / last layers and ``quantization_ignored_layer_kws``
    (tests/adapters/test_preflight_bf16_layers.py). BF16 rollout: every linear.
    """
    if rollout_format(cfg) == "bf16":
        return lambda name: True
    if get(cfg, _GEN + ".real_quant", False):
        ignore = get(cfg, _GEN + ".real_quant_ignore")
        rule = KeepInBf16(ignore=NVFP4_DEFAULT_IGNORE if ignore is None else tuple(ignore))
    else:
        engine = fp8_engine_exclusions(get(cfg, _VLLM) or {})
        rule = KeepInBf16(
            first_layers=int(engine["num_first_layers_in_bf16"] or 0),
            last_layers=int(engine["num_last_layers_in_bf16"] or 0),
            num_layers=num_layers,
            keywords=engine["ignored_layer_kws"],
        )
    return rule.keeps


def _shard_verdict(ctx: Context, block: int, why: str) -> Verdict:
    """K % block of every linear some layer quantizes; the detail names the checked ones."""
    assert ctx.shape is not None  # needs_shape
    lay, layers = ctx.layout, range(ctx.shape.num_layers)
    bf16 = kept_in_bf16(ctx.cfg, ctx.shape.num_layers)
    problems, checked = [], []
    for lin in quantized_linears(ctx.shape, lay.vllm_tp, lay.vllm_ep):
        if all(bf16(n.format(i=i)) for n in lin.names for i in layers):
            continue  # BF16 in every layer: no block constraint
        checked.append(lin.module)
        if lin.k != int(lin.k) or int(lin.k) % block:
            problems.append(
                f"{_VLLM}.tensor_parallel_size={lay.vllm_tp}: {lin.module} in = {lin.formula} = {lin.k:g} is not "
                f"divisible by {block}: expected a multiple of {block} per TP rank ({why})"
            )
    return Verdict(
        problems, f"{', '.join(checked) or 'no linear'}: input dims at TP={lay.vllm_tp} are multiples of {block}"
    )


@check("vllm_nvfp4_shards", needs_shape=True)
def check_vllm_nvfp4_shards(ctx: Context) -> Verdict | None:
    """NVFP4: every quantized linear's input dim per vLLM TP rank is a multiple of 16."""
    if not rollout_format(ctx.cfg).startswith("nvfp4"):
        return None
    return _shard_verdict(ctx, NVFP4_BLOCK, "one E4M3 scale per 16 inputs; vLLM refuses input_size_per_partition % 16")


@check("vllm_mxfp8_shards", needs_shape=True)
def check_vllm_mxfp8_shards(ctx: Context) -> Verdict | None:
    """MXFP8: every quantized linear's input dim per vLLM TP rank is a multiple of 32."""
    if rollout_format(ctx.cfg) != "mxfp8":
        return None
    return _shard_verdict(ctx, MXFP8_BLOCK, "one UE8M0 scale per 32 inputs")
