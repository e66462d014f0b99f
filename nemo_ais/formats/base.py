# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""One low-precision format as one record: everything the rest of the code asks about it.

:data:`nemo_ais.formats.registry.FORMATS` maps a config's format name to its record; no
code outside ``nemo_ais/formats/`` branches on a format's name. A new format is one module
here exporting its record (``fp8_block.py`` is the model) and one row in ``registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_ais.rules.format_geometry import GEOMETRY

RefitPairs = list[tuple[str, torch.Tensor]]


def stack_label(name: str | Sequence[str]) -> str:
    """``name``, or ``"<first name> (stack of E)"`` for an expert stack (error messages)."""
    return name if isinstance(name, str) else f"{name[0]} (stack of {len(name)})"


def weight_pairs(name: str | Sequence[str], tensors: Sequence[tuple[str, torch.Tensor]]) -> RefitPairs:
    """The refit pairs of one weight, or of each expert of a stack, in order.

    ``name`` ``<m>.weight`` with ``tensors`` ``[("weight", codes), (leaf, t), ...]`` -> ``[(<m>.weight, codes),
    (<m>.<leaf>, t), ...]``; E expert names, tensors ``[E, ...]`` -> expert 0's pairs (``t[0]``), then expert 1's, ...
    """
    if not isinstance(name, str):
        return [
            pair
            for e, expert in enumerate(name)
            for pair in weight_pairs(expert, [(leaf, t[e]) for leaf, t in tensors])
        ]
    module = name.removesuffix(".weight")
    return [(name if leaf == "weight" else f"{module}.{leaf}", t) for leaf, t in tensors]


def unchanged(t: torch.Tensor, *, amax: Any = None, name: str = "", knobs: Any = None) -> torch.Tensor:
    """The identity fake quantization (high-precision weights or activations)."""
    return t


@dataclass(frozen=True)
class Format:
    """Everything the code asks about one format.

    Attributes:
        name: the config's name (``rollout.format``, ``ais_*_refit.format``).
        block: ``(rows, cols)`` of a weight block that shares one scale.
        elements: the element grid (``"E4M3"``, ``"E2M1"``; ``"BF16"``: none).
        scale_rule: how a block's scale is formed, in words.
        reference: the short reference quantizer (DeepGEMM style), None for BF16.
        quantize: the fast path, bit-equal to ``reference`` (tested).
        dequantize: codes and scales back to fp32.
        fake_weight: ``(w, *, amax, name, knobs) -> fp32``, the twin's weight round trip.
        fake_activation: ``(x, *, amax, name, knobs)``, the twin's input round trip.
        refit_pairs: ``(name, w, config, *, weight_amax, input_scale) -> [(name, t)]`` that
            vLLM's loader takes for one weight ``w [out, in]``, or for an expert stack ``w [E, out, in]`` named by a
            sequence of E names (``weight_amax`` and ``input_scale`` then ``[E]``): one quantizer call, the pairs of
            each expert in turn (:func:`weight_pairs`); None: no refit format.
        refit_bytes: ``(numel, shape, config) -> bytes`` sent for one weight.
        pads: partial blocks are zero-padded (FP8); else the in-dim must be a block multiple.
        shared_global_scale: fused vLLM shards (q/k/v, gate/up) share one global scale.
        static_input_amax: the activation quantizer needs a calibrated input amax.
        keeps_codes: the twin's layer also keeps vLLM's codes and scales (``Fp8Linear``).
    """

    name: str
    block: tuple[int, int]
    elements: str
    scale_rule: str
    reference: Callable[..., Any] | None = None
    quantize: Callable[..., Any] | None = None
    dequantize: Callable[..., torch.Tensor] | None = None
    fake_weight: Callable[..., torch.Tensor] = unchanged
    fake_activation: Callable[..., torch.Tensor] = unchanged
    refit_pairs: Callable[..., RefitPairs] | None = None
    refit_bytes: Callable[..., int] | None = None
    pads: bool = False
    shared_global_scale: bool = False
    static_input_amax: bool = False
    keeps_codes: bool = False

    @property
    def k_multiple(self) -> int:
        """The in-dim of a quantized weight must be a multiple of this (1: any, it pads)."""
        return 1 if self.pads else self.block[1]


BF16 = Format("bf16", GEOMETRY["bf16"].block, "BF16", "none: the weights and inputs stay in high precision", pads=True)
"""No quantization: the BF16 arm of the twin."""
