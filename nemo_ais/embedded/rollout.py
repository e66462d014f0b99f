# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Rollouts of the embedded recipe: chunked generation with the twin, group advantages.

The step's prompts are cut into chunks of ``prompts_per_chunk``; chunk ``c`` is generated in ONE ``generate`` call
with its own generator ``seeded_generator("rollout", seed, step, c)``, and each rank owns a contiguous block of chunks
(:func:`chunk_range`). So a chunk's samples never depend on the DP world size, a group lives in one chunk (advantages
need no communication), and every arm sees the same random numbers (a paired comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_ais.embedded.task import ArithmeticTask, Problem, seeded_generator
from nemo_ais.rollout.twin import Fp8Twin


@dataclass
class RolloutBatch:
    """This rank's share of one GRPO step, ``n`` = local prompts x G, prompt-major.

    ``sequences`` ``[n, P + T]``; ``mask`` ``[n, T]`` {0, 1} up to and including EOS;
    ``logp_rollout`` ``[n, T]`` (0 on padding); ``rewards`` and ``correct`` (exact match) ``[n]``.
    """

    problems: list[Problem]
    sequences: torch.Tensor
    mask: torch.Tensor
    logp_rollout: torch.Tensor
    rewards: torch.Tensor
    correct: torch.Tensor

    def __len__(self) -> int:
        return len(self.problems)


def chunk_range(num_chunks: int, rank: int, world_size: int) -> range:
    """Chunks owned by ``rank``: a contiguous block of ``num_chunks / world_size``."""
    if num_chunks % world_size:
        raise ValueError(
            f"{num_chunks} rollout chunks cannot be split over cluster.dp_size={world_size} ranks: "
            "grpo.num_prompts_per_step / rollout.prompts_per_chunk must be a multiple of cluster.dp_size"
        )
    per_rank = num_chunks // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


@torch.no_grad()
def generate_rollouts(
    engine: Fp8Twin,
    task: ArithmeticTask,
    problems: list[Problem],
    chunks: range,
    *,
    prompts_per_chunk: int,
    num_generations: int,
    seed: int,
    step: int,
    temperature: float,
    top_k: int,
    top_p: float,
    reward: str = "digits",
) -> RolloutBatch:
    """G samples for each prompt of this rank's ``chunks`` of the step's ``problems``, rewarded."""
    tok = task.tokenizer
    parts = []
    mine: list[Problem] = []
    for c in chunks:
        chunk = problems[c * prompts_per_chunk : (c + 1) * prompts_per_chunk]
        prompt_ids = task.prompt_ids(chunk).repeat_interleave(num_generations, dim=0)
        out = engine.generate(
            prompt_ids,
            torch.ones_like(prompt_ids),
            max_new_tokens=task.max_response_len,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=seeded_generator("rollout", seed, step, c),
            eos_token_id=tok.eos_id,
            pad_token_id=tok.pad_id,
        )
        parts.append(out)
        mine.extend(p for p in chunk for _ in range(num_generations))
    response_ids = torch.cat([o.response_ids for o in parts])
    return RolloutBatch(
        problems=mine,
        sequences=torch.cat([o.sequences for o in parts]),
        mask=torch.cat([o.response_mask for o in parts]).to(torch.float32),
        logp_rollout=torch.cat([o.logprobs for o in parts]).to(torch.float32),
        rewards=task.rewards(mine, response_ids, kind=reward),
        correct=task.correct(mine, response_ids),
    )


def group_advantages(
    rewards: torch.Tensor, num_generations: int, *, normalize: bool, leave_one_out: bool, eps: float
) -> torch.Tensor:
    """GRPO advantages ``[n]`` float32 from rewards in groups of G consecutive samples, as NeMo-RL's estimator.

    ``A_i = (r_i - b_i) / (s_i + eps)``: ``b_i`` and ``s_i`` the mean and unbiased std of the group, or with
    ``leave_one_out`` of the other G - 1 rewards (NeMo-RL's ``calculate_baseline_and_std_per_prompt``). Without
    ``normalize``, or where ``s_i = 0``, ``A_i = r_i - b_i`` (a group of equal rewards gets ``A = 0`` exactly).
    """
    if rewards.ndim != 1 or rewards.numel() % num_generations:
        raise ValueError(
            f"rewards: got {tuple(rewards.shape)}, expected [n] with n a multiple of num_generations={num_generations}"
        )
    r = rewards.to(torch.float64).view(-1, num_generations)
    if leave_one_out:  # mean and unbiased std of the other G - 1 rewards, from them (no cancellation; G = 2: 0)
        g = num_generations
        others = r.unsqueeze(1).expand(-1, g, -1)[:, ~torch.eye(g, dtype=torch.bool)].view(-1, g, g - 1)
        baseline = others.mean(dim=-1)
        std = others.std(dim=-1, correction=1) if g > 2 else torch.zeros_like(baseline)
    else:
        baseline, std = r.mean(dim=1, keepdim=True), r.std(dim=1, keepdim=True, correction=1)
    adv = r - baseline
    if normalize:
        adv = torch.where(std > 0, adv / (std + eps), adv)
    return adv.view(-1).to(torch.float32)
