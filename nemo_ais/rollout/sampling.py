# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Sampling and scoring with any Hugging Face causal LM: the twin's generation loop."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from nemo_ais.rollout.config import MIN_TEMPERATURE

LogprobsMode = Literal["unfiltered", "processed"]


class _GrowingLayer(DynamicLayer):
    """HF's ``DynamicLayer`` with K and V in a buffer that doubles when full.

    A decode step copies its token in instead of ``torch.cat`` (quadratic in the length); ``keys`` / ``values`` are
    views of the filled part, so attention computes the same numbers. The first write allocates exactly its length.
    Keys another cache method replaced (``crop``, ``reorder_cache``) start a new buffer, so no view handed out is
    written into.
    """

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None
    _handed: torch.Tensor | None = None  # the keys view this layer last returned

    def update(self, key_states, value_states, *args, **kwargs):
        """Append ``[B, H, t, D]`` K and V; return views of every cached position."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.get_seq_length(), key_states.shape[-2]
        if self.keys is not self._handed or n + t > self._k.shape[-2]:
            capacity = max(2 * (n + t), 64) if n else t
            self._k = self._grown(self.keys, key_states, capacity)
            self._v = self._grown(self.values, value_states, capacity)
        self._k[..., n : n + t, :].copy_(key_states)
        self._v[..., n : n + t, :].copy_(value_states)
        self.keys, self.values = self._k[..., : n + t, :], self._v[..., : n + t, :]
        self._handed = self.keys
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor, new: torch.Tensor, capacity: int) -> torch.Tensor:
        buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
        if old.numel():  # the cached positions
            buffer[..., : old.shape[-2], :].copy_(old)
        return buffer


class GrowingKVCache(DynamicCache):
    """HF's ``DynamicCache`` whose layers grow in place (:class:`_GrowingLayer`): same values."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = _GrowingLayer


class GenerationOutput(NamedTuple):
    """Result of :func:`generate` (``T = max_new_tokens``).

    Attributes:
        sequences: ``[B, P + T]`` int64, the left-padded prompt then the response.
        response_ids: ``[B, T]`` int64; ``pad_token_id`` after EOS.
        response_mask: ``[B, T]`` int64, 1 up to and including the first EOS.
        logprobs: ``[B, T]`` float32 ``generation_logprobs``; 0 where the mask is 0.
    """

    sequences: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor


class MismatchStats(NamedTuple):
    """Token-level mismatch of two log-prob tensors, ``r = logp_a - logp_b`` (python floats).

    ``mean_abs_delta``, ``max_abs_delta``, ``exp_mean_abs_delta``, ``n_tok``, NeMo-RL's ``token_mult_prob_error`` (mean
    ``exp(|r|)``) and ``gen_kl_error`` (mean ``exp(r) - r - 1``).
    """

    mean_abs_delta: float
    token_mult_prob_error: float
    exp_mean_abs_delta: float
    max_abs_delta: float
    n_tok: int
    gen_kl_error: float = 0.0


def _check_sampling(temperature: float, top_k: int, top_p: float, mode: str) -> None:
    """Validate the sampling arguments of :func:`generate` and :func:`score_responses`."""
    if not (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE):
        raise ValueError(
            f"temperature={temperature!r} is invalid: expected a finite float >= {MIN_TEMPERATURE:g} (vLLM samples "
            "greedily below it; logits / T overflow fp32; use top_k=1 for greedy decoding)"
        )
    if not (isinstance(top_k, int) and top_k >= 0):
        raise ValueError(f"top_k={top_k!r} is invalid: expected an int >= 0 (0 = off)")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p={top_p!r} is invalid: expected 0 < top_p <= 1 (1 = off)")
    if mode not in ("unfiltered", "processed"):
        raise ValueError(f"logprobs_mode={mode!r} is invalid: expected 'unfiltered' or 'processed'")


def _filter_top_k_top_p(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k set and the top-p nucleus to ``-inf`` (the top one stays)."""
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, -math.inf)
    return scaled


def _token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int, top_p: float, mode: LogprobsMode
) -> torch.Tensor:
    """``log softmax(logits / temperature)[tokens]`` in fp32 (filtered first if "processed")."""
    scaled = logits.float() / temperature
    if mode == "processed":
        scaled = _filter_top_k_top_p(scaled, top_k, top_p)
    logp = torch.log_softmax(scaled, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _sample(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row: ``argmax(p / E)``, ``E ~ Exp(1)`` (an exact categorical draw)."""
    scaled = _filter_top_k_top_p(logits.float() / temperature, top_k, top_p)
    probs = torch.softmax(scaled, dim=-1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)


def check_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Prompts must be ``[B, P]`` int with a LEFT-padded {0, 1} mask of the same shape."""
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids: got {list(input_ids.shape)} {input_ids.dtype}, expected [B, P] int64")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask: got {list(attention_mask.shape)}, expected {list(input_ids.shape)} like input_ids"
        )
    mask = attention_mask.to(torch.int64)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask: expected values in {0, 1}")
    bad = (mask[:, 1:] < mask[:, :-1]).any(-1) | (mask.sum(-1) == 0)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        raise ValueError(
            f"attention_mask: row {row} is not a non-empty LEFT-padded prompt "
            "(expected zeros, then at least one 1, then ones only)"
        )


def check_token_ids(model: nn.Module, **ids: torch.Tensor) -> None:
    """Integer token ids ``model`` can embed, else ``ValueError`` naming the argument and the range."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", math.inf)  # a model without an embedding table: ids >= 0 only
    for name, t in ids.items():
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name}: got {list(t.shape)} {t.dtype}, expected integer token ids (int64)")
        if t.numel():
            lo, hi = (int(v) for v in torch.aminmax(t))
            if lo < 0 or hi >= vocab:
                raise ValueError(
                    f"{name}: got token ids in [{lo}, {hi}], expected [0, {vocab}) (the model's vocabulary)"
                )


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded mask: 0 at the first real token (pads get 0)."""
    return (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp_min(0)


def _eos_ids(eos_token_id: int | Sequence[int] | None) -> list[int]:
    if eos_token_id is None:
        return []
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    logprobs_mode: LogprobsMode = "unfiltered",
    past_key_values: DynamicCache | None = None,
) -> GenerationOutput:
    """Sample ``max_new_tokens`` per prompt from a HF causal LM, with log-probs.

    One prefill, then one single-token forward per step through HF's KV cache. At step t ``z = logits / temperature``
    (fp32), the token is drawn from ``z`` filtered by top-k / top-p; the reported log-prob is ``log_softmax(z)[token]``
    of the UNFILTERED distribution (what a trainer computes as ``prev_logprobs``; filtering would add a bias it does not
    see). ``logprobs_mode="processed"`` reports the filtered one (vLLM's ``processed_logprobs``).

    Args:
        model: a HF causal LM (call ``eval()``).
        input_ids: ``[B, P]`` int64 prompts, LEFT-padded; attention_mask: ``[B, P]``.
        max_new_tokens: T >= 1. temperature: >= ``MIN_TEMPERATURE``. top_k: 0 = off. top_p: 1 = off.
        eos_token_id: id(s) ending a response (None: never).
        pad_token_id: fills positions after EOS (default: the first EOS id, else 0).
        past_key_values: an empty cache to use (the twin's quantized KV cache).

    Raises:
        ValueError: bad shapes, a mask that is not left-padded, bad sampling arguments.
    """
    check_prompt(input_ids, attention_mask)
    check_token_ids(model, input_ids=input_ids)
    _check_sampling(temperature, top_k, top_p, logprobs_mode)
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: expected an int >= 1")
    eos = _eos_ids(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    batch, device = input_ids.shape[0], input_ids.device
    cache = past_key_values if past_key_values is not None else GrowingKVCache()
    eos_t = torch.tensor(eos, dtype=torch.int64, device=device)

    tokens = torch.full((batch, max_new_tokens), pad, dtype=torch.int64, device=device)
    mask = torch.zeros((batch, max_new_tokens), dtype=torch.int64, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)

    attn = attention_mask.to(torch.int64)
    step_ids, step_pos = input_ids.to(torch.int64), positions(attn)
    for t in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=attn,
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]
        token = _sample(logits, temperature, top_k, top_p, generator)
        logp = _token_logprobs(logits, token, temperature, top_k, top_p, logprobs_mode)
        live = ~done
        tokens[:, t] = torch.where(live, token, pad)
        mask[:, t] = live.to(torch.int64)
        logprobs[:, t] = torch.where(live, logp, torch.zeros_like(logp))
        done = done | (live & torch.isin(token, eos_t))
        if bool(done.all()):
            break
        step_ids = tokens[:, t : t + 1]
        step_pos = step_pos[:, -1:] + 1
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)

    sequences = torch.cat([input_ids.to(torch.int64), tokens], dim=-1)
    return GenerationOutput(sequences, tokens, mask, logprobs)


@torch.no_grad()
def score_responses(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    logprobs_mode: LogprobsMode = "unfiltered",
    past_key_values: DynamicCache | None = None,
) -> torch.Tensor:
    """Teacher-forced ``[B, T]`` fp32 log-probs of ``response_ids`` after the prompts, one forward.

    Arguments as :func:`generate`; positions past EOS are scored too (multiply by the mask).
    """
    check_prompt(input_ids, attention_mask)
    _check_sampling(temperature, top_k, top_p, logprobs_mode)
    if response_ids.dim() != 2 or response_ids.shape[0] != input_ids.shape[0]:
        raise ValueError(f"response_ids: got {list(response_ids.shape)}, expected [{input_ids.shape[0]}, T]")
    check_token_ids(model, input_ids=input_ids, response_ids=response_ids)
    prompt_len, resp_len = input_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([input_ids, response_ids], dim=-1).to(torch.int64)
    attn = torch.cat([attention_mask, torch.ones_like(response_ids)], dim=-1).to(torch.int64)
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions(attn),
        past_key_values=past_key_values,
        use_cache=past_key_values is not None,
        logits_to_keep=resp_len + 1,
    )
    logits = out.logits[:, :resp_len]
    assert logits.shape[1] == resp_len and prompt_len >= 1
    return _token_logprobs(logits, response_ids.to(torch.int64), temperature, top_k, top_p, logprobs_mode)


def logprob_mismatch(logp_a: torch.Tensor, logp_b: torch.Tensor, mask: torch.Tensor) -> MismatchStats:
    """:class:`MismatchStats` of ``logp_a`` (trainer) against ``logp_b`` (engine) over ``mask``.

    An empty mask gives ``n_tok = 0``, 1.0 for ``token_mult_prob_error`` and ``exp_mean_abs_delta``, else 0.0.
    """
    if logp_a.shape != logp_b.shape or mask.shape != logp_a.shape:
        raise ValueError(
            f"logprob_mismatch: got logp_a {list(logp_a.shape)}, logp_b "
            f"{list(logp_b.shape)}, mask {list(mask.shape)}, expected one [B, T] shape"
        )
    m = mask.to(torch.float64)
    # where, not * m: a masked -inf (a token outside top-k past EOS, processed mode) times 0 is NaN
    r = torch.where(m.bool(), logp_a.double() - logp_b.double(), 0.0)
    delta = r.abs()
    n_tok = int(m.sum())
    if n_tok == 0:
        return MismatchStats(0.0, 1.0, 1.0, 0.0, 0, 0.0)
    mean = float(delta.sum()) / n_tok
    mult = float((torch.exp(delta) * m).sum()) / n_tok
    k3 = float(((torch.exp(r) - r - 1) * m).sum()) / n_tok
    return MismatchStats(mean, mult, math.exp(mean), float(delta.max()), n_tok, k3)
