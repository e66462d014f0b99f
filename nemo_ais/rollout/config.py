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
"""What the simulated rollout engine runs in: format, KV cache, BF16 exclusions.

:class:`RolloutPrecisionConfig` is the twin's config. One ``format`` for the decoder
layers' linear layers, one ``kv_cache`` format, the exclusions that keep modules in high
precision, and each format's knobs (docs/low_precision.md, "Twin"):

=================  ==========================================================  ==========
``format``         linear layers (weights / activations)                        vLLM path
=================  ==========================================================  ==========
``bf16``           unquantized (with ``kv_cache: bf16``: the BF16 arm, exact)   BF16
``fp8``            W8A8 E4M3, 128x128 weight tiles, 1x128 dynamic act groups    ``precision: fp8``
``mxfp8``          W8A8 MXFP8: E4M3 + UE8M0 per 32 (weights and activations)    ``is_mx``
``nvfp4_w4a16``    NVFP4 weights (1x16, or TE's 16x16 tiles), BF16 activations  ModelOpt W4A16
``nvfp4_w4a4``     NVFP4 weights and activations, static calibrated input amax  ModelOpt NVFP4
=================  ==========================================================  ==========

``kv_cache``: ``bf16``; ``fp8`` (E4M3, one scale per layer and K/V, recalibrated after
every refit by ``kv_calibration_reduction``: NeMo-RL's rule by default, see
:mod:`nemo_ais.refit.kv_scales`); ``nvfp4`` (E2M1 in blocks of 16 along the head dim with E4M3 block scales,
the global amax per layer and K/V calibrated the same way).

:class:`Fp8RolloutConfig` is the earlier FP8-only config, kept working: a subclass that
also accepts its two former keys ``enabled`` and ``kv_cache_fp8`` and translates them
(``enabled: false`` = ``format: bf16, kv_cache: bf16`` with ``compute_dtype`` dropped, as
before; ``kv_cache_fp8: true`` = ``kv_cache: fp8``). Every other key is shared, and every
consumer of the twin takes either class (``isinstance`` of the base).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_ais.formats.checks import check_regexes
from nemo_ais.formats.fp8_block import Family
from nemo_ais.refit.kv_scales import KVReduction
from nemo_ais.rollout.faults import RefitFault
from nemo_ais.rules.keep_bf16 import KeepInBf16

__all__ = [
    "KV_CACHE_FORMATS",
    "ROLLOUT_FORMATS",
    "Fp8RolloutConfig",
    "KVCacheFormat",
    "RolloutFormat",
    "RolloutPrecisionConfig",
]

RolloutFormat = Literal["bf16", "fp8", "mxfp8", "nvfp4_w4a16", "nvfp4_w4a4"]
KVCacheFormat = Literal["bf16", "fp8", "nvfp4"]
ROLLOUT_FORMATS: tuple[str, ...] = RolloutFormat.__args__
KV_CACHE_FORMATS: tuple[str, ...] = KVCacheFormat.__args__
_COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class RolloutPrecisionConfig(BaseModel):
    """How the twin simulates vLLM's low-precision rollout (module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    format: RolloutFormat = Field(
        "fp8",
        description="Linear layers of the decoder: bf16, fp8 (W8A8 blockwise), mxfp8, "
        "nvfp4_w4a16 (NVFP4 weights) or nvfp4_w4a4 (+ NVFP4 activations, static input amax).",
    )
    kv_cache: KVCacheFormat = Field(
        "bf16", description="KV cache: bf16, fp8 (E4M3 per-tensor) or nvfp4 (1x16 blocks)."
    )
    num_first_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the first N decoder layers unquantized (NeMo-RL key)."
    )
    num_last_layers_in_bf16: int = Field(
        0, ge=0, description="Keep the last N decoder layers unquantized (NeMo-RL key)."
    )
    attention_in_bf16: bool = Field(
        False,
        description="Keep every layer's q/k/v/o projections unquantized (NeMo-RL's NVFP4 "
        "real-quant default ignores *self_attn*); the KV cache format still applies.",
    )
    keep_patterns: tuple[str, ...] = Field(
        (), description="Regexes (re.search on the module name) of extra linears kept unquantized."
    )
    weight_block: tuple[int, int] = Field(
        (128, 128), description="format fp8: weight tile (out, in); 128x128 as in vLLM."
    )
    activation_group: int = Field(
        128, gt=0, description="format fp8: per-token activation group along the hidden dim."
    )
    weight_family: Family = Field(
        "a", description="format fp8: weight quant formula family; 'a' = vLLM/DeepGEMM."
    )
    activation_family: Family = Field(
        "b", description="format fp8: activation formula family; 'b' = vLLM per-token-group."
    )
    ue8m0: bool = Field(False, description="format fp8: power-of-two (UE8M0) scales.")
    weight_eps: float = Field(1e-4, ge=0.0, description="format fp8: floor of a tile's amax.")
    activation_eps: float = Field(
        1e-10, ge=0.0, description="format fp8: floor of an activation group's amax."
    )
    nvfp4_weight_rows_per_block: Literal[1, 16] = Field(
        1, description="nvfp4 formats: 1 = 1x16 weight blocks; 16 = TE's 16x16 weight tiles."
    )
    kv_calibration_reduction: KVReduction = Field(
        "percentile_of_amax",
        description="KV calibration rule: percentile_of_amax (NeMo-RL's: max |x| per "
        "calibration forward, nearest-rank percentile over forwards) or element_percentile "
        "(percentile of |x| over the elements, max over forwards).",
    )
    kv_calibration_percentile: float = Field(
        99.9, gt=0.0, le=100.0, description="p of the KV calibration rule, in (0, 100]."
    )
    kv_calibration_margin: float = Field(
        1.05, ge=1.0, le=4.0, description="Multiplies the calibrated KV amax (outlier headroom)."
    )
    kv_amax_floor: float = Field(
        1e-4, gt=0.0, description="Floor of the calibrated KV amax (all-zero K/V stay finite)."
    )
    compute_dtype: Literal["float32", "bfloat16", "float64"] | None = Field(
        None, description="Cast the twin to this dtype before quantizing; None keeps the model's."
    )
    refit_fault: RefitFault | None = Field(
        None,
        description="TEST/BENCH ONLY: a planted refit bug (nemo_ais.rollout.faults; refused "
        "unless NEMO_AIS_PLANT_REFIT_FAULT=1).",
    )

    @field_validator("keep_patterns")
    @classmethod
    def _compile_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_regexes(patterns, "keep_patterns")

    @model_validator(mode="after")
    def _check_block(self) -> RolloutPrecisionConfig:
        if any(b <= 0 for b in self.weight_block):
            raise ValueError(
                f"weight_block={self.weight_block} is invalid: expected two positive ints "
                "(vLLM block FP8 uses (128, 128))"
            )
        return self

    @property
    def enabled(self) -> bool:
        """False when nothing is simulated: the twin is then an exact copy (the BF16 arm)."""
        return not (
            self.format == "bf16" and self.kv_cache == "bf16" and self.compute_dtype is None
        )

    def keep_rule(self) -> KeepInBf16:
        """The twin's keep-in-BF16 rule (:mod:`nemo_ais.rules.keep_bf16`), num_layers given."""
        return KeepInBf16(
            first_layers=self.num_first_layers_in_bf16,
            last_layers=self.num_last_layers_in_bf16,
            attention=self.attention_in_bf16,
            patterns=self.keep_patterns,
        )

    @property
    def kv_cache_fp8(self) -> bool:
        """``kv_cache == "fp8"`` (the earlier config's key)."""
        return self.kv_cache == "fp8"

    @property
    def torch_compute_dtype(self) -> torch.dtype | None:
        """``compute_dtype`` as a ``torch.dtype`` (None = keep the model's dtype)."""
        return None if self.compute_dtype is None else _COMPUTE_DTYPES[self.compute_dtype]


class Fp8RolloutConfig(RolloutPrecisionConfig):
    """The earlier FP8 twin config: :class:`RolloutPrecisionConfig` plus its two former keys.

    ``enabled`` (bool, default True) and ``kv_cache_fp8`` (bool, default False) are read
    and translated (module doc); they cannot be mixed with ``format`` / ``kv_cache``.
    """

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
