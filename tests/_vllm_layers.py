# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Stand-ins for vLLM's quant-method and kernel classes, named and shaped as vLLM's.

vLLM cannot be installed on a CPU machine. ``nemo_ais.nemo_rl.engine_report`` reads a
layer's quant method by its class names (MRO, so NeMo-RL's subclasses count) and its
kernel or MoE backend attributes, as vLLM 0.20.0 / 0.25.1 define them (module doc there):
these classes carry exactly those names and attributes, nothing else. Importing only the
standard library, so a fresh Ray worker process can build a model from a spec.
"""

from __future__ import annotations

from enum import Enum


class LinearMethodBase:
    pass


class UnquantizedLinearMethod(LinearMethodBase):
    pass


class UnquantizedFusedMoEMethod:
    pass


class UnquantizedEmbeddingMethod:
    pass


class FusedMoEMethodBase:
    pass


# kernels (vllm.model_executor.kernels.linear ...)
class FlashInferCutlassNvFp4LinearKernel:
    pass


class MarlinNvFp4LinearKernel:
    pass


class FlashInferCutlassMxfp8LinearKernel:
    pass


class MarlinMxfp8LinearKernel:
    pass


class CutlassFp8BlockScaledMMKernel:
    pass


class MarlinFP8ScaledMMLinearKernel:
    pass


class NvFp4MoeBackend(Enum):
    FLASHINFER_CUTLASS = "FLASHINFER_CUTLASS"
    MARLIN = "MARLIN"


class ModelOptNvFp4LinearMethod(LinearMethodBase):
    def __init__(self, kernel: type) -> None:
        self.kernel = kernel()


class NemoModelOptW4A16LinearMethod(ModelOptNvFp4LinearMethod):  # NeMo-RL main's subclass
    pass


class ModelOptNvFp4FusedMoE(FusedMoEMethodBase):
    def __init__(self, backend: NvFp4MoeBackend) -> None:
        self.nvfp4_backend = backend


class ModelOptMxFp8LinearMethod(LinearMethodBase):
    def __init__(self, kernel: type) -> None:
        self.kernel = kernel()


class Fp8LinearMethod(LinearMethodBase):
    def __init__(self, kernel: type) -> None:
        self.fp8_linear = kernel()
        self.use_marlin = kernel is MarlinFP8ScaledMMLinearKernel


METHODS = {  # spec name -> quant method factory
    "bf16": UnquantizedLinearMethod,
    "bf16_moe": UnquantizedFusedMoEMethod,
    "embedding": UnquantizedEmbeddingMethod,
    "nvfp4_cutlass": lambda: ModelOptNvFp4LinearMethod(FlashInferCutlassNvFp4LinearKernel),
    "nvfp4_marlin": lambda: ModelOptNvFp4LinearMethod(MarlinNvFp4LinearKernel),
    "nvfp4_nemo_w4a16": lambda: NemoModelOptW4A16LinearMethod(MarlinNvFp4LinearKernel),
    "nvfp4_moe_cutlass": lambda: ModelOptNvFp4FusedMoE(NvFp4MoeBackend.FLASHINFER_CUTLASS),
    "nvfp4_moe_marlin": lambda: ModelOptNvFp4FusedMoE(NvFp4MoeBackend.MARLIN),
    "mxfp8_cutlass": lambda: ModelOptMxFp8LinearMethod(FlashInferCutlassMxfp8LinearKernel),
    "mxfp8_marlin": lambda: ModelOptMxFp8LinearMethod(MarlinMxfp8LinearKernel),
    "fp8_cutlass": lambda: Fp8LinearMethod(CutlassFp8BlockScaledMMKernel),
    "fp8_marlin": lambda: Fp8LinearMethod(MarlinFP8ScaledMMLinearKernel),
}


class Module:
    """A ``torch.nn.Module`` as the report walks it: ``named_modules()`` and ``quant_method``."""

    def __init__(self, quant_method=None) -> None:
        if quant_method is not None:
            self.quant_method = quant_method


class Model:
    def __init__(self, spec: dict[str, str]) -> None:
        self._modules = [("", Module())] + [(n, Module(METHODS[m]())) for n, m in spec.items()]

    def named_modules(self):
        return iter(self._modules)


class Worker:
    """vLLM's ``Worker`` as ``collective_rpc`` hands it to a callable: ``get_model()``."""

    def __init__(self, spec: dict[str, str]) -> None:
        self._model = Model(spec)

    def get_model(self) -> Model:
        return self._model


def dense_spec(layers: int, linear: str, *, gate_up: str | None = None) -> dict[str, str]:
    """A Qwen3-style dense decoder's vLLM modules, every linear with method ``linear``."""
    spec = {"model.embed_tokens": "embedding"}
    for i in range(layers):
        spec[f"model.layers.{i}.self_attn.qkv_proj"] = linear
        spec[f"model.layers.{i}.self_attn.o_proj"] = linear
        spec[f"model.layers.{i}.mlp.gate_up_proj"] = gate_up or linear
        spec[f"model.layers.{i}.mlp.down_proj"] = linear
    spec["lm_head"] = "embedding"
    return spec
