# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Step logs written by NeMo-RL's REAL logger, and the reader's view of them.

The helpers here (imported by the other ``test_analyze*`` modules) build a synthetic GRPO
run's ``train_data`` the way ``grpo_train`` holds it ([B, S] prompt + response tensors,
position j = token j and its log-prob, 0 on the prompt) and log it with upstream's
``Logger.log_batched_dict_as_jsonl`` exactly as ``grpo_train`` does (same keys). The
rollout mismatch grows with the step: generation_logprobs = prev_logprobs + (scale * step) * noise.
"""

from __future__ import annotations

import json

import torch
from nemo_rl_logs import nemo_rl_logger

from nemo_ais.analyze.reader import REQUIRED_KEYS, find_step_files, iter_chunks

PROMPT = 4


def synthetic_step(step, *, batch=8, length=24, scale=0.02, seed=0, jump=None, kv=False):
    """train_data of one step: float32 log-probs, a dropped sample, -inf padding.

    ``jump``: this step's noise scale instead of ``scale * step``; ``kv``: the noise grows
    10x from the first to the last position (the default-KV-scale signature).
    """
    g = torch.Generator().manual_seed(1000 * seed + step)
    lengths = torch.randint(PROMPT + 3, length + 1, (batch,), generator=g)
    pos = torch.arange(length)
    token_mask = ((pos >= PROMPT) & (pos < lengths[:, None])).to(torch.int64)
    sample_mask = torch.ones(batch)
    sample_mask[-1] = 0  # a filtered sample: its tokens must not count
    prev = -torch.rand(batch, length, generator=g) * 3 - 0.01
    sigma = scale * step if jump is None else jump
    if kv:
        sigma = sigma * (1 + 9 * pos / length)
    gen = prev + sigma * torch.randn(batch, length, generator=g)
    prev = torch.where(pos >= PROMPT, prev, 0.0)  # NeMo-RL: 0 on the prompt
    gen = torch.where(pos >= PROMPT, gen, 0.0)
    gen = torch.where(pos < lengths[:, None], gen, -torch.inf)  # padding never leaks
    return {
        "input_ids": torch.randint(0, 100, (batch, length), generator=g),
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "advantages": torch.randn(batch, 1, generator=g).expand(batch, length).contiguous(),
        "generation_logprobs": gen.float(),
        "prev_logprobs": prev.float(),
        "rewards": torch.rand(batch, generator=g),
        "content": [f"sample {i} of step {step}" for i in range(batch)],
    }


def log_step(logger, step, train_data):
    """grpo_train's logging step: the same keys, through the real logger."""
    log_data = {
        "content": train_data["content"],
        "rewards": train_data["rewards"].tolist(),
        "input_lengths": train_data["input_lengths"].tolist(),
        "token_ids": train_data["input_ids"].tolist(),
        "token_loss_mask": train_data["token_mask"].tolist(),
        "sample_loss_mask": train_data["sample_mask"].tolist(),
        "advantages": train_data["advantages"].tolist(),
        "generation_logprobs": train_data["generation_logprobs"].tolist(),
        "prev_logprobs": train_data["prev_logprobs"].tolist(),
    }
    logger.log_batched_dict_as_jsonl(log_data, f"train_data_step{step}.jsonl")


def write_run(log_dir, steps, **kwargs):
    """Log ``steps`` (a list of step numbers, or {step: synthetic_step kwargs}); return the data."""
    logger = nemo_rl_logger(log_dir)
    items = steps.items() if isinstance(steps, dict) else ((s, {}) for s in steps)
    out = {}
    for step, extra in items:
        out[step] = synthetic_step(step, **{**kwargs, **extra})
        log_step(logger, step, out[step])
    return out


def aligned(train_data):
    """The loss's view, as nested float lists: x[:, 1:], mask = token_mask[:, 1:] x sample_mask."""
    mask = train_data["token_mask"][:, 1:].double() * train_data["sample_mask"][:, None].double()
    return (
        train_data["prev_logprobs"][:, 1:].double().tolist(),
        train_data["generation_logprobs"][:, 1:].double().tolist(),
        mask.tolist(),
    )


# ----------------------------------------------------------------------------------------


def test_upstream_layout_is_a_batch_of_one_per_key(tmp_path):
    write_run(tmp_path, [1])
    rows = [json.loads(x) for x in (tmp_path / "train_data_step1.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    assert set(REQUIRED_KEYS) <= set(rows[0])
    assert [r["idx"] for r in rows] == list(range(8))
    assert len(rows[0]["prev_logprobs"]) == 1 and len(rows[0]["prev_logprobs"][0]) == 24
    assert rows[0]["sample_loss_mask"] in ([1.0], [1])
    assert any("-Infinity" in x for x in (tmp_path / "train_data_step1.jsonl").read_text().split())


def test_reader_aligns_like_the_loss_and_orders_by_step(tmp_path):
    data = write_run(tmp_path, [10, 2, 1])
    files = find_step_files(tmp_path)
    assert [f.step for f in files] == [1, 2, 10]  # numeric, not lexicographic
    chunks = list(iter_chunks(files[1], chunk_tokens=1 << 20))
    assert len(chunks) == 1
    old, roll, mask = aligned(data[2])
    valid = torch.tensor(mask) == 1
    assert torch.equal(chunks[0].valid, valid)
    assert torch.equal(chunks[0].logp_old[valid], torch.tensor(old, dtype=torch.float64)[valid])
    assert torch.equal(chunks[0].logp_rollout[valid], torch.tensor(roll, dtype=torch.float64)[valid])
    assert chunks[0].n_nonfinite == 0  # -inf only at masked positions


def test_reader_chunks_bound_the_positions_held(tmp_path):
    write_run(tmp_path, [1], batch=16)
    (f,) = find_step_files(tmp_path)
    chunks = list(iter_chunks(f, chunk_tokens=3 * 23))
    assert [c.valid.shape[0] for c in chunks] == [3, 3, 3, 3, 3, 1]
    assert all(c.num_positions <= 3 * 23 for c in chunks)
    assert [ln for c in chunks for ln in c.lines] == list(range(1, 17))
