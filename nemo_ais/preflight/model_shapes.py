# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Shapes of the decoder-only model a config trains: its ``config.json``, else ONE table.

:func:`resolve_model_shape` reads the model's own ``config.json`` (a local checkpoint directory, else the Hugging Face
hub cache), else :data:`MODEL_SHAPES`, keyed by :func:`model_key` (``Qwen/Qwen3-8B``, ``/ckpt/Qwen3-8B/``: qwen3-8b).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only model's shapes (``num_experts = 0``: dense; MoE sizes are per expert)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP (unused when every layer is MoE)
    vocab_size: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm on q and k (head_dim weights each)
    num_experts: int = 0
    moe_intermediate_size: int = 0
    experts_per_token: int = 0
    source: str = ""

    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (no biases)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * kv)

    def mlp_params(self) -> int:
        """Dense SwiGLU of one layer (gate, up, down); 0 for MoE layers."""
        return 0 if self.num_experts else 3 * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """All routed experts of one layer (gate, up, down each)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def replicated_params(self) -> int:
        """Per-layer weights Megatron does not split by TP: the two norms, q/k norms, router."""
        router = self.num_experts * self.hidden_size
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0) + router

    def embedding_params(self) -> int:
        """One vocab x hidden matrix (the input embedding, or the untied output layer)."""
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every parameter: layers, embedding, output layer unless tied, final norm."""
        layer = self.attention_params() + self.mlp_params() + self.expert_params()
        layer += self.replicated_params()
        n_embed = 1 if self.tie_word_embeddings else 2
        return self.num_layers * layer + n_embed * self.embedding_params() + self.hidden_size


# From each model's config.json (Llama: head_dim = hidden / heads; every row has head_dim 128). Qwen2.5's q/k/v biases
# are not counted by attention_params(). total_params() gives the published sizes: 596,049,920 (Qwen3-0.6B), 8.19 B,
# 30.5 B, 8.03 B. A row: HF id, hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings, qk_norm[,
# experts, moe_intermediate, experts_per_token]; the key is model_key(HF id).
_QWEN_VOCAB = 151936
_SHAPE_ROWS = (
    ("Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 3072, _QWEN_VOCAB, True, True),
    ("Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 6144, _QWEN_VOCAB, True, True),
    ("Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, _QWEN_VOCAB, False, True),
    ("Qwen/Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, _QWEN_VOCAB, False, True, 128, 768, 8),
    ("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, _QWEN_VOCAB, True, False),
    ("meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, False, False),
)
MODEL_SHAPES: dict[str, ModelShape] = {
    hf_id.split("/")[-1].lower(): ModelShape(
        hidden, layers, heads, kv, 128, inter, vocab, *flags, source=f"hf:{hf_id} config.json"
    )
    for hf_id, hidden, layers, heads, kv, inter, vocab, *flags in _SHAPE_ROWS
}
for _alias in ("qwen3-8b-base", "qwen3-30b-a3b-base", "qwen2.5-1.5b-instruct", "llama-3.1-8b-instruct"):
    MODEL_SHAPES[_alias] = MODEL_SHAPES[_alias.removesuffix("-base").removesuffix("-instruct")]


def model_key(model_name: str) -> str:
    """The table key of a HF id or a local checkpoint path: its lower-cased basename."""
    return Path(str(model_name).rstrip("/")).name.lower()


def find_model_shape(model_name: str) -> ModelShape | None:
    """Look a HF id or a local checkpoint path up in :data:`MODEL_SHAPES`; None if absent."""
    return MODEL_SHAPES.get(model_key(model_name))


# Model types whose attention has RMSNorm on q and k (q_norm / k_norm weights of head_dim).
_QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")
# Expert-count keys of the MoE config.json files (Qwen3-MoE, Mixtral, DeepSeek).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def shape_from_config_json(path: Path) -> ModelShape:
    """A :class:`ModelShape` from a HF ``config.json`` (``text_config`` if nested).

    ``transformers``' defaults apply; ``ValueError`` names a missing key or an unreadable file.
    """
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not readable as JSON ({err})") from None
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(cfg.get(key), int):
            raise ValueError(f"{path}: no {key} (an integer) in it")
    heads = cfg["num_attention_heads"]
    n_experts = next((int(cfg[k]) for k in _EXPERT_KEYS if cfg.get(k)), 0)
    return ModelShape(
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        vocab_size=cfg["vocab_size"],
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        qk_norm=cfg.get("model_type", raw.get("model_type")) in _QK_NORM_MODEL_TYPES,
        num_experts=n_experts,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if n_experts else 0,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if n_experts else 0,
        source=str(path),
    )


def hf_hub_cache(environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache folder, in ``huggingface_hub``'s order of variables."""
    env = os.environ if environ is None else environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _cached_config_json(model_name: str, hub: Path) -> Path | None:
    """``org/name``'s ``config.json`` in the hub cache: ``refs/main``'s snapshot, else the newest; None if uncached."""
    repo = hub / ("models--" + model_name.strip("/").replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if pinned.is_file():
            return pinned
    snapshots = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


class ResolvedShape(NamedTuple):
    """The model's shapes (None: unknown), where they came from, and whether that is fine."""

    shape: ModelShape | None
    detail: str  # one line naming the source (or why none)
    ok: bool  # False: a config.json was unreadable, or nothing was found


def resolve_model_shape(model_name: str, environ: Mapping[str, str] | None = None) -> ResolvedShape:
    """Shapes from the model's ``config.json`` (local directory, HF cache), else the table.

    Never downloads. A ``config.json`` that cannot be read is reported (``ok`` False) and
    the table is used if it knows the model.
    """
    hub = hf_hub_cache(environ)
    local = Path(model_name).expanduser() / "config.json"
    found = local if local.is_file() else _cached_config_json(model_name, hub)
    problem = ""
    if found is not None:
        try:
            return ResolvedShape(shape_from_config_json(found), f"{model_name}: shapes from {found}", True)
        except ValueError as err:
            problem = f"{err}; "
    table = find_model_shape(model_name)
    where = f"no config.json in a local directory {model_name} or in the HF cache {hub} (nothing is downloaded)"
    if table is None:
        detail = f"{problem}policy.model_name={model_name!r}: {where}, and not in MODEL_SHAPES"
        return ResolvedShape(None, detail, False)
    why = problem.removesuffix("; ") if problem else where
    detail = f"{model_name}: shapes from the built-in table ({table.source}): {why}"
    return ResolvedShape(table, detail, not problem)
