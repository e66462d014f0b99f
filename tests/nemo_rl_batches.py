# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""NeMo-RL-layout loss batches for the adapter tests (``BatchedDataDict``, float64).

``nemo_rl_batch`` gives one global batch as NeMo-RL's worker hands it to the loss (the
first token is the prompt, row 1 is a masked sample, lengths vary) and the current
log-probs ``[B, S - 1]``; ``global_counts`` its ``global_valid_seqs`` / ``global_valid_toks``.
"""

from __future__ import annotations

import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


def nemo_rl_batch(seed: int = 0, b: int = 6, s: int = 12, mismatch: float = 0.3):
    """``(data, curr)``: a global batch of ``b`` rows of length ``s``; prev = mu + noise."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    token_mask = torch.ones(b, s, dtype=torch.int64)
    token_mask[:, 0] = 0
    lengths = torch.randint(3, s + 1, (b,), generator=g)
    token_mask[torch.arange(s)[None, :] >= lengths[:, None]] = 0
    sample_mask = torch.ones(b, dtype=torch.int64)
    sample_mask[1] = 0
    gen = -2.0 * torch.rand(b, s, generator=g, dtype=f64) - 0.05
    prev = gen + mismatch * torch.randn(b, s, generator=g, dtype=f64)
    data = BatchedDataDict(
        {
            "input_ids": torch.randint(0, 8, (b, s), generator=g),
            "token_mask": token_mask,
            "sample_mask": sample_mask,
            "advantages": torch.randn(b, 1, generator=g, dtype=f64).expand(b, s).clone(),
            "prev_logprobs": prev,
            "generation_logprobs": gen,
            "reference_policy_logprobs": prev + 0.1 * torch.randn(b, s, generator=g, dtype=f64),
        }
    )
    curr = prev[:, 1:] + 0.15 * torch.randn(b, s - 1, generator=g, dtype=f64)
    return data, curr


def global_counts(data) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_valid_seqs, global_valid_toks)`` of ``data`` as one global batch."""
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    return torch.tensor(float(data["sample_mask"].sum())), torch.tensor(float(mask.sum()))
