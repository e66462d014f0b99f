# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's build step: which modules a rollout format quantizes, and what replaces them.

Every ``nn.Linear`` in a decoder layer that is a projection vLLM's loader names (as the refit stream:
``rules.vllm_layers.projection``) and every fused MoE experts module, but not MoE routers or the BF16 exclusions.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from nemo_ais.formats.registry import get_format
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LinearFakeQuant
from nemo_ais.rollout.linear import Fp8Experts, Fp8Linear, QuantExperts, QuantLinear
from nemo_ais.rules.vllm_layers import fused_shard_group, layer_index, projection


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def num_layers(model: nn.Module) -> int:
    """Decoder layers of a HF causal LM."""
    return int(_text_config(model).num_hidden_layers)


def head_dim(model: nn.Module) -> int:
    """Attention head dim of a HF causal LM (``head_dim``, else hidden / heads)."""
    text = _text_config(model)
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def _is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused MoE experts module (3-D ``gate_up_proj`` / ``down_proj``)."""
    weight = getattr(module, "gate_up_proj", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 3


def _in_features(module: nn.Module) -> list[int]:
    if isinstance(module, nn.Linear):
        return [module.in_features]
    return [module.gate_up_proj.shape[-1], module.down_proj.shape[-1]]


def quantized_module_names(model: nn.Module, config: RolloutPrecisionConfig) -> list[str]:
    """Names of the modules the format quantizes, in model order.

    Raises:
        ValueError: too many BF16 layers, or an in-dim that is not a block multiple.
    """
    if get_format(config.format).quantize is None:
        return []
    n_layers = num_layers(model)
    first, last = config.num_first_layers_in_bf16, config.num_last_layers_in_bf16
    if first + last > n_layers:
        raise ValueError(
            f"num_first_layers_in_bf16={first} + num_last_layers_in_bf16={last} is invalid: "
            f"expected <= the model's {n_layers} decoder layers"
        )
    k_multiple = get_format(config.format).k_multiple
    keep = dataclasses.replace(config.keep_rule(), num_layers=n_layers)
    names = []
    for name, module in model.named_modules():
        if layer_index(name) is None or not (isinstance(module, nn.Linear) or _is_fused_experts(module)):
            continue
        # as the refit stream: a linear the refit cannot place (no projection vLLM's loader names) stays BF16
        if keep.keeps(name) or (isinstance(module, nn.Linear) and projection(f"{name}.weight") is None):
            continue
        bad = [k for k in _in_features(module) if k % k_multiple]
        if bad:
            raise ValueError(
                f"{name}: in-dim {bad[0]} is not a multiple of {k_multiple}, which format {config.format!r} needs "
                f"(blocks along the in-dim); keep it unquantized with keep_patterns=[{re.escape(name)!r}]"
            )
        names.append(name)
    return names


def quantized_module(
    module: nn.Module,
    name: str,
    config: RolloutPrecisionConfig,
    fake_quant: LinearFakeQuant,
    weight_amax: torch.Tensor | None = None,
) -> nn.Module:
    """The format's replacement of ``module`` ``name`` (``weight_amax``: NVFP4's shared amax)."""
    if get_format(config.format).keeps_codes:
        quant = dict(
            weight_block=config.weight_block,
            activation_group=config.activation_group,
            weight_family=config.family,
            activation_family=config.activation_family,
            weight_eps=config.eps,
            activation_eps=config.activation_eps,
            ue8m0=config.ue8m0,
            error_scale=config.error_scale,
        )
        if isinstance(module, nn.Linear):
            return Fp8Linear.from_linear(module, name=f"{name}.weight", **quant)
        return Fp8Experts(module, name=name, **quant)
    if isinstance(module, nn.Linear):
        return QuantLinear(
            module.weight.detach(), module.bias, fake_quant, name=f"{name}.weight", weight_amax=weight_amax
        )
    return QuantExperts(module, lambda w, n: QuantLinear(w, None, fake_quant, name=n), name=name)


def shared_amax_groups(model: nn.Module, names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``{weight name: names sharing its amax}`` over vLLM's fused q/k/v and gate/up shards."""
    groups: dict[str, list[str]] = {}
    for name in names:
        if isinstance(model.get_submodule(name), QuantLinear):
            groups.setdefault(fused_shard_group(name), []).append(f"{name}.weight")
    return {n: tuple(g) for g in groups.values() if len(g) > 1 for n in g}
