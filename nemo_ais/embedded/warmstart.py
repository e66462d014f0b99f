# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Supervised warm start of the embedded policy, cached on disk by a hash of its config.

GRPO needs a policy that already solves part of the task (reward ~0.2-0.6), otherwise
almost every group has zero reward variance and no gradient. A few hundred AdamW steps of
teacher forcing on the response tokens give that. The result depends only on the model
shape, the task and the warm-start section, so it is cached as
``<cache_dir>/warmstart-<hash>.pt`` and shared by every arm and seed (and by later runs).
The file is written atomically (temporary file + rename).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from nemo_ais.embedded.checkpoint import atomic_torch_save
from nemo_ais.embedded.config import RecipeConfig, config_hash
from nemo_ais.embedded.model import build_model, greedy_decode
from nemo_ais.embedded.task import AdditionTask, seeded_generator

__all__ = ["build_task", "build_untrained_policy", "warm_start", "warm_start_path"]

logger = logging.getLogger(__name__)

# Bump when the warm-start procedure changes, so stale cache files are not reused.
_WARM_START_VERSION = 1


def build_task(cfg: RecipeConfig) -> AdditionTask:
    """The arithmetic task of ``cfg.data`` (tokenizer and held-out set included)."""
    return AdditionTask(
        num_digits=cfg.data.num_digits,
        eval_size=cfg.data.eval_size,
        eval_seed=cfg.data.eval_seed,
        reverse_answer=cfg.data.reverse_answer,
    )


def build_untrained_policy(cfg: RecipeConfig, task: AdditionTask) -> torch.nn.Module:
    """The randomly initialised Qwen2 policy of ``cfg.policy.model`` for ``task``."""
    tok = task.tokenizer
    return build_model(
        vocab_size=tok.vocab_size,
        max_seq_len=task.prompt_len + task.max_response_len,
        pad_token_id=tok.pad_id,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        **cfg.policy.model.model_dump(),
    )


def _cache_key(cfg: RecipeConfig) -> dict[str, Any]:
    ws = cfg.policy.warm_start.model_dump(exclude={"cache_dir"})
    return {
        "version": _WARM_START_VERSION,
        "model": cfg.policy.model.model_dump(),
        "data": cfg.data.model_dump(),
        "warm_start": ws,
    }


def warm_start_path(cfg: RecipeConfig) -> Path:
    """``<cache_dir>/warmstart-<hash of model, data and warm-start config>.pt``."""
    return Path(cfg.policy.warm_start.cache_dir) / f"warmstart-{config_hash(_cache_key(cfg))}.pt"


@torch.no_grad()
def greedy_accuracy(model: torch.nn.Module, task: AdditionTask, problems: list) -> float:
    """Fraction of ``problems`` solved exactly by greedy decoding."""
    if not problems:
        return 0.0
    was_training = model.training
    model.eval()
    responses = greedy_decode(
        model,
        task.prompt_ids(problems),
        max_new_tokens=task.max_response_len,
        eos_token_id=task.tokenizer.eos_id,
        pad_token_id=task.tokenizer.pad_id,
    )
    model.train(was_training)
    return float(task.correct(problems, responses).mean())


def _sft_step(model, optimizer, task: AdditionTask, step: int, batch_size: int, seed: int) -> float:
    problems = task.sample_train(batch_size, seeded_generator("warm_start", seed, step))
    input_ids, labels = task.sft_batch(problems)
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def warm_start(cfg: RecipeConfig, task: AdditionTask, *, progress: bool = True) -> Path:
    """Train (or reuse) the warm-start weights and return the cache file's path.

    The file holds ``{"state_dict", "key", "greedy_accuracy", "final_loss"}``. A cache hit
    is only trusted if its stored key equals this config's key.

    Raises:
        OSError: the cache directory is not writable (named).
    """
    path = warm_start_path(cfg)
    key = _cache_key(cfg)
    if path.is_file():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if blob.get("key") == key:
            logger.info("warm start: reusing %s", path)
            return path
        logger.warning("warm start: %s has a different key; retraining", path)
    ws = cfg.policy.warm_start
    model = build_untrained_policy(cfg, task)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    # linear warmup: without it the tiny model often stalls on a plateau for hundreds of steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, ws.warmup_steps))
    )
    bar = tqdm(range(ws.steps), desc="warm start (SFT)", disable=not progress, leave=False)
    loss = float("nan")
    for step in bar:
        loss = _sft_step(model, optimizer, task, step, ws.batch_size, ws.seed)
        schedule.step()
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(
                f"warm start: non-finite SFT loss at step {step}; lower policy.warm_start.lr"
                f" (now {ws.lr})"
            )
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    acc = greedy_accuracy(model, task, task.eval_problems)
    logger.info(
        "warm start: %d steps, loss %.4f, held-out greedy accuracy %.3f", ws.steps, loss, acc
    )
    blob = {
        "state_dict": model.state_dict(),
        "key": key,
        "greedy_accuracy": acc,
        "final_loss": loss,
    }
    atomic_torch_save(blob, path)
    return path
