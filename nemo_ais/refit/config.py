# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What a refit sends to vLLM: :class:`RefitConfig` (``ais_fp8_refit`` / ``ais_nvfp4_refit``). Torch-free.

:class:`Fp8SyncConfig` and :class:`BlockSyncConfig` are its per-engine forms; :func:`section_config` reads either
section with the engine's defaults and :func:`kv_calibration_reduction` the ``ais_kv_calibration`` section, for the
NeMo-RL entry point and the offline check alike (:mod:`nemo_ais.preflight` imports this module only). :class:`WeightFormatFields` holds what a
rollout's weight format is (the format's knobs and the BF16 exclusions): the refit's config and the simulated engine's
(:class:`~nemo_ais.rollout.config.RolloutPrecisionConfig`) both derive from it, so each knob has one name, one default
and one check in both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from nemo_ais.rules.config_keys import get
from nemo_ais.rules.format_geometry import Fp8Family, refuse_renamed_family, te_refuses
from nemo_ais.rules.keep_bf16 import KeepInBf16, check_regexes, fp8_engine_exclusions
from nemo_ais.sections import validate_section

Family = Annotated[Fp8Family, BeforeValidator(refuse_renamed_family)]  # a config's family: a former letter refused
KVReduction = Literal["percentile_of_amax", "element_percentile"]
KV_REDUCTIONS: tuple[str, ...] = KVReduction.__args__

RENAMED_KEYS = {
    "weight_block": "block",
    "weight_family": "family",
    "weight_eps": "eps",
    "nvfp4_weight_rows_per_block": "nvfp4_rows_per_block",
}
"""The simulated engine's former names of the weight-format knobs -> their one name."""


class KeepInBf16Fields(BaseModel):
    """The BF16 exclusions the twin's and the refit's configs share, and their rule."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    num_first_layers_in_bf16: int = Field(0, ge=0, description="Keep decoder layers [0, n) in BF16 (NeMo-RL key).")
    num_last_layers_in_bf16: int = Field(0, ge=0, description="Keep the last n decoder layers in BF16 (NeMo-RL key).")
    keep_patterns: tuple[str, ...] = Field(
        (), description="Regexes (re.search on the HF name) of extra linears kept in BF16."
    )

    @field_validator("keep_patterns")
    @classmethod
    def _compile_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_regexes(patterns, "keep_patterns")

    def keep_rule(self) -> KeepInBf16:
        """The keep-in-BF16 rule of this config (:mod:`nemo_ais.rules.keep_bf16`)."""
        return KeepInBf16(
            first_layers=self.num_first_layers_in_bf16,
            last_layers=self.num_last_layers_in_bf16,
            patterns=self.keep_patterns,
            **self._keep_options(),
        )

    def _keep_options(self) -> dict:
        return {}


class WeightFormatFields(KeepInBf16Fields):
    """The weight format's knobs, shared by the refit and the simulated engine (module doc).

    ``format`` is each subclass's own (the simulated engine also runs ``bf16``); knobs of another format are ignored.
    """

    block: tuple[int, int] = Field((128, 128), description="fp8: weight tile [out, in]; vLLM block-FP8 uses 128x128.")
    family: Family = Field(
        "reciprocal",
        description="fp8: weight scale formula family (formats.fp8_block.FAMILY_FORMULAS): "
        "reciprocal (what vLLM itself uses), divide or multiplier (TE, NeMo-RL).",
    )
    ue8m0: bool = Field(False, description="fp8: power-of-two (UE8M0, DeepGEMM) scales.")
    eps: float = Field(1e-4, ge=0.0, description="fp8: floor of a weight tile's amax.")
    nvfp4_rows_per_block: Literal[1, 16] = Field(
        1,
        description="NVFP4 weight blocks: 1 = 1x16 (ModelOpt export), 16 = Transformer "
        "Engine's 16x16 tiles (still valid 1x16 NVFP4).",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed(cls, data: object) -> object:
        if isinstance(data, dict):
            old = next((k for k in RENAMED_KEYS if k in data), None)
            if old is not None:
                raise ValueError(
                    f"{old} was renamed {RENAMED_KEYS[old]} (one name for the simulated engine and the refit): write "
                    f"{RENAMED_KEYS[old]}={data[old]!r}"
                )
        return data

    @field_validator("block")
    @classmethod
    def _positive_block(cls, block: tuple[int, int]) -> tuple[int, int]:
        if min(block) <= 0:
            raise ValueError(f"expected two positive ints (vLLM block FP8 uses (128, 128)), got {block}")
        return block

    @property
    def weight_block(self) -> tuple[int, int]:
        """The ``(out, in)`` block of one scale: ``block`` for fp8, else the format's."""
        from nemo_ais.formats.registry import get_format  # torch: only where a refit runs

        fmt = get_format(self.format)
        return tuple(self.block) if fmt.pads else fmt.block


class RefitConfig(WeightFormatFields):
    """Which weights the refit stream quantizes, to which format, and how (module doc)."""

    enabled: bool = Field(True, description="Quantize at all; False passes every tensor through.")
    format: Literal["fp8", "nvfp4_w4a16", "nvfp4_w4a4", "mxfp8"] = Field(
        "fp8",
        description="The engine's weight format: fp8 (W8A8 block FP8), NVFP4 weights with "
        "BF16 (nvfp4_w4a16) or NVFP4 (nvfp4_w4a4, + input_scale) activations, or mxfp8.",
    )
    num_layers: int | None = Field(None, ge=1, description="Decoder layer count; required by num_last_layers_in_bf16.")
    ignore: tuple[str, ...] = Field(
        (),
        description="ModelOpt real-quant fnmatch patterns kept in BF16, as NeMo-RL's "
        "policy.generation.real_quant_ignore (its default keeps attention, lm_head and "
        "routers); matched on the name, without .weight, and with 'model.' toggled.",
    )
    ignored_layer_kws: tuple[str, ...] = Field(
        (), description="Substrings of names kept in BF16, as NeMo-RL's vllm_cfg.quantization_ignored_layer_kws."
    )
    tp_size: int = Field(1, ge=1, description="vLLM tensor-parallel size (shard check).")
    check_finite: bool = Field(True, description="Also refuse NaN/Inf in tensors kept in BF16 (one extra pass).")
    head_dim: int | None = Field(
        None,
        ge=1,
        description="Attention head dim; if set, K/V with fewer KV heads than tp_size are "
        "checked as replicated (one head per rank), as vLLM does. The NeMo-RL refit hook sets it from the "
        "engine's model config when left None.",
    )
    expert_tp_size: int | None = Field(
        None,
        ge=1,
        description="vLLM tensor-parallel size of MoE expert weights (shard check): 1 with vLLM expert "
        "parallelism (each expert whole on one rank; the NeMo-RL refit hook sets it from "
        "vllm_cfg.expert_parallel_size > 1); None: tp_size.",
    )
    backend: Literal["auto", "torch", "te"] = Field(
        "auto",
        description="fp8 quantizer: 'auto' = Transformer Engine when importable, on CUDA and "
        "family 'multiplier' with 128x128 tiles (same bits as the torch reference), else torch; "
        "'te' requires TE (pip install 'nemo-ais[te]'), 'torch' never uses it.",
    )
    mxfp8_zero_scale_byte: Literal[0, 1] = Field(
        1,
        description="E8M0 byte of an all-zero MXFP8 block: 1 = NeMo-RL main's rewrite "
        "(TRT-LLM rejects 0), 0 = what FlashInfer emits. Byte 0 is also the scale of a "
        "nonzero block with amax < 448 * 2^-127, which byte 1 decodes at twice its value.",
    )
    mxfp8_scale_name: Literal["weight_scale", "weight_scale_from_checkpoint"] | None = Field(
        None,
        description="Name of the MXFP8 scale: weight_scale (vLLM's checkpoint loader) or "
        "weight_scale_from_checkpoint (NeMo-RL main's MXFP8 refit); None = weight_scale in "
        "the stream, weight_scale_from_checkpoint in the NeMo-RL refit hook.",
    )
    max_open_groups: int = Field(
        2,
        ge=1,
        description="Fused groups (q/k/v, gate/up) whose shards the stream may hold at once "
        "(memory bound); more means the tensors arrive interleaved across layers.",
    )
    num_experts: int | None = Field(
        None,
        ge=1,
        description="Routed experts per MoE layer (the model's num_experts): the stream "
        "quantizes the experts of one layer and projection as one [E, N, K] stack, one "
        "quantizer call (it then holds one layer's experts); None: one expert at a time.",
    )
    input_amax_file: str | None = Field(
        None,
        description="JSON {module or fused group name: calibrated input amax} for "
        "nvfp4_w4a4 in the NeMo-RL refit hook (the stream takes input_amax directly).",
    )

    @model_validator(mode="after")
    def _te_implements_multiplier(self) -> RefitConfig:
        refused = te_refuses(self.family, self.block) if self.backend == "te" else None
        if refused is not None:
            raise ValueError(f"{refused} (use backend 'auto' or 'torch' for the others)")
        return self

    @model_validator(mode="after")
    def _last_layers_need_count(self) -> RefitConfig:
        if self.num_last_layers_in_bf16 and self.num_layers is None:
            raise ValueError(
                f"num_last_layers_in_bf16={self.num_last_layers_in_bf16} needs num_layers "
                "(the stream sees one tensor at a time and cannot count the layers)"
            )
        return self

    def _keep_options(self) -> dict:
        return {"num_layers": self.num_layers, "keywords": self.ignored_layer_kws, "ignore": self.ignore}


class Fp8SyncConfig(RefitConfig):
    """:class:`RefitConfig` of a block-FP8 engine (``format`` fixed to ``fp8``)."""

    format: Literal["fp8"] = Field("fp8", description="Block FP8 (W8A8).")


class BlockSyncConfig(RefitConfig):
    """:class:`RefitConfig` of an NVFP4 / MXFP8 engine (default ``nvfp4_w4a16``)."""

    format: Literal["nvfp4_w4a16", "nvfp4_w4a4", "mxfp8"] = Field(
        "nvfp4_w4a16",
        description="The engine's weight format: NVFP4 weights with BF16 (w4a16) or NVFP4 "
        "(w4a4, + input_scale) activations, or MXFP8 (W8A8).",
    )


SECTIONS: dict[str, type[RefitConfig]] = {"ais_fp8_refit": Fp8SyncConfig, "ais_nvfp4_refit": BlockSyncConfig}
"""NeMo-RL config section -> its refit config class."""


def section_config(
    config: Mapping[str, Any], section: str, default_ignore: Callable[[], Sequence[str]]
) -> RefitConfig | None:
    """``config[section]`` (one of :data:`SECTIONS`) as its refit config, enabled or not; None when absent.

    Defaults come from the engine config (``tp_size``, ``expert_tp_size``; FP8: ``ue8m0`` and
    :func:`~nemo_ais.rules.keep_bf16.fp8_engine_exclusions`; NVFP4: ``ignore`` from
    ``policy.generation.real_quant_ignore``, else ``default_ignore()``, NeMo-RL's list), so the stream keeps in BF16
    what vLLM keeps.

    Raises:
        ValueError: naming the field (an unknown section or key, a bad value); TypeError: a section that is not a
            mapping.
    """
    if section not in SECTIONS:
        raise ValueError(f"section={section!r} is invalid: expected one of {sorted(SECTIONS)}")
    raw = config.get(section)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TypeError(f"{section}: expected a mapping of fields, got {type(raw).__name__}")
    generation = get(config, "policy.generation", {})
    vllm_cfg = get(generation, "vllm_cfg", {})
    engine: dict[str, Any] = {"tp_size": vllm_cfg.get("tensor_parallel_size", 1)}
    if (vllm_cfg.get("expert_parallel_size") or 1) > 1:  # vLLM's enable_expert_parallel: experts whole on a rank
        engine["expert_tp_size"] = 1
    if section == "ais_fp8_refit":
        engine["ue8m0"] = vllm_cfg.get("pow2_weight_scaling_factors", False)
        engine.update(fp8_engine_exclusions(vllm_cfg))
    elif "ignore" not in raw:
        ignore = generation.get("real_quant_ignore")
        if ignore is not None and not (isinstance(ignore, list | tuple) and all(isinstance(p, str) for p in ignore)):
            raise ValueError(
                f"policy.generation.real_quant_ignore={ignore!r} is invalid: expected a list of module-name patterns"
            )
        engine["ignore"] = tuple(default_ignore() if ignore is None else ignore)
    return validate_section(SECTIONS[section], {**engine, **raw}, section)


def kv_calibration_reduction(config: Mapping[str, Any]) -> KVReduction:
    """The FP8 KV calibration rule of ``config["ais_kv_calibration"]`` (absent: ``percentile_of_amax``, NeMo-RL's).

    Raises:
        ValueError: naming ``ais_kv_calibration`` / ``ais_kv_calibration.reduction``.
    """
    section = config.get("ais_kv_calibration")
    section = {} if section is None else section
    if not isinstance(section, Mapping) or set(section) - {"reduction"}:
        raise ValueError(
            f"ais_kv_calibration={section!r} is invalid: expected a mapping with the one key "
            f"reduction ({' or '.join(KV_REDUCTIONS)})"
        )
    reduction = section.get("reduction") or KV_REDUCTIONS[0]
    if reduction not in KV_REDUCTIONS:
        raise ValueError(
            f"ais_kv_calibration.reduction={reduction!r} is invalid: expected one of "
            f"{list(KV_REDUCTIONS)} (percentile_of_amax is NeMo-RL's rule)"
        )
    return reduction


def read_input_amax_file(path: str | Path) -> dict[str, float]:
    """``{module or fused group: amax}`` of an ``input_amax_file`` (``nemo-ais calibrate-input-amax`` writes it).

    Raises:
        ValueError: naming the file: unreadable, not JSON, not an object, or a value that is not one finite
            number >= 0 (the key is named).
    """
    path = Path(path)
    expected = "expected a JSON object {module or fused group name: calibrated input amax}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"input_amax_file {path}: cannot read it ({err}); {expected}") from None
    if not isinstance(data, dict):
        raise ValueError(f"input_amax_file {path}: got a JSON {type(data).__name__}; {expected}")
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"input_amax_file {path}: {key!r} is {value!r}, expected one finite number >= 0 (its input amax)"
            )
    return {key: float(value) for key, value in data.items()}
