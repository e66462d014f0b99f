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
"""FP8 refit seam: the vLLM worker quantizes synced weights with :mod:`nemo_ais.fp8`.

NeMo-RL quantizes the BF16 weights it streams into an FP8 vLLM engine inside the vLLM
worker process: ``VllmInternalWorkerExtension`` (``_load_weights`` on v0.7.0,
``_load_hf_weights`` on main) calls
``nemo_rl.models.generation.vllm.quantization.fp8.load_weights(weights, model_runner)``,
which casts every tensor the engine holds in FP8 (``_is_fp8_weight``) with its own
blockwise quantizer. NeMo-RL offers no seam for another quantizer: the vLLM
``worker_extension_cls`` is hard-coded. So this module WRAPS that ONE module attribute,
in the vLLM worker process only, after checking the recorded upstream signatures
(:data:`RECORDED_SIGNATURES`, the same on v0.7.0 and main; a mismatch raises instead of
patching):

* :func:`refit_pairs` -- for each ``(name, tensor)`` the engine holds in FP8, the pairs of
  :func:`nemo_ais.fp8.fp8_weight_stream` (``(name, q_fp8)``, ``(name_scale_inv, scale)``,
  canonical scale family, zero padding, NaN/Inf refused, TP shard checked); every other
  tensor goes to the ``passthrough`` (default: unchanged). One tensor at a time (no
  materialised model).
* :func:`install` -- wraps ``fp8.load_weights`` with :func:`ais_load_weights` (idempotent).
  What the wrapper does not quantize itself goes to upstream's own function, tensor by
  tensor: every tensor the engine does not hold as an FP8 linear weight (on main that
  includes the grouped MoE expert slabs, which upstream expands to per-expert FP8), and
  the whole stream when upstream's FP8 config is MXFP8 (main's ``is_mx``; nemo_ais.fp8
  quantizes 128x128 blocks only).
* :func:`install_on_import` -- a ``sys.meta_path`` hook that runs :func:`install` when
  the vLLM worker process imports that module. It is armed by
  ``nemo_ais/nemo_rl/_vllm_hook/sitecustomize.py`` when the environment variable
  :data:`ENV_VAR` (the JSON of a :class:`~nemo_ais.fp8.Fp8SyncConfig`) is set;
  ``launchers/run_grpo_ais.py`` sets both from the ``ais_fp8_refit`` config section.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from nemo_ais.config import require_config
from nemo_ais.fp8 import Fp8SyncConfig, fp8_weight_stream

__all__ = [
    "ENV_VAR",
    "RECORDED_SIGNATURES",
    "TARGET_MODULE",
    "ais_load_weights",
    "check_signatures",
    "config_from_env",
    "install",
    "install_on_import",
    "refit_pairs",
]

logger = logging.getLogger(__name__)

TARGET_MODULE = "nemo_rl.models.generation.vllm.quantization.fp8"
ENV_VAR = "NEMO_AIS_FP8_REFIT"
# NeMo-RL v0.7.0: the functions the patch replaces or calls, with their signatures.
RECORDED_SIGNATURES = {
    f"{TARGET_MODULE}.load_weights": "(weights, model_runner)",
    f"{TARGET_MODULE}._is_fp8_weight": "(name, model)",
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension._load_weights": (
        "(self, weights)"
    ),
}
_PATCHED = "__nemo_ais_refit__"


def check_signatures(
    module: Any, names: Iterable[str] = ("load_weights", "_is_fp8_weight")
) -> None:
    """Raise if an upstream function differs from :data:`RECORDED_SIGNATURES`.

    Raises:
        RuntimeError: naming the function, the recorded and the found signature.
    """
    for name in names:
        qualname = f"{module.__name__}.{name}"
        fn = getattr(module, name, None)
        found = "<missing>" if fn is None else str(inspect.signature(fn))
        recorded = RECORDED_SIGNATURES[f"{TARGET_MODULE}.{name}"]
        if found != recorded:
            raise RuntimeError(
                f"{qualname}: signature {found}, recorded {recorded} (NeMo-RL v0.7.0). The AIS "
                "FP8 refit patch targets v0.7.0; re-check nemo_ais/nemo_rl/refit.py against "
                f"this NeMo-RL version or unset {ENV_VAR}."
            )


def _unchanged(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    yield name, tensor


def refit_pairs(
    weights: Iterable[tuple[str, torch.Tensor]],
    is_fp8_weight: Callable[[str], bool],
    config: Fp8SyncConfig,
    passthrough: Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]] = _unchanged,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` -> vLLM ``load_weights`` pairs, quantizing what the engine holds in FP8.

    Args:
        weights: the refit stream.
        is_fp8_weight: True for names the engine holds as FP8 linear weights.
        config: the quantizer's settings.
        passthrough: the pairs of every other tensor (default: the tensor unchanged;
            :func:`ais_load_weights` hands them to upstream's ``load_weights``).

    Raises:
        ValueError: the engine holds ``name`` in FP8 but the stream would keep it in BF16
            (the two layouts disagree), or the stream's own errors (NaN/Inf, TP shard).
    """
    for name, tensor in weights:
        if not is_fp8_weight(name):
            yield from passthrough(name, tensor)
            continue
        pairs = list(fp8_weight_stream([(name, tensor)], config))
        if len(pairs) != 2:
            raise ValueError(
                f"{name}: the vLLM engine holds it in FP8 but nemo_ais.fp8 would keep it in "
                f"BF16 ({list(tensor.shape)} {tensor.dtype}); align the engine's FP8 layers "
                "with the refit stream's rules (num_first/last_layers_in_bf16, keep_patterns)"
            )
        yield from pairs


class _Collector:
    """The model as upstream's ``load_weights`` sees it, except that loading collects."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.pairs: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pairs.extend((name, tensor) for name, tensor in weights)

    def __getattr__(self, name: str) -> Any:  # module tree, packed_modules_mapping, ...
        return getattr(self._model, name)


def _upstream_pairs(upstream_load_weights: Callable, model: Any) -> Callable:
    """``(name, tensor)`` -> the pairs upstream's ``load_weights`` would load for it."""
    collector = _Collector(model)
    runner = types.SimpleNamespace(model=collector)

    def pairs(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        upstream_load_weights([(name, tensor)], runner)
        out, collector.pairs = collector.pairs, []
        return out

    return pairs


def ais_load_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    model_runner: Any,
    *,
    config: Fp8SyncConfig,
    is_fp8_weight: Callable[[str, Any], bool],
    upstream_load_weights: Callable[[Any, Any], None] | None = None,
) -> None:
    """NeMo-RL's ``fp8.load_weights`` with nemo_ais.fp8 as the FP8 linear-weight quantizer.

    Streams into ONE ``model.load_weights`` call: the FP8 linear weights quantized by
    :func:`refit_pairs`, every other tensor as ``upstream_load_weights`` turns it into
    pairs (None: unchanged).
    """
    model = model_runner.model
    passthrough = _unchanged
    if upstream_load_weights is not None:
        passthrough = _upstream_pairs(upstream_load_weights, model)
    model.load_weights(
        refit_pairs(weights, lambda name: is_fp8_weight(name, model), config, passthrough)
    )


def _upstream_quantizes_mx(module: Any) -> bool:
    """True when upstream's FP8 config is MXFP8 (main's ``is_mx``; absent on v0.7.0)."""
    return bool(getattr(getattr(module, "global_fp8_config", None), "is_mx", False))


def install(module: Any, config: Fp8SyncConfig) -> bool:
    """Wrap ``module.load_weights`` (NeMo-RL's FP8 refit) with :func:`ais_load_weights`.

    The wrapper calls upstream's own function for the whole stream when upstream's FP8
    config is MXFP8, else for every tensor that is not an FP8 linear weight.

    Returns:
        True if patched now, False if it already was.

    Raises:
        RuntimeError: the upstream signatures differ from the recorded ones.
        TypeError: ``config`` is not an :class:`Fp8SyncConfig` (a dict: ``Fp8SyncConfig(**d)``).
    """
    require_config(config, Fp8SyncConfig, "install(config)")
    if getattr(module.load_weights, _PATCHED, False):
        return False
    check_signatures(module)
    original = module.load_weights

    def load_weights(weights, model_runner):
        if _upstream_quantizes_mx(module):  # MXFP8: upstream's quantizer, unchanged
            return original(weights, model_runner)
        return ais_load_weights(
            weights,
            model_runner,
            config=config,
            is_fp8_weight=module._is_fp8_weight,
            upstream_load_weights=original,
        )

    setattr(load_weights, _PATCHED, True)
    load_weights.__wrapped__ = original
    module.load_weights = load_weights
    logger.info("nemo_ais: %s.load_weights now quantizes with nemo_ais.fp8", module.__name__)
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, config: Fp8SyncConfig):
        self.inner, self.config = inner, config

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        install(module, self.config)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, config: Fp8SyncConfig):
        self.target, self.config = target, config

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)  # find the real spec without recursing into this hook
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.config)
        return spec


def install_on_import(config: Fp8SyncConfig, target: str = TARGET_MODULE) -> None:
    """Patch ``target`` when it is imported (now, if it already is).

    Raises:
        TypeError: ``config`` is not an :class:`Fp8SyncConfig` (checked now, not at import).
    """
    require_config(config, Fp8SyncConfig, "install_on_import(config)")
    module = sys.modules.get(target)
    if module is not None:
        install(module, config)
        return
    if not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, config))


def config_from_env(environ: dict[str, str] | None = None) -> Fp8SyncConfig | None:
    """The :class:`Fp8SyncConfig` in :data:`ENV_VAR` (None when unset)."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR)
    if not raw:
        return None
    return Fp8SyncConfig.model_validate(json.loads(raw))
