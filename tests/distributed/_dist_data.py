# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Deterministic per-rank shards of a GRPO batch and their padded concatenation.

Every rank rebuilds the SAME list of shards from ``(specs, seed)`` and takes its own;
the single-process oracle concatenates all shards along B, padding T to the longest
shard with mask 0. Masked positions (ragged tails, fully masked rows, padding) hold
garbage on purpose -- ``nan`` in ``prev_logprobs``, ``-inf`` in ``generation_logprobs``
and ``50.0`` in ``curr_logprobs`` -- because the core contract says masked positions are
ignored whatever they hold.

Valid positions carry a realistic FP8 mismatch (l ~ N(0, 0.3^2)) plus two extreme
log-ratios, l = +25 and l = -30, beyond the default clamp (|l| <= 20) and the cap C, so
the clamp / cap paths are part of every distributed comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

__all__ = ["Shard", "ShardSpec", "concat_shards", "make_shards"]

# (B, T, kind): kind is "ragged" (random lengths, row 1 fully masked when B >= 3) or
# "all_masked" (mask all 0).
ShardSpec = tuple[int, int, str]

_GARBAGE = {"prev": float("nan"), "gen": float("-inf"), "curr": 50.0, "ref": float("nan")}


@dataclasses.dataclass
class Shard:
    """One rank's ``[B, T]`` float64 tensors (``adv`` is ``[B]``)."""

    curr: torch.Tensor
    prev: torch.Tensor
    gen: torch.Tensor
    ref: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor

    @property
    def n_tok(self) -> int:
        return int(self.mask.sum().item())

    @property
    def n_seq(self) -> int:
        return int((self.mask.sum(dim=-1) > 0).sum().item())


def _make_shard(spec: ShardSpec, gen: torch.Generator, mismatch: float) -> Shard:
    b, t, kind = spec
    if kind not in ("ragged", "all_masked"):
        raise ValueError(f"kind: got {kind!r}, expected 'ragged' or 'all_masked'")
    f64 = torch.float64
    logp_rollout = -3.0 * torch.rand(b, t, generator=gen, dtype=f64) - 0.05
    log_rho = mismatch * torch.randn(b, t, generator=gen, dtype=f64)
    curr = logp_rollout + log_rho + 0.1 * torch.randn(b, t, generator=gen, dtype=f64)
    ref = logp_rollout + 0.2 * torch.randn(b, t, generator=gen, dtype=f64)
    adv = torch.randn(b, generator=gen, dtype=f64)
    lengths = torch.randint(1, max(t, 1) + 1, (b,), generator=gen)
    if kind == "ragged" and b >= 3:
        lengths[1] = 0
    if kind == "ragged" and b >= 1 and t >= 2:
        lengths[0] = t  # row 0 is full so the extreme values below are valid tokens
        log_rho[0, 0] = 25.0  # beyond log_ratio_clamp and log C
        log_rho[0, 1] = -30.0
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(f64)
    if kind == "all_masked":
        mask.zero_()
    valid = mask.bool()
    prev = logp_rollout + log_rho

    def garbage(x, key):
        return torch.where(valid, x, torch.full_like(x, _GARBAGE[key]))

    return Shard(
        curr=garbage(curr, "curr"),
        prev=garbage(prev, "prev"),
        gen=garbage(logp_rollout, "gen"),
        ref=garbage(ref, "ref"),
        adv=adv,
        mask=mask,
    )


def make_shards(specs: Sequence[ShardSpec], seed: int, mismatch: float = 0.3) -> list[Shard]:
    """One :class:`Shard` per spec, identical on every process for the same arguments."""
    gen = torch.Generator().manual_seed(seed)
    return [_make_shard(spec, gen, mismatch) for spec in specs]


def concat_shards(shards: Sequence[Shard]) -> Shard:
    """Concatenate along B, padding T to the max with mask 0 (and the usual garbage)."""
    t_max = max(s.mask.shape[1] for s in shards)

    def pad(x, key):
        fill = 0.0 if key == "mask" else _GARBAGE[key]
        return torch.nn.functional.pad(x, (0, t_max - x.shape[1]), value=fill)

    return Shard(
        curr=torch.cat([pad(s.curr, "curr") for s in shards]),
        prev=torch.cat([pad(s.prev, "prev") for s in shards]),
        gen=torch.cat([pad(s.gen, "gen") for s in shards]),
        ref=torch.cat([pad(s.ref, "ref") for s in shards]),
        adv=torch.cat([s.adv for s in shards]),
        mask=torch.cat([pad(s.mask, "mask") for s in shards]),
    )
