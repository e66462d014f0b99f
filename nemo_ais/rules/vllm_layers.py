# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""vLLM's view of a HF parameter name: its decoder layer, its projection, its fused layer.

q/k/v_proj load into one column-parallel ``qkv_proj``, gate/up_proj into ``gate_up_proj``;
``o_proj`` and ``down_proj`` are row-parallel. Pre-fused HF models name the fused layer.
"""

from __future__ import annotations

import re

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "qkv_proj", "gate_up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_FUSED_OF = {shard: fused for fused, shards in _FUSED.items() for shard in shards}
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The decoder layer of ``model.layers.3.mlp.up_proj.weight`` (3), else None."""
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else None


def within_layer(name: str) -> str:
    """The part of ``name`` after its decoder layer (``model.layers.3.mlp.gate`` -> ``mlp.gate``); all of it if none."""
    match = _LAYER_RE.search(name)
    return name[match.end() :] if match else name


def projection(name: str) -> str | None:
    """The linear projection a ``*.weight`` belongs to (``q_proj`` ...), else None."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in COLUMN_PARALLEL + ROW_PARALLEL:
        return parts[-2]
    return None


def fused_shard_group(name: str) -> str:
    """The fused vLLM layer of a module or weight name (``k_proj`` -> ``qkv_proj``; else itself)."""
    module = name.removesuffix(".weight")
    prefix, _, leaf = module.rpartition(".")
    if not prefix or leaf not in _FUSED_OF:
        return module
    return f"{prefix}.{_FUSED_OF[leaf]}"


def fused_siblings(name: str) -> tuple[str, ...]:
    """The weight names of ``name``'s fused vLLM layer, ``name`` included (itself if none)."""
    proj = projection(name)
    if proj not in _FUSED_OF:
        return (name,)
    prefix = name.removesuffix(f"{proj}.weight")
    return tuple(f"{prefix}{p}.weight" for p in _FUSED[_FUSED_OF[proj]])


def fused_parts(module: str) -> tuple[str, ...]:
    """The HF module names a vLLM module holds: ``...qkv_proj`` -> its q, k and v_proj."""
    prefix, _, leaf = module.rpartition(".")
    parts = _FUSED.get(leaf)
    if parts is None:
        return (module,)
    return tuple(f"{prefix}.{p}" if prefix else p for p in parts)
