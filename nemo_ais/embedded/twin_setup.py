# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The twin's default model and batch, shared by ``nemo-ais attribute`` and ``benchmarks/bench_fp8_twin.py``."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from nemo_ais.embedded.config import RecipeConfig
from nemo_ais.embedded.recipe import build_policy
from nemo_ais.embedded.warmstart import build_task, warm_start, warm_start_path


class TwinSetup(NamedTuple):
    """A model (fp32, eval mode) and a prompt batch (``ids``, ``mask`` ``[B, P]``) for the twin."""

    model: nn.Module
    ids: torch.Tensor
    mask: torch.Tensor
    max_new_tokens: int
    eos: int
    pad: int
    what: str
    warm_started: bool


def twin_setup(
    cfg: RecipeConfig,
    num_prompts: int = 64,
    *,
    train_warm_start: bool = False,
    progress: bool = False,
    warm_start_cfg: RecipeConfig | None = None,
) -> TwinSetup:
    """The policy of ``cfg`` (warm-started if cached) and ``num_prompts`` held-out prompts.

    ``warm_start_cfg`` (default ``cfg``): the config whose warm start the run trained (for an arm, the base config's, as
    ``nemo-ais run`` does; an arm's own ``data.reward`` would give another cache file). Raises ``ValueError`` for
    ``num_prompts`` outside ``[1, data.eval_size]`` and ``UnreadableFileError`` for an unusable warm-start cache file.
    """
    ws_cfg = cfg if warm_start_cfg is None else warm_start_cfg
    if not 1 <= num_prompts <= cfg.data.eval_size:
        raise ValueError(f"num_prompts={num_prompts} is invalid: expected 1 to data.eval_size={cfg.data.eval_size}")
    task = build_task(cfg)
    warm = ws_cfg.policy.warm_start.steps > 0 and (train_warm_start or warm_start_path(ws_cfg).is_file())
    warm_file = warm_start(ws_cfg, task, progress=progress) if warm else None
    policy = build_policy(cfg, task, warm_file).eval()
    ids = task.prompt_ids(task.eval_problems[:num_prompts])
    m = cfg.policy.model
    state = "warm-started" if warm else "random init (no warm-start cache)"
    return TwinSetup(
        model=policy,
        ids=ids,
        mask=torch.ones_like(ids),
        max_new_tokens=task.max_response_len,
        eos=task.tokenizer.eos_id,
        pad=task.tokenizer.pad_id,
        what=f"embedded Qwen2 (hidden {m.hidden_size}, {m.num_hidden_layers} layers), {state}, "
        f"{num_prompts} held-out {cfg.data.task} prompts",
        warm_started=warm,
    )
