# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Supervised warm start of the embedded policy, cached on disk by a hash of its config.

GRPO needs a policy that already solves part of the task, else almost every group has zero reward variance. The result
depends only on the model shape, the task and ``policy.warm_start``, so it is cached atomically as
``<cache_dir>/warmstart-<hash>.pt`` and shared by every arm, seed and later run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from nemo_ais.embedded.checkpoint import UnreadableFileError, atomic_torch_save, load_file
from nemo_ais.embedded.config import RecipeConfig, config_hash
from nemo_ais.embedded.dist import RecipeError
from nemo_ais.embedded.model import build_model, greedy_decode
from nemo_ais.embedded.sections import WarmStartSection
from nemo_ais.embedded.task import ArithmeticTask, seeded_generator, task_from_config

logger = logging.getLogger(__name__)

# Bump when the warm-start procedure changes, so stale cache files are not reused.
_WARM_START_VERSION = 1


def build_task(cfg: RecipeConfig) -> ArithmeticTask:
    """The arithmetic task of ``cfg.data`` (tokenizer and held-out set included)."""
    return task_from_config(cfg.data)


def build_untrained_policy(cfg: RecipeConfig, task: ArithmeticTask) -> torch.nn.Module:
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
    # without a curriculum the key is what it was before the field existed (same cache files)
    no_stage = {"curriculum"} if cfg.policy.warm_start.curriculum is None else set()
    ws = cfg.policy.warm_start.model_dump(exclude={"cache_dir", *no_stage})
    return {
        "version": _WARM_START_VERSION,
        "model": cfg.policy.model.model_dump(),
        "data": cfg.data.model_dump(),
        "warm_start": ws,
    }


def warm_start_path(cfg: RecipeConfig) -> Path:
    """``<cache_dir>/warmstart-<hash of model, data and warm-start config>.pt``."""
    return Path(cfg.policy.warm_start.cache_dir) / f"warmstart-{config_hash(_cache_key(cfg))}.pt"


def _remedy(path: Path) -> str:
    return (
        f"delete it (rm {path}) and re-run to retrain the warm start (--overwrite does not "
        "touch policy.warm_start.cache_dir)"
    )


def _read_cache(path: Path) -> dict[str, Any]:
    blob = load_file(path, what="warm-start cache", remedy=_remedy(path), weights_only=True)
    if not isinstance(blob, dict) or "key" not in blob or "state_dict" not in blob:
        raise UnreadableFileError(
            f"warm-start cache {path} is not a warm-start file (expected a dict with 'key' "
            f"and 'state_dict'); {_remedy(path)}"
        )
    return blob


def load_warm_start(path: Path) -> dict[str, torch.Tensor]:
    """The policy ``state_dict`` (CPU) of the cache file ``path``; else ``UnreadableFileError``."""
    return _read_cache(Path(path))["state_dict"]


def _check_fits(policy: torch.nn.Module, path: Path, state: Any) -> None:
    """UnreadableFileError unless ``state`` has exactly ``policy``'s tensor names and shapes."""
    expected = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    state = state if isinstance(state, dict) else {}
    got = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    if got != expected:
        bad = sorted(set(got) ^ set(expected)) or sorted(k for k in got if got[k] != expected[k])
        raise UnreadableFileError(
            f"warm-start cache {path} does not fit policy.model (first mismatching tensor: "
            f"{bad[0] if bad else '?'}); {_remedy(path)}"
        )


@torch.no_grad()
def greedy_responses(model: torch.nn.Module, task: ArithmeticTask, problems: list) -> torch.Tensor:
    """Greedy responses ``[n, max_response_len]`` to ``problems``, ``model`` in eval mode."""
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
    return responses


def greedy_scores(model: torch.nn.Module, task: ArithmeticTask, problems: list) -> tuple[float, float]:
    """(exact match, chains right in either notation) of greedy decoding on ``problems``."""
    if not problems:
        return 0.0, 0.0
    responses = greedy_responses(model, task, problems)
    exact = float(task.correct(problems, responses).mean())
    return exact, float(task.chains_right(problems, responses).mean())


def _sft_step(
    model, optimizer, task: ArithmeticTask, step: int, ws: WarmStartSection, alt_fraction: float = 0.0
) -> float:
    problems = task.sample_train(ws.batch_size, seeded_generator("warm_start", ws.seed, step))
    alt = None
    if alt_fraction > 0:
        gen = seeded_generator("warm_start_alt", ws.seed, step)
        alt = (torch.rand(ws.batch_size, generator=gen) < alt_fraction).tolist()
    input_ids, labels = task.sft_batch(problems, alt)
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def first_stage(cfg: RecipeConfig) -> RecipeConfig | None:
    """The config of ``policy.warm_start.curriculum``'s first stage, or None without one.

    Its warm start is cached under its own key, so a first stage equal to another preset's warm start shares that file.
    """
    ws = cfg.policy.warm_start
    if ws.curriculum is None:
        return None
    stage = ws.curriculum
    return dataclasses.replace(
        cfg,
        data=cfg.data.model_copy(update={"chain_length": stage.chain_length}),
        policy=cfg.policy.model_copy(
            update={"warm_start": ws.model_copy(update={"steps": stage.steps, "curriculum": None})}
        ),
    )


def train_sft(
    cfg: RecipeConfig, task: ArithmeticTask, *, progress: bool = True, curve_every: int = 0
) -> tuple[torch.nn.Module, float, list[tuple[int, float]]]:
    """The warm start's SFT loop: ``policy.warm_start.steps`` AdamW steps from the untrained policy.

    With a curriculum it starts from the first stage's weights (:func:`first_stage`) with a fresh optimizer, continuing
    its problem stream. Returns the model, the last loss and, with ``curve_every > 0``, ``(step, exact match, chains
    right)`` of held-out greedy decoding every ``curve_every`` steps (it draws no random numbers).
    """
    ws = cfg.policy.warm_start
    model = build_untrained_policy(cfg, task)
    first, offset = first_stage(cfg), 0
    if first is not None:
        path = warm_start(first, build_task(first), progress=progress)
        model.load_state_dict(load_warm_start(path))
        offset = first.policy.warm_start.steps
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    # linear warmup: without it the tiny model often stalls on a plateau for hundreds of steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, ws.warmup_steps)))
    bar = tqdm(range(ws.steps), desc="warm start (SFT)", disable=not progress, leave=False)
    loss, curve = float("nan"), []
    for step in bar:
        loss = _sft_step(model, optimizer, task, offset + step, ws, cfg.data.sft_alt_fraction)
        schedule.step()
        if not torch.isfinite(torch.tensor(loss)):
            raise RecipeError(
                f"warm start: non-finite SFT loss at step {step}; lower policy.warm_start.lr (now {ws.lr})"
            )
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")
        if curve_every and (step + 1) % curve_every == 0:
            curve.append((step + 1, *greedy_scores(model, task, task.eval_problems)))
    bar.close()
    return model, loss, curve


def _say(message: str) -> None:
    """One line on stderr (between progress bars), and in the log."""
    tqdm.write(message, file=sys.stderr)
    logger.info(message)


def warm_start(cfg: RecipeConfig, task: ArithmeticTask, *, progress: bool = True) -> Path:
    """Train (or reuse: only if its key equals this config's) the warm start; its cache path.

    Raises ``UnreadableFileError`` for an unusable file and ``RecipeError`` for an unwritable cache directory.
    """
    path = warm_start_path(cfg)
    key = _cache_key(cfg)
    if path.exists():
        blob = _read_cache(path)
        if blob["key"] == key:
            _check_fits(build_untrained_policy(cfg, task), path, blob["state_dict"])
            _say(f"warm start: reusing {path.resolve()}")
            return path
        logger.warning("warm start: %s has a different key; retraining", path)
    try:  # an unwritable cache directory fails now, not after the training
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)  # a name of its own: runs sharing the cache cannot race on it
    except OSError as err:
        raise _unwritable(path, err) from None
    ws = cfg.policy.warm_start
    _say(
        f"warm start: training {ws.steps} SFT steps once (batch {ws.batch_size}); cached at {path.resolve()} for every "
        f"later run with policy.warm_start.cache_dir={ws.cache_dir} (relative to the working directory: a run from "
        "another directory or clone trains it again unless it points there)"
    )
    t0 = time.perf_counter()
    model, loss, _ = train_sft(cfg, task, progress=progress)
    acc, chains = greedy_scores(model, task, task.eval_problems)
    _say(
        f"warm start: {ws.steps} steps in {time.perf_counter() - t0:.0f} s, loss {loss:.4f}, "
        f"held-out greedy accuracy {acc:.3f} (chains right in either notation: {chains:.3f})"
    )
    blob = {
        "state_dict": model.state_dict(),
        "key": key,
        "greedy_accuracy": acc,
        "chain_accuracy": chains,
        "final_loss": loss,
    }
    try:
        atomic_torch_save(blob, path)
    except OSError as err:
        raise _unwritable(path, err) from None
    return path


def _unwritable(path: Path, err: OSError) -> RecipeError:
    return RecipeError(
        f"warm-start cache {path} cannot be written ({err.strerror or err}); choose a "
        "writable directory with policy.warm_start.cache_dir=<dir>"
    )
