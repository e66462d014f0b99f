# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The embedded policy: a tiny ``Qwen2ForCausalLM`` built offline, fp32 on CPU.

Random init from a ``Qwen2Config`` (nothing fetched from a hub). ``hidden_size`` and ``intermediate_size`` are multiples
of 128 so the FP8 twin's 128x128 weight blocks and 1x128 activation groups are real blocks, not padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

from nemo_ais.rollout.sampling import GrowingKVCache


def build_model(
    *,
    max_seq_len: int,
    init_seed: int,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    **shape: int,
) -> Qwen2ForCausalLM:
    """A randomly initialised fp32 ``Qwen2ForCausalLM`` (seeded by ``init_seed``; no dropout).

    ``shape``: ``Qwen2Config``'s ``vocab_size``, ``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads`` and ``num_key_value_heads``.
    """
    config = Qwen2Config(
        **shape,
        max_position_embeddings=max_seq_len,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        use_cache=True,
    )
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = Qwen2ForCausalLM(config)
    return model.to(torch.float32)


def response_logprobs(
    model: torch.nn.Module,
    sequences: torch.Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs ``[B, T]`` float32 of the response tokens under ``model`` (teacher forcing).

    ``logp[b, t] = log softmax(logits[b, prompt_len + t - 1] / temperature)[sequences[b, prompt_len + t]]``;
    ``sequences`` are the equal-length prompts then the right-padded responses. With
    ``return_entropy`` also ``H[b, t] = -sum_v p log p`` at ``temperature``: ``(logp, H)``.
    """
    logits = model(input_ids=sequences, use_cache=False).logits[:, prompt_len - 1 : -1]
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)
    if not return_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1)


@torch.no_grad()
def greedy_decode(
    model: torch.nn.Module, prompt_ids: torch.Tensor, *, max_new_tokens: int, eos_token_id: int, pad_token_id: int
) -> torch.Tensor:
    """Greedy decoding with the KV cache: ``[B, max_new_tokens]`` ids, ``pad_token_id`` after ``<eos>``."""
    past, inputs = GrowingKVCache(), prompt_ids
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_new_tokens):
        out = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past, next_tok = out.past_key_values, out.logits[:, -1].argmax(-1)
        tok = torch.where(done, torch.full_like(next_tok, pad_token_id), next_tok)
        tokens.append(tok)
        done = done | (tok == eos_token_id)
        if bool(done.all()):
            break
        inputs = tok[:, None]
    resp = torch.full((prompt_ids.shape[0], max_new_tokens), pad_token_id, dtype=torch.long)
    resp[:, : len(tokens)] = torch.stack(tokens, dim=1)
    return resp
