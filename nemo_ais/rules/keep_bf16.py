# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Which linear layers stay in BF16: one rule, called by every place that needs to know.

The twin, the refit stream, the vLLM refit patch and ``nemo_ais.preflight`` all ask :meth:`KeepInBf16.reason`, so they
cannot disagree (veRL #7519: an ignore pattern ``mlp.gate`` also matched ``mlp.gate_up_proj``, and rollout ran in BF16
what training treated as FP8). Rules, in priority order, on a HF module or parameter name:

1. MoE routers: a name part after the decoder layer's index is ``gate``, ``router`` or ``shared_expert_gate`` (the
   router itself, or a linear nested in it: GraniteMoE's ``router.layer``, HunYuan's ``gate.wg``).
2. ``patterns``: regexes, ``re.search`` on the module name or the full name.
3. The first ``first_layers`` and the last ``last_layers`` decoder layers.
4. ``attention``: every ``self_attn`` projection.
5. NeMo-RL's ``keywords`` (substrings) and ``ignore`` (ModelOpt fnmatch patterns), matched as NeMo-RL does: with and
   without the parameter suffix and the ``model.`` prefix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from nemo_ais.rules.vllm_layers import layer_index, within_layer

ROUTER_MODULES = frozenset({"gate", "router", "shared_expert_gate"})
"""Name parts of the MoE routers vLLM keeps in BF16."""
# every tensor a format's refit sends for a linear (tests/unit/test_keep_bf16_agree.py)
_PARAM_SUFFIXES = (
    ".weight",
    ".weight_scale",
    ".weight_scale_2",
    ".weight_scale_inv",
    ".weight_scale_from_checkpoint",
    ".input_scale",
)


def fp8_engine_exclusions(vllm_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The BF16 exclusions NeMo-RL's FP8 engine (``init_fp8``: block FP8 and MXFP8) reads.

    Read from ``policy.generation.vllm_cfg`` as given (absent: 0, 0, ()), under the refit config's field names. The AIS
    FP8 refit (``nemo_rl.refit.configure``) and the offline check read them here, to keep in BF16 what the engine does.
    """
    return {
        "num_first_layers_in_bf16": vllm_cfg.get("num_first_layers_in_bf16", 0),
        "num_last_layers_in_bf16": vllm_cfg.get("num_last_layers_in_bf16", 0),
        "ignored_layer_kws": tuple(vllm_cfg.get("quantization_ignored_layer_kws") or ()),
    }


def module_name(name: str) -> str:
    """``...q_proj.weight`` (or a scale of it) -> ``...q_proj``; a module name unchanged."""
    suffix = next((s for s in _PARAM_SUFFIXES if name.endswith(s)), "")
    return name.removesuffix(suffix)


@dataclass(frozen=True)
class KeepInBf16:
    """The exclusions of one rollout (module doc); every field's default keeps nothing."""

    first_layers: int = 0
    last_layers: int = 0
    num_layers: int | None = None
    attention: bool = False
    patterns: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def reason(self, name: str) -> str | None:
        """Why the linear ``name`` (module or parameter) stays in BF16, or None."""
        module = module_name(name)
        layer = layer_index(name)
        last = self.last_layers
        checks = (
            (not ROUTER_MODULES.isdisjoint(within_layer(module).split(".")), "MoE router"),
            (any(re.search(p, module) or re.search(p, name) for p in self.patterns), "matches keep_patterns"),
            (layer is not None and layer < self.first_layers, f"first {self.first_layers} layers in BF16"),
            (layer is not None and last > 0 and layer >= (self.num_layers or 0) - last, f"last {last} layers in BF16"),
            (self.attention and ".self_attn." in f".{module}.", "attention_in_bf16"),
        )
        return next((why for hit, why in checks if hit), None) or self.ignored(name)

    def keeps(self, name: str) -> bool:
        """``reason(name) is not None``."""
        return self.reason(name) is not None

    def ignored(self, name: str) -> str | None:
        """The ``keywords`` / ``ignore`` entry ``name`` matches (rule 5, NeMo-RL's), else None."""
        kw = next((k for k in self.keywords if k in name), None)
        if kw is not None:
            return f"ignored_layer_kws {kw!r}"
        toggled = name.removeprefix("model.") if name.startswith("model.") else f"model.{name}"
        candidates = {n for base in (name, toggled) for n in (base, module_name(base))}
        hit = next((p for p in self.ignore if any(fnmatchcase(c, p) for c in candidates)), None)
        return None if hit is None else f"ignore {hit!r}"


def check_regexes(patterns: tuple[str, ...], field: str) -> tuple[str, ...]:
    """``patterns`` unchanged if each compiles, else ``ValueError`` naming ``field`` and the pattern."""
    for p in patterns:
        try:
            re.compile(p)
        except re.error as err:
            raise ValueError(f"{field}: {p!r} is not a valid regex ({err})") from err
    return patterns
