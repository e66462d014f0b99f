# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The core of the vLLM refit patch, shared by every format: names, markers, the pair loop.

The patch wraps :data:`TARGET_MODULE`'s ``load_weights``: what the engine holds quantized goes through ONE
:class:`~nemo_ais.refit.stream.RefitStream` (:func:`engine_pairs`), the rest through upstream (:func:`upstream_pairs`).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from nemo_ais.refit.stream import RefitStream

TARGET_MODULE = "nemo_rl.models.generation.vllm.quantization.fp8"
# NeMo-RL v0.7.0 (and main): the functions the patch replaces or calls, with their signatures.
RECORDED_SIGNATURES = {
    f"{TARGET_MODULE}.load_weights": "(weights, model_runner)",
    f"{TARGET_MODULE}._is_fp8_weight": "(name, model)",
    f"{TARGET_MODULE}.is_fp8_model": "(vllm_config)",  # NVFP4: wrapped too
    f"{TARGET_MODULE}._get_module_from_param_name": "(model, name: str)",  # NVFP4: its layers
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension._load_weights": "(self, weights)",
}
PATCHED = "__nemo_ais_refit__"
"""Attribute set on every wrapper the patch installs (installing twice is a no-op)."""

Passthrough = Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


def check_signatures(module: Any, names: Iterable[str], recorded: dict[str, str], fix: str) -> None:
    """Raise ``RuntimeError`` (naming both) if a function of ``module`` is not as ``recorded``."""
    for name in names:
        fn = getattr(module, name, None)
        found = "<missing>" if fn is None else str(inspect.signature(fn))
        want = recorded[f"{TARGET_MODULE}.{name}"]
        if found != want:
            raise RuntimeError(f"{module.__name__}.{name}: signature {found}, recorded {want} {fix}")


def patch(module: Any, name: str, wrapper: Callable) -> None:
    """Replace ``module.<name>`` by ``wrapper`` (marked :data:`PATCHED`, ``__wrapped__`` set)."""
    setattr(wrapper, PATCHED, True)
    wrapper.__wrapped__ = getattr(module, name)
    setattr(module, name, wrapper)


def unchanged(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The pair itself: what a tensor the engine holds in BF16 becomes."""
    yield name, tensor


class _Collector:
    """The model as upstream's ``load_weights`` sees it, except that loading collects."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.pairs: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pairs.extend((name, tensor) for name, tensor in weights)

    def __getattr__(self, name: str) -> Any:  # module tree, packed_modules_mapping, ...
        return getattr(self._model, name)


def upstream_pairs(upstream_load_weights: Callable, model: Any) -> Passthrough:
    """``(name, tensor)`` -> the pairs upstream's ``load_weights`` would load for it."""
    collector = _Collector(model)
    runner = types.SimpleNamespace(model=collector)

    def pairs(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        upstream_load_weights([(name, tensor)], runner)
        out, collector.pairs = collector.pairs, []
        return out

    return pairs


def engine_pairs(
    weights: Iterable[tuple[str, torch.Tensor]],
    holds: Callable[[str], bool],
    stream: RefitStream,
    passthrough: Passthrough = unchanged,
) -> Iterator[tuple[str, torch.Tensor]]:
    """One refit chunk -> vLLM ``load_weights`` pairs, quantizing what the engine ``holds`` so.

    Raises:
        ValueError: the engine holds ``name`` quantized but the stream would keep it in BF16,
            or the stream's own errors (NaN/Inf, TP shard, fused siblings, W4A4 input amax).
    """
    for name, tensor in weights:
        if not holds(name):  # kept in BF16 by the engine: checked as the stream checks its own
            stream.check_kept(name, tensor)
            yield from passthrough(name, tensor)
            continue
        entry = stream.plan(name, tensor)
        if entry.action == "keep":
            raise ValueError(
                f"{name}: the vLLM engine holds it in {stream.config.format} but the refit stream would keep it in "
                f"BF16 ({entry.reason}); align the engine's layers kept in BF16 with the refit section (ignore, "
                "ignored_layer_kws, keep_patterns, num_first/last_layers_in_bf16)"
            )
        yield from stream.push(name, tensor)
    yield from stream.flush()  # expert stacks are not held across chunks
    stream.end_chunk()  # the chunk's buffers are reused: copy the shards still held
