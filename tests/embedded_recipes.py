# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A tiny, set-up ``GRPORecipe`` on quick.yaml for the recipe's unit tests (one process)."""

from __future__ import annotations

from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
from nemo_ais.embedded.dist import DistContext
from nemo_ais.embedded.recipe import GRPORecipe

# 4 prompts x 4 samples in two chunks, no warm start, no checkpoints, one rank
TINY_OVERRIDES = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "rollout.prompts_per_chunk=2",
    "data.eval_size=8",
    "policy.warm_start.steps=0",
    "checkpointing.enabled=false",
    "cluster.dp_size=1",
]


def tiny_recipe(run_dir, *extra: str, arm: str = "fp8-ais") -> GRPORecipe:
    """quick.yaml with :data:`TINY_OVERRIDES` and ``extra``, arm ``arm``, seed 0, set up."""
    raw = load_config(CONFIG_DIR / "quick.yaml", [*TINY_OVERRIDES, *extra])
    recipe = GRPORecipe(
        resolve_arm(raw, arm), arm=arm, seed=0, ctx=DistContext(0, 1, None), run_dir=run_dir, warm_start_file=None
    )
    recipe.setup()
    return recipe
