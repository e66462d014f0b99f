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
"""Atomic checkpoints of one (arm, seed) run: policy, optimizer, AIS state, RNG, step.

Written by rank 0 as ``<run_dir>/checkpoints/<arm>/seed<seed>/latest.pt`` through a
temporary file and ``os.replace`` (a crash never leaves a half-written checkpoint). Every
rank loads the same file on resume (the DP ranks hold identical replicas).

All randomness of the recipe comes from counter-based generators keyed by
``(seed, step, chunk)`` (:func:`nemo_ais.embedded.task.seeded_generator`), so the RNG
state to restore is only torch's global generator (saved for completeness); this is what
makes "N steps == N/2 + resume + N/2" exact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_torch_save", "checkpoint_path", "load_checkpoint", "save_checkpoint"]


def checkpoint_path(run_dir: Path, arm: str, seed: int) -> Path:
    """``<run_dir>/checkpoints/<arm>/seed<seed>/latest.pt``."""
    return Path(run_dir) / "checkpoints" / arm / f"seed{seed}" / "latest.pt"


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file in ``path``'s directory, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_checkpoint(
    path: Path,
    *,
    step: int,
    finished: bool,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ais_state: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the state after ``step`` completed GRPO steps."""
    atomic_torch_save(
        {
            "step": step,
            "finished": finished,
            "policy": policy.state_dict(),
            "optimizer": optimizer.state_dict(),
            "ais_state": ais_state,
            "torch_rng_state": torch.get_rng_state(),
            "extra": extra or {},
        },
        path,
    )


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None if there is none.

    Raises:
        RuntimeError: the file exists but cannot be read (named, with the fix).
    """
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise RuntimeError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); delete it to "
            "restart this (arm, seed) run from scratch"
        ) from None
