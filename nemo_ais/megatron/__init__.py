# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Megatron-Core process-group getters used by the NeMo-RL seam (megatron imported lazily).

The AIS statistics are summed over the group NeMo-RL's Megatron worker sums ``global_valid_toks`` over, never WORLD
(it spans TP and PP ranks holding identical data).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MEGATRON_INSTALL_HINT", "get_data_parallel_group", "get_data_parallel_world_size", "is_pipeline_last_stage"]

MEGATRON_INSTALL_HINT = (
    "megatron-core is required for nemo_ais.megatron: `pip install nemo-ais[megatron]` "
    "(or run inside NeMo-RL's Megatron worker environment)"
)


def _parallel_state() -> Any:
    try:
        from megatron.core import parallel_state
    except ImportError as err:  # pragma: no cover - exercised only without megatron-core
        raise ImportError(MEGATRON_INSTALL_HINT) from err
    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError(
            "megatron.core.parallel_state is not initialized: the AIS statistics can only be "
            "reduced inside a Megatron worker (after initialize_model_parallel)"
        )
    return parallel_state


def get_data_parallel_group() -> Any:
    """Megatron's data-parallel group (without context-parallel ranks): the AIS reduce group."""
    return _parallel_state().get_data_parallel_group(with_context_parallel=False)


def get_data_parallel_world_size() -> int:
    """Size of :func:`get_data_parallel_group`."""
    return _parallel_state().get_data_parallel_world_size(with_context_parallel=False)


def is_pipeline_last_stage() -> bool:
    """True on the pipeline stage that computes the loss (virtual stages ignored)."""
    return _parallel_state().is_pipeline_last_stage(ignore_virtual=True)
