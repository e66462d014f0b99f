# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Per-format fake quantization of a linear layer: the registry the twin and a trainer share.

``LINEAR_FAKE_QUANT[format]`` (default knobs) or :func:`linear_fake_quant` (a config's) gives a
:class:`LinearFakeQuant`, the ``weight(w, amax=None)`` and ``activation(x, amax=None)`` round trips the twin's linear
layers apply (``bf16``: identities; NVFP4: the global ``amax``; W4A4 activations: the static calibrated amax).

A rollout-aligned trainer (QARL) computes ``F.linear(activation(x), weight(W))`` with :func:`straight_through` around
each call and gets the twin's numbers bit for bit in fp32 (tested); NVFP4's ``weight_amax`` is shared by vLLM's fused
shards (:func:`shared_weight_amax`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

import torch

from nemo_ais.formats.base import unchanged
from nemo_ais.formats.registry import get_format
from nemo_ais.rollout.config import ROLLOUT_FORMATS, RolloutPrecisionConfig
from nemo_ais.rules.vllm_layers import fused_shard_group


class LinearFakeQuant(NamedTuple):
    """One rollout format's fake quantization of a linear layer (module doc).

    Attributes:
        format: the format's name.
        weight: ``(w [N, K], *, amax=None, name=...) -> fp32 [N, K]``.
        activation: ``(x [..., K], *, amax=None, name=...) -> [..., K]``.
        static_input_amax: the activation needs a calibrated ``amax`` (NVFP4 W4A4).
        shared_weight_amax: fused shards share one weight amax (NVFP4's global scale).
        k_multiple: the in-dim must be a multiple of this (1: any).
    """

    format: str
    weight: Callable[..., torch.Tensor]
    activation: Callable[..., torch.Tensor]
    static_input_amax: bool = False
    shared_weight_amax: bool = False
    k_multiple: int = 1


def linear_fake_quant(config: RolloutPrecisionConfig) -> LinearFakeQuant:
    """The :class:`LinearFakeQuant` of ``config.format`` with ``config``'s knobs."""
    fmt = get_format(config.format)
    return LinearFakeQuant(
        fmt.name,
        _bind(fmt.fake_weight, "weight", config),
        _bind(fmt.fake_activation, "input", config),
        fmt.static_input_amax,
        fmt.shared_global_scale,
        fmt.k_multiple,
    )


def scale_error(x: torch.Tensor, q: torch.Tensor, k: float) -> torch.Tensor:
    """``x + k (q - x)`` in ``q``'s dtype: the quantization error of ``q = fq(x)`` times ``k``.

    The mismatch dial of ``error_scale``: ``k = 1`` returns ``q`` itself (bit for bit), ``k = 0`` returns ``x``; in
    between and above, the error keeps the format's structure (blocks, scales, saturation) and only its size changes.
    """
    if k == 1.0:
        return q
    x = x.to(q.dtype)
    return x + k * (q - x)


def _bind(fn: Callable[..., torch.Tensor], default: str, knobs: RolloutPrecisionConfig) -> Callable[..., torch.Tensor]:
    """``fn`` with the config's knobs bound (the identity stays itself: nothing to bind)."""
    return fn if fn is unchanged else partial(_with_default_name, fn, default, knobs)


def _with_default_name(
    fn: Callable[..., torch.Tensor],
    default: str,
    knobs: RolloutPrecisionConfig,
    t: torch.Tensor,
    *,
    amax: Any = None,
    name: str | None = None,
) -> torch.Tensor:
    q = fn(t, amax=amax, name=default if name is None else name, knobs=knobs)
    return scale_error(t, q, knobs.error_scale)


LINEAR_FAKE_QUANT: Mapping[str, LinearFakeQuant] = {
    fmt: linear_fake_quant(RolloutPrecisionConfig(format=fmt)) for fmt in ROLLOUT_FORMATS
}


def max_into(seen: dict[str, torch.Tensor], name: str, amax: torch.Tensor) -> None:
    """``seen[name] = max(seen[name], amax)``, or ``amax`` for a name not yet seen."""
    seen[name] = amax if name not in seen else torch.maximum(seen[name], amax)


def shared_weight_amax(named_weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: amax}``: max ``|W|`` of each weight's fused group (NVFP4: one global scale)."""
    own = {
        name: (w.detach().abs().amax() if w.numel() else w.new_zeros(())).to(torch.float32)
        for name, w in named_weights.items()
    }
    groups: dict[str, torch.Tensor] = {}
    for name, amax in own.items():
        max_into(groups, fused_shard_group(name), amax)
    return {name: groups[fused_shard_group(name)] for name in own}


class _StraightThrough(torch.autograd.Function):
    """Forward ``fn(t)`` exactly; backward passes the gradient to ``t`` unchanged."""

    @staticmethod
    def forward(ctx, t, fn, kwargs):
        ctx.dtype = t.dtype
        return fn(t.detach(), **kwargs)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None, None


def straight_through(fn: Callable[..., torch.Tensor], t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``fn(t, **kwargs)`` in the forward (bit for bit), identity gradient (straight-through)."""
    return _StraightThrough.apply(t, fn, kwargs)
