# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Tiny Hugging Face causal LMs for the tests, built offline from a config (nothing fetched).

One builder for every test: the defaults are a 2-layer Qwen2 (hidden 64, GQA 4/2 heads);
a test passes only what it changes. ``intermediate_size`` defaults to twice the hidden size.
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

_KINDS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}


def tiny_lm(kind: str = "qwen2", *, seed: int = 0, hidden_size: int = 64, **config) -> torch.nn.Module:
    """A randomly initialised ``kind`` model in eval mode (``torch.manual_seed(seed)`` first)."""
    config_cls, model_cls = _KINDS[kind]
    cfg = config_cls(
        **{
            "vocab_size": 256,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "tie_word_embeddings": False,
            **config,
        }
    )
    torch.manual_seed(seed)
    return model_cls(cfg).eval()


def tiny_moe(vocab_size: int = 512) -> torch.nn.Module:
    """A 2-layer Qwen3-MoE (4 experts, top-2, hidden 128): the MoE model of the twin tests."""
    return tiny_lm(
        "qwen3_moe",
        vocab_size=vocab_size,
        hidden_size=128,
        moe_intermediate_size=128,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
    )
