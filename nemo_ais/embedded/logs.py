# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What the embedded recipe writes per step: ``metrics.jsonl`` and NeMo-RL's batch logs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from nemo_ais.embedded.checkpoint import atomic_write
from nemo_ais.embedded.dist import DistContext, all_reduce_sum
from nemo_ais.embedded.task import ArithmeticTask
from nemo_ais.rollout.readback import READBACK_FILE, RefitReadback, readback_row

METRICS_FILE = "metrics.jsonl"


class MetricsFile:
    """Append-only JSON lines, flushed per record; resume drops records past a checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it to disk."""
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_run(self, arm: str, seed: int, keep_through_step: int) -> None:
        """Drop ``(arm, seed)`` records with ``step > keep_through_step`` (-1: all of them)."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash: drop it
                continue
            mine = (rec.get("arm"), rec.get("seed")) == (arm, seed)
            if not mine or rec.get("step", 0) <= keep_through_step:
                kept.append(line)
        atomic_write(self.path, lambda tmp: Path(tmp).write_text("".join(f"{ln}\n" for ln in kept)))


def log_train_data(ctx: DistContext, task: ArithmeticTask, log_dir: Path, step: int, batch, logp_old, adv) -> None:
    """Write the step's global batch as NeMo-RL's ``train_data_step{N}.jsonl`` (rank 0).

    NeMo-RL v0.7.0's ``grpo_train`` layout: one JSON object per sample, each value a batch of one; per-token lists span
    prompt + response padded to the longest sequence, position j holding token j and its log-prob (0 on the prompt and
    padding). The ranks' rows are gathered with one all-reduce; ``nemo-ais analyze`` reads the files.
    """
    prompt_len = task.prompt_len
    n, resp_len = batch.mask.shape
    cols = [batch.sequences, batch.mask, batch.logp_rollout, logp_old.detach(), adv[:, None]]
    local = torch.cat([c.to(torch.float64) for c in (*cols, batch.rewards[:, None])], dim=1)
    rows = torch.zeros((n * ctx.world_size, local.shape[1]), dtype=torch.float64)
    rows[ctx.rank * n : (ctx.rank + 1) * n] = local
    all_reduce_sum(rows, ctx)
    if not ctx.is_main:
        return
    seq, mask, logp_rollout, logp_prev, adv_all, rewards = torch.split(
        rows, [prompt_len + resp_len, resp_len, resp_len, resp_len, 1, 1], dim=1
    )
    pad = [0.0] * prompt_len
    # upstream pads to the longest sequence of the batch and zeroes log-probs on padding
    width = int(mask.sum(dim=1).max()) if rows.shape[0] else 0
    logp_prev = torch.where(mask > 0, logp_prev, torch.zeros_like(logp_prev))
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"train_data_step{step}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        tok = task.tokenizer
        for i in range(rows.shape[0]):
            ids = [int(t) for t in seq[i, : prompt_len + width].tolist()]
            sample = {
                # one text per message: the prompt, then the response
                "content": [[tok.decode(ids[:prompt_len]), tok.decode(ids[prompt_len:])]],
                "rewards": [float(rewards[i])],
                "input_lengths": [prompt_len + int(mask[i].sum())],
                "token_ids": [ids],
                "token_loss_mask": [[0] * prompt_len + [int(m) for m in mask[i, :width].tolist()]],
                "sample_loss_mask": [1.0],
                "advantages": [[float(adv_all[i])] * (prompt_len + width)],
                "generation_logprobs": [pad + logp_rollout[i, :width].tolist()],
                "prev_logprobs": [pad + logp_prev[i, :width].tolist()],
                "idx": i,
            }
            f.write(json.dumps(sample) + "\n")
    os.replace(tmp, path)


def log_readback(ctx: DistContext, log_dir: Path, step: int, readback: RefitReadback | None) -> None:
    """Append the step's refit readback to ``log_dir/refit_readback.jsonl`` (rank 0).

    Nothing when the engine checked nothing (the BF16 arm, ``verify_refit: false``). A resumed run writes its re-run
    steps again; the reader keeps a step's last row. A last row a crash cut short (no newline) is dropped first, so the
    new row does not join it.
    """
    if not ctx.is_main or readback is None:
        return
    if not readback.weights_checked and readback.kv_scale_error is None:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / READBACK_FILE).open("a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":  # a last row cut short (read only then: the file grows every step)
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
        f.write((readback_row(step, readback) + "\n").encode())
