# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Import NeMo-RL's real vLLM-side modules without vLLM: placeholders at the vLLM boundary.

vLLM (and Triton) cannot be installed on this CPU machine (vLLM pins another torch).
NeMo-RL's ``nemo_rl.models.generation.vllm.quantization.fp8`` imports a handful of vLLM
names at module load (v0.7.0's and main's, the union here); this helper puts placeholder modules for exactly those names
into ``sys.modules`` (through pytest's ``monkeypatch``, so they vanish after the test) and
imports upstream's REAL module. The placeholders are inert classes, a no-op
``triton.jit`` and ``tl.constexpr``; upstream's own functions (``load_weights``,
``_is_fp8_weight``, ``_get_module_from_param_name``) run unchanged. ``LinearBase`` and
``FusedMoE`` are ``nn.Module`` subclasses, so a test can build the module tree a vLLM
model would have and let upstream decide which weights the engine holds in FP8.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from collections.abc import Iterator

import pytest
import torch
from block_format_oracles import mxfp8_oracle
from torch import nn

UPSTREAM_FP8 = "nemo_rl.models.generation.vllm.quantization.fp8"


class LinearBase(nn.Module):
    """Placeholder of ``vllm.model_executor.layers.linear.LinearBase``."""


class FusedMoE(nn.Module):
    """Placeholder of ``vllm.model_executor.layers.fused_moe.layer.FusedMoE`` (v0.7.0)."""


class RoutedExperts(nn.Module):
    """Placeholder of vLLM 0.25's ``fused_moe.routed_experts.RoutedExperts`` (NeMo-RL main)."""


class MoERunner(nn.Module):
    """Placeholder of vLLM 0.25's ``fused_moe.runner.moe_runner.MoERunner`` (NeMo-RL main)."""


class _EngineCoreProc:
    @staticmethod
    def run_engine_core(*args, **kwargs):
        raise AssertionError("vLLM placeholder: EngineCoreProc.run_engine_core called")


class _CoreEngineProcManager:
    def __init__(self, *args, **kwargs):
        raise AssertionError("vLLM placeholder: CoreEngineProcManager() called")


# what the stand-in of vLLM's mxfp8_e4m3_quantize received, this test (reset per install)
MXFP8_QUANTIZED: list[torch.Tensor] = []


def mxfp8_e4m3_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recording stand-in of vLLM's MXFP8 quantizer (FlashInfer's ``mxfp8_quantize`` on
    SM100, a CUDA kernel): the float64 oracle of NVIDIA's rule
    (``block_format_oracles.mxfp8_oracle``: ``E = ceil(log2(amax_b / 448))``, byte 0 for
    an all-zero block, as the kernel emits), returned as the kernel does: E4M3 codes and a
    flat uint8 scale vector, which upstream reshapes to ``[..., K/32]``."""
    MXFP8_QUANTIZED.append(weight)
    data, scale, _ = mxfp8_oracle(weight.float().reshape(-1, weight.shape[-1]).numpy())
    codes = torch.from_numpy(data).view(torch.float8_e4m3fn).reshape(weight.shape)
    return codes, torch.from_numpy(scale).reshape(-1)


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _vllm_modules() -> dict[str, types.ModuleType]:
    triton = types.SimpleNamespace(jit=lambda fn: fn)  # kernels are defined, never launched
    tl = types.SimpleNamespace(constexpr=int)
    leaves = {
        "vllm.logger": {"init_logger": logging.getLogger},  # main
        "vllm.model_executor.layers.fused_moe.layer": {"FusedMoE": FusedMoE},
        "vllm.model_executor.layers.fused_moe.routed_experts": {"RoutedExperts": RoutedExperts},
        "vllm.model_executor.layers.fused_moe.runner.moe_runner": {"MoERunner": MoERunner},
        "vllm.model_executor.layers.linear": {"LinearBase": LinearBase},
        "vllm.model_executor.layers.quantization.utils.mxfp8_utils": {
            "mxfp8_e4m3_quantize": mxfp8_e4m3_quantize  # main's MXFP8 refit
        },
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1.engine.core": {"EngineCoreProc": _EngineCoreProc},
        "vllm.v1.engine.utils": {"CoreEngineProcManager": _CoreEngineProcManager},
    }
    modules: dict[str, types.ModuleType] = {}
    for name, attrs in leaves.items():
        parts = name.split(".")
        for i in range(1, len(parts)):  # parent packages
            modules.setdefault(".".join(parts[:i]), _module(".".join(parts[:i]), __path__=[]))
        modules[name] = _module(name, **attrs)
    return modules


def install_vllm_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the vLLM placeholders in ``sys.modules`` for this test (fails if vLLM is real)."""
    MXFP8_QUANTIZED.clear()
    for name, module in _vllm_modules().items():
        if name in sys.modules and not isinstance(sys.modules[name].__dict__.get("__path__"), list):
            raise AssertionError(f"{name} is already imported: vLLM is installed, use it")
        monkeypatch.setitem(sys.modules, name, module)


def import_upstream_fp8(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """Yield a fresh import of upstream's real FP8 refit module; remove it afterwards.

    A generator for a fixture body (``yield from import_upstream_fp8(monkeypatch)``): each
    test starts with upstream's caches empty, and no patched module outlives the test.
    """
    install_vllm_placeholders(monkeypatch)
    package = importlib.import_module(UPSTREAM_FP8.rpartition(".")[0])
    sys.modules.pop(UPSTREAM_FP8, None)
    try:
        yield importlib.import_module(UPSTREAM_FP8)
    finally:
        sys.modules.pop(UPSTREAM_FP8, None)
        package.__dict__.pop("fp8", None)
