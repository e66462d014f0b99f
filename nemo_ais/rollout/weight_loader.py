# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's refit: the trainer's tensors, by HF name, loaded into a built twin model."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from nemo_ais.formats.checks import check_finite
from nemo_ais.formats.grids import E4M3_MAX
from nemo_ais.refit.kv_scales import KVScales
from nemo_ais.rollout.fake_quant import shared_weight_amax
from nemo_ais.rollout.linear import Fp8Linear, QuantExperts
from nemo_ais.rollout.modules import shared_amax_groups

FP8_DTYPE = torch.float8_e4m3fn
# KV-cache scale names of a refit stream (kv_scales.kv_scale_names, or vLLM's remapped).
_KV_SCALE_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:attn\.)?([qkv])_scale$")
_SCALE_SUFFIX = "_scale_inv"  # "<...>.weight" -> "<...>.weight_scale_inv"
_SYNC_NONFINITE = "refusing to sync NaN/Inf into the engine"


def _copier(name: str, target: torch.Tensor) -> Callable[[torch.Tensor], None]:
    def copy_(tensor: torch.Tensor) -> None:
        if tensor.shape != target.shape:
            raise ValueError(f"sync_weights: {name} got {list(tensor.shape)}, expected {list(target.shape)}")
        target.copy_(tensor)

    return copy_


def _sync_targets(model: nn.Module, names: tuple[str, ...]) -> dict[str, Callable]:
    """Map each trainer tensor name to the function that loads it into ``model``."""
    targets = {name: _copier(name, param) for name, param in model.named_parameters(remove_duplicate=False)}
    for name, buf in model.named_buffers(remove_duplicate=False):
        # codes, scales and caches are written by the load functions below
        if not name.endswith((".weight", ".weight_scale_inv", ".weight_dequant")):
            targets[name] = _copier(name, buf)
    for name in names:
        module = model.get_submodule(name)
        if isinstance(module, QuantExperts):
            for param, load in module.loaders().items():
                targets[f"{name}.{param}"] = load
            continue
        targets[f"{name}.weight"] = module.load_weight
        if module.bias is not None:
            targets[f"{name}.bias"] = module.load_bias
    return targets


class WeightLoader:
    """Loads the trainer's tensors into the twin ``model`` (``shared_amax``: NVFP4 fused shards)."""

    def __init__(
        self, model: nn.Module, names: tuple[str, ...], shared_amax: bool, dtype: torch.dtype | None = None
    ) -> None:
        self.model = model
        self.dtype = dtype  # the twin's compute dtype (None: kept as sent)
        self.targets = _sync_targets(model, names)
        self.fp8_weights = {f"{n}.weight": m for n in names if isinstance(m := model.get_submodule(n), Fp8Linear)}
        self.weight_groups = shared_amax_groups(model, names) if shared_amax else {}

    def as_held(self, items: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """The pairs with each weight and bias in the twin's compute dtype, as the twin was cast at build.

        So a refit quantizes what vLLM would (a BF16 twin: the bf16-cast weight, not the trainer's fp32 one).
        FP8 codes, their scales and KV scales pass as sent.
        """
        if self.dtype is None:
            return items
        return ((name, self._held_dtype(name, t)) for name, t in items)

    def _high_precision(self, name: str) -> bool:
        """``name`` is a weight or bias the twin holds in high precision (FP8-format linears take codes too)."""
        return name in self.targets or name in self.weight_groups

    def _held_dtype(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self._high_precision(name) and tensor.is_floating_point() and tensor.dtype != FP8_DTYPE:
            return tensor.to(self.dtype)
        return tensor

    def _load_group(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the complete fused group ``weights`` with their shared amax."""
        amax = shared_weight_amax(weights)
        for name, tensor in weights.items():
            module = self.model.get_submodule(name.removesuffix(".weight"))
            module.load_weight(tensor, amax=amax[name])

    def load(self, items: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, dict[tuple[int, str], float]]:
        """Load ``(name, tensor)`` pairs; returns (tensors loaded, KV scales by (layer, kind))."""
        n_loaded = 0
        pending: dict[str, dict[str, torch.Tensor]] = {}  # FP8 weight name -> codes/scale
        groups: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}  # fused NVFP4 shards
        kv_sent: dict[tuple[int, str], float] = {}
        for name, tensor in items:
            weight_name = name.removesuffix(_SCALE_SUFFIX)
            kv_match = _KV_SCALE_RE.search(name)
            if weight_name in self.fp8_weights and (name != weight_name or tensor.dtype == FP8_DTYPE):
                part = "scale" if name != weight_name else "codes"
                pending.setdefault(weight_name, {})[part] = tensor
                if len(pending[weight_name]) == 2:
                    got = pending.pop(weight_name)
                    self.fp8_weights[weight_name].load_quantized(got["codes"], got["scale"])
            elif kv_match is not None:
                if tensor.numel() != 1 or not tensor.is_floating_point() or tensor.dtype == FP8_DTYPE:
                    raise ValueError(
                        f"sync_weights: {name} is a {list(tensor.shape)} {tensor.dtype} tensor, expected one "
                        "float32 scale (vLLM's per-tensor KV-cache scale)"
                    )
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                kv_sent[(int(kv_match.group(1)), kv_match.group(2))] = float(tensor)
            elif tensor.dtype == FP8_DTYPE and self._high_precision(name):
                raise ValueError(
                    f"sync_weights: {name} arrived as float8_e4m3fn codes, but the twin holds it in high precision "
                    "(not an FP8-format linear here: kept in BF16, or the twin's format is not fp8); expected the "
                    "trainer's floating weight"
                )
            elif name in self.weight_groups:
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                group = groups.setdefault(self.weight_groups[name], {})
                group[name] = tensor.detach()
                if len(group) == len(self.weight_groups[name]):
                    self._load_group(groups.pop(self.weight_groups[name]))
            elif name in self.targets:
                check_finite(tensor, f"sync_weights: {name}", action=_SYNC_NONFINITE)
                self.targets[name](tensor.detach())
            else:
                raise ValueError(
                    f"sync_weights: unknown tensor name {name!r}, expected a name of the original model's state_dict "
                    f"(e.g. {next(iter(self.targets))!r}), its '.weight_scale_inv' or a KV-cache scale"
                )
            n_loaded += 1
        if pending:
            first = next(iter(pending))
            raise ValueError(
                f"sync_weights: {first} got only its {next(iter(pending[first]))} in FP8 "
                f"format, expected both '{first}' (float8_e4m3fn) and '{first}{_SCALE_SUFFIX}'"
            )
        if groups:
            members, got = next(iter(groups.items()))
            raise ValueError(
                f"sync_weights: {', '.join(sorted(set(members) - got.keys()))} missing: NVFP4 shards "
                f"{', '.join(members)} share one global scale (vLLM fuses them), expected all of them in the same sync"
            )
        return n_loaded, kv_sent


def received_kv_scales(sent: dict[tuple[int, str], float], num_layers: int) -> KVScales:
    """KV scales sent with the refit -> :class:`KVScales` (ValueError: missing or <= 0)."""
    missing = [f"layer {i} {kind}" for i in range(num_layers) for kind in ("k", "v") if (i, kind) not in sent]
    bad = {k: v for k, v in sent.items() if not v > 0}
    unknown = sorted(f"layer {i} {kind}" for i, kind in sent if i >= num_layers)
    if missing or bad or unknown:
        raise ValueError(
            f"sync_weights: KV-cache scales incomplete or invalid (missing: {', '.join(missing[:6]) or 'none'}; not > "
            f"0: {bad or 'none'}; no such layer: {', '.join(unknown[:6]) or 'none'}), expected a positive k_scale and "
            f"v_scale for each of the {num_layers} layers"
        )
    scale = torch.ones(num_layers, 3, dtype=torch.float64)
    for (layer, kind), value in sent.items():
        scale[layer, "qkv".index(kind)] = value
    include_q = all((i, "q") in sent for i in range(num_layers))
    return KVScales(scale * E4M3_MAX, scale, include_q)
