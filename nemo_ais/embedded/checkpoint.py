# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Atomic checkpoints of one (arm, seed) run: policy, optimizer, AIS state, RNG, step.

Rank 0 saves to :func:`checkpoint_path` through a temporary file and ``os.replace``; every rank loads it on resume
(exact: docs/embedded.md). An unreadable file raises :class:`UnreadableFileError`; nothing is deleted.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nemo_ais.embedded.dist import RecipeError

# What a run checkpoint holds (see save_checkpoint); a file without one of these is rejected.
CHECKPOINT_KEYS = ("step", "finished", "policy", "optimizer", "ais_state", "torch_rng_state")
# Longest excerpt of the underlying error kept in a one-line message.
_MAX_CAUSE_CHARS = 160


class UnreadableFileError(RecipeError):
    """A checkpoint or cache file exists but cannot be used; the message names it and the fix."""


def error_cause(err: BaseException) -> str:
    """``Type: first sentence of the message``, at most ``_MAX_CAUSE_CHARS`` characters."""
    first = (str(err).strip().splitlines() or [""])[0].split(". ")[0]
    if len(first) > _MAX_CAUSE_CHARS:
        first = first[: _MAX_CAUSE_CHARS - 3] + "..."
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def checkpoint_path(run_dir: Path, arm: str, seed: int) -> Path:
    """``<run_dir>/checkpoints/<arm>/seed<seed>/latest.pt``."""
    return Path(run_dir) / "checkpoints" / arm / f"seed{seed}" / "latest.pt"


def atomic_write(path: Path, write: Callable[[str], Any]) -> None:
    """``write(tmp)`` to a temporary file in ``path``'s directory, then rename it over ``path``.

    A kill or a full disk leaves the old file or the new one, never a cut one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


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


def load_file(path: Path, *, what: str, remedy: str, weights_only: bool) -> Any:
    """``torch.load(path)`` on CPU; a failure is one line naming the file, the cause and ``remedy``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as err:  # truncated zip, garbled pickle, EACCES, EISDIR, ...
        raise UnreadableFileError(f"{what} {path} cannot be read ({error_cause(err)}); {remedy}") from None


def checkpoint_remedy(path: Path) -> str:
    """The fix for a bad checkpoint: delete this (arm, seed) run's file, or ``--overwrite``."""
    return (
        f"delete it (rm {path}) to restart only this (arm, seed) run from step 0 (other runs "
        "keep their results), or pass --overwrite to start the whole experiment over"
    )


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The dict :func:`save_checkpoint` wrote at ``path`` (CPU), None if absent; ``UnreadableFileError`` if unusable."""
    if not path.exists():
        return None
    blob = load_file(path, what="checkpoint", remedy=checkpoint_remedy(path), weights_only=False)
    if not isinstance(blob, dict):
        problem = f"holds a {type(blob).__name__}, not a checkpoint dict"
    elif missing := [k for k in CHECKPOINT_KEYS if k not in blob]:
        problem = f"lacks {', '.join(missing)}"
    elif isinstance(blob["step"], bool) or not isinstance(blob["step"], int):
        problem = f"has step={blob['step']!r}, expected an int"
    else:
        return blob
    raise UnreadableFileError(f"checkpoint {path} {problem}; {checkpoint_remedy(path)}")
