# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""TEST / BENCH ONLY: refit bugs planted into the twin, to calibrate the refit guard.

``RolloutPrecisionConfig.refit_fault`` (embedded recipe: ``rollout.quantizer.refit_fault={kind: ..., from_refit: N}``)
makes every refit of the twin from the ``from_refit``-th on (counted from 1 since the twin was built; in the embedded
recipe refit N is GRPO step N of a run that did not resume) go wrong the way peers' refits did. It is refused unless the
environment variable :data:`FAULT_ENV` is ``1`` (set by ``benchmarks/bench_alarm_calibration.py`` and the tests), so a
config cannot turn it on by accident; the run then computes wrong rollouts on purpose. Kinds:

* ``scale_layout`` (format ``fp8``): each matched linear's block-scale grid ``weight_scale_inv [N/128, K/128]`` is
  loaded in the wrong layout, its column-major buffer read row-major (``s.t().reshape(s.shape)``; a transpose for a
  square grid), so the FP8 codes are dequantized with another tile's scale.
* ``bf16_layer``: the matched linears run unquantized in the rollout (weights as sent, no activation quantization) while
  the trainer believes them quantized (veRL #7519: an ignore pattern ``mlp.gate`` also matched ``mlp.gate_up_proj``).
  With an unquantized trainer this LOWERS the mismatch; it is visible where the trainer's forward runs the rollout's
  fake quantization (``policy.rollout_aligned_quantization``, the QaRL arms).
* ``stale_kv_scale`` (quantized KV cache): the KV-cache scales stop being recalibrated; every later refit keeps those of
  refit ``from_refit - 1``.

``modules`` (a regex, ``re.search`` on the twin's module name) selects the linears of ``scale_layout`` / ``bf16_layer``.
Building a twin whose fault has nothing to act on (no matched linear of the kind, or a BF16 KV cache for
``stale_kv_scale``) raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_ais.refit.kv_scales import KVScales
from nemo_ais.rules.keep_bf16 import check_regexes

FAULT_ENV = "NEMO_AIS_PLANT_REFIT_FAULT"
"""Environment variable that must be ``1`` for :class:`RefitFault` to validate."""

FaultKind = Literal["scale_layout", "bf16_layer", "stale_kv_scale"]


class RefitFault(BaseModel):
    """A planted refit bug (TEST / BENCH ONLY; module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: FaultKind = Field(description="scale_layout | bf16_layer | stale_kv_scale.")
    from_refit: int = Field(ge=2, description="First refit that goes wrong (1 = the first; >= 2: healthy history).")
    modules: str = Field(".", description="scale_layout / bf16_layer: regex (re.search) of the linears hit.")

    @field_validator("kind", mode="before")
    @classmethod
    def _only_on_purpose(cls, kind: object) -> object:
        if os.environ.get(FAULT_ENV) != "1":
            raise ValueError(
                f"a planted refit bug (wrong rollouts on purpose) is for the refit-guard "
                f"tests and benchmarks only: it needs {FAULT_ENV}=1 in the environment"
            )
        return kind

    @field_validator("modules")
    @classmethod
    def _regex(cls, pattern: str) -> str:
        return check_regexes((pattern,), "modules")[0]


@runtime_checkable
class _Twin(Protocol):
    """What the injector touches of :class:`~nemo_ais.rollout.twin.RolloutTwin` (an import would be circular)."""

    config: Any
    model: torch.nn.Module
    quantized_module_names: tuple[str, ...]
    kv_scales: KVScales | None

    @property
    def kv_cache_quantized(self) -> bool: ...


class RefitFaultInjector:
    """Applies a :class:`RefitFault` to one twin, refit by refit."""

    def __init__(self, fault: RefitFault, twin: _Twin) -> None:
        self.fault = fault
        self.refits = 0
        if fault.kind == "stale_kv_scale":
            if not twin.kv_cache_quantized:
                raise ValueError(
                    f"refit_fault stale_kv_scale needs a quantized KV cache, got kv_cache {twin.config.kv_cache!r}"
                )
            self.names: tuple[str, ...] = ()
            return
        # Fp8Linear holds block scales, any QuantLinear its dequantized weight (duck-typed: an import would be circular)
        wanted, attr = (
            ("Fp8Linear", "weight_scale_inv") if fault.kind == "scale_layout" else ("QuantLinear", "weight_dequant")
        )
        self.names = tuple(
            n
            for n in twin.quantized_module_names
            if re.search(fault.modules, n) and hasattr(twin.model.get_submodule(n), attr)
        )
        if not self.names:
            raise ValueError(
                f"refit_fault {fault.kind}: modules={fault.modules!r} matches no {wanted} of "
                f"the twin (format {twin.config.format})"
            )

    @property
    def active(self) -> bool:
        """Whether the current refit goes wrong."""
        return self.refits >= self.fault.from_refit

    def after_load(self, twin: _Twin, weights: Mapping[str, torch.Tensor], previous_kv_scales: KVScales | None) -> None:
        """Called by ``sync_weights`` after the weights are loaded, before calibration."""
        self.refits += 1
        if not self.active:
            return
        if self.fault.kind == "stale_kv_scale":
            if previous_kv_scales is not None:
                twin.kv_scales = previous_kv_scales  # not recalibrated
            return
        for name in self.names:
            module = twin.model.get_submodule(name)
            if self.fault.kind == "scale_layout":
                s = module.weight_scale_inv
                module.load_quantized(module.weight, s.t().reshape(s.shape).contiguous())
            else:  # bf16_layer
                weight = weights.get(f"{name}.weight")
                if weight is not None and weight.dtype != torch.float8_e4m3fn:
                    module.weight_dequant = weight.detach().to(torch.float32).clone()
                module.quantize_input = _unquantized  # instance attribute: no activation quant


def _unquantized(x: torch.Tensor) -> torch.Tensor:
    return x
