# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What the simulated rollout engine runs in: format, KV cache, BF16 exclusions.

``format`` (the linear layers; what each is and its vLLM path: ``docs/low_precision.md``, "Formats"): ``bf16``, ``fp8``,
``mxfp8``, ``nvfp4_w4a16`` or ``nvfp4_w4a4``. ``kv_cache``: ``bf16``, ``fp8`` (E4M3, one scale per layer and K/V,
recalibrated after every refit, :mod:`nemo_ais.refit.kv_scales`) or ``nvfp4`` (E2M1 blocks of 16 along the head dim,
global amax calibrated the same way). The weight format's knobs and the BF16 exclusions are the refit's own
(:class:`~nemo_ais.refit.config.WeightFormatFields`). :class:`Fp8RolloutConfig`, the earlier FP8-only config, also reads
``enabled`` (false = ``format: bf16, kv_cache: bf16``) and ``kv_cache_fp8`` (true = ``kv_cache: fp8``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from nemo_ais.formats.base import BF16
from nemo_ais.formats.registry import get_format
from nemo_ais.refit.config import Family, WeightFormatFields
from nemo_ais.refit.kv_scales import KVReduction, kv_field
from nemo_ais.rollout.faults import RefitFault

RolloutFormat = Literal["bf16", "fp8", "mxfp8", "nvfp4_w4a16", "nvfp4_w4a4"]
KVCacheFormat = Literal["bf16", "fp8", "nvfp4"]
ROLLOUT_FORMATS: tuple[str, ...] = RolloutFormat.__args__
KV_CACHE_FORMATS: tuple[str, ...] = KVCacheFormat.__args__
_MIN_ACTIVATION_EPS = 1e-35  # > 448 * 2^-126: eps / 448 is a normal float32


MIN_TEMPERATURE = 1e-5
"""The smallest sampling temperature (vLLM's ``_SAMPLING_EPS``: below it vLLM decodes greedily; logits / T overflow)."""


class RolloutPrecisionConfig(WeightFormatFields):
    """How the twin simulates vLLM's low-precision rollout (module doc)."""

    format: RolloutFormat = Field(
        "fp8",
        description="Linear layers of the decoder: bf16, fp8 (W8A8 blockwise), mxfp8, "
        "nvfp4_w4a16 (NVFP4 weights) or nvfp4_w4a4 (+ NVFP4 activations, static input amax).",
    )
    kv_cache: KVCacheFormat = Field("bf16", description="KV cache: bf16, fp8 (E4M3 per-tensor) or nvfp4 (1x16 blocks).")
    attention_in_bf16: bool = Field(
        False,
        description="Keep every layer's q/k/v/o projections unquantized (NeMo-RL's NVFP4 "
        "real-quant default ignores *self_attn*); the KV cache format still applies.",
    )
    activation_group: int = Field(128, gt=0, description="format fp8: per-token activation group along the hidden dim.")
    activation_family: Family = Field(
        "divide", description="format fp8: activation formula family (vLLM per-token-group's)."
    )
    activation_eps: float = Field(
        1e-10, ge=0.0, description="format fp8: floor of an activation group's amax (0 or >= 1e-35)."
    )

    @field_validator("activation_eps")
    @classmethod
    def _eps_scale_is_normal(cls, eps: float) -> float:
        # 0 is the all-zero group's own rule (scale 1); below 448 x float32's smallest normal (~5.3e-36; 1e-35 with
        # margin) an all-zero group's scale eps / 448 is not a normal float32
        if 0 < eps < _MIN_ACTIVATION_EPS:
            raise ValueError(
                f"expected 0 or >= {_MIN_ACTIVATION_EPS:g} (an all-zero group's scale eps / 448 "
                "would underflow to 0 in float32)"
            )
        return eps

    kv_calibration_reduction: KVReduction = kv_field("reduction")
    kv_calibration_percentile: float = kv_field("percentile")
    kv_calibration_margin: float = kv_field("margin")
    kv_amax_floor: float = kv_field("amax_floor")
    compute_dtype: Literal["float32", "bfloat16", "float64"] | None = Field(
        None, description="Cast the twin to this dtype before quantizing; None keeps the model's."
    )
    error_scale: float = Field(
        1.0,
        ge=0.0,
        le=64.0,
        allow_inf_nan=False,
        description="The mismatch dial k: every fake quantization (weights, activations, KV "
        "cache) returns x + k (q(x) - x). 0 = the BF16 engine exactly, 1 = the format as is.",
    )
    verify_refit: bool = Field(
        True,
        description="Read every refit back (nemo_ais.rollout.readback): each quantized weight "
        "and the KV scales against a correct refit of the sent weights; 0.0 when healthy.",
    )
    refit_fault: RefitFault | None = Field(
        None,
        description="TEST/BENCH ONLY: a planted refit bug (nemo_ais.rollout.faults; refused "
        "unless NEMO_AIS_PLANT_REFIT_FAULT=1).",
    )

    def simulated(self) -> RolloutPrecisionConfig:
        """The config the twin runs: with ``error_scale == 0``, the BF16 engine (bf16 + bf16)."""
        if self.error_scale != 0.0:
            return self
        return self.model_copy(update={"format": "bf16", "kv_cache": "bf16", "error_scale": 1.0})

    @property
    def enabled(self) -> bool:
        """False when nothing is simulated: the twin is then an exact copy (the BF16 arm)."""
        quantized = get_format(self.format) is not BF16 or self.kv_cache != "bf16"
        return quantized or self.compute_dtype is not None

    def _keep_options(self) -> dict:
        return {"attention": self.attention_in_bf16}

    @property
    def kv_cache_fp8(self) -> bool:
        """``kv_cache == "fp8"`` (the earlier config's key)."""
        return self.kv_cache == "fp8"

    @property
    def torch_compute_dtype(self) -> torch.dtype | None:
        """``compute_dtype`` as a ``torch.dtype`` (None = keep the model's dtype)."""
        return None if self.compute_dtype is None else getattr(torch, self.compute_dtype)


class Fp8RolloutConfig(RolloutPrecisionConfig):
    """The earlier FP8 twin config: RolloutPrecisionConfig + ``enabled``, ``kv_cache_fp8``."""

    @model_validator(mode="before")
    @classmethod
    def _translate_former_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not {"enabled", "kv_cache_fp8"} & data.keys():
            return data
        data = dict(data)
        former = {key: data.pop(key) for key in ("enabled", "kv_cache_fp8") if key in data}
        for key, value in former.items():
            if not isinstance(value, bool):
                raise ValueError(f"{key}={value!r} is invalid: expected true or false")
        mixed = sorted({"format", "kv_cache"} & data.keys())
        if mixed:
            raise ValueError(
                f"{' and '.join(sorted(former))} (the former FP8 keys) cannot be combined with "
                f"{' and '.join(mixed)}: use format / kv_cache alone"
            )
        if former.get("kv_cache_fp8"):
            data["kv_cache"] = "fp8"
        if former.get("enabled") is False:
            data.update(format="bf16", kv_cache="bf16", compute_dtype=None)
        return data
