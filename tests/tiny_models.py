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
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

_KINDS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # q_norm / k_norm on each head
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


class _PerExpertMoE(torch.nn.Module):
    """Top-1 MoE with one ``nn.Linear`` per expert and projection (``experts.<e>.gate_proj``), as
    transformers-4 and remote-code MoE checkpoints lay them out; expert ``unrouted`` is never chosen."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, unrouted: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(hidden, num_experts)
        with torch.no_grad():
            self.gate.bias.zero_()
            self.gate.bias[unrouted] = -1e4
        self.experts = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "gate_proj": torch.nn.Linear(hidden, intermediate, bias=False),
                    "up_proj": torch.nn.Linear(hidden, intermediate, bias=False),
                    "down_proj": torch.nn.Linear(intermediate, hidden, bias=False),
                }
            )
            for _ in range(num_experts)
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        choice = self.gate(flat).argmax(-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().squeeze(-1)
            if rows.numel():
                x = flat[rows]
                out[rows] = expert["down_proj"](torch.nn.functional.silu(expert["gate_proj"](x)) * expert["up_proj"](x))
        return out.view_as(hidden_states)


def tiny_per_expert_moe(*, seed: int = 0, num_experts: int = 4, unrouted: int = 3) -> torch.nn.Module:
    """:func:`tiny_lm`'s Qwen2 with every MLP a :class:`_PerExpertMoE` (hidden 64, 4 experts, top-1)."""
    model = tiny_lm(seed=seed)
    hidden = model.config.hidden_size
    torch.manual_seed(seed + 1)
    for layer in model.model.layers:
        layer.mlp = _PerExpertMoE(hidden, 2 * hidden, num_experts, unrouted)
    return model.eval()
