# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Import NeMo-RL's REAL Megatron policy worker module (and ours) on a CPU machine.

``nemo_rl.models.policy.workers.megatron_policy_worker`` imports Megatron-Bridge, which is
not installable here (it needs Transformer Engine and ``transformers<5``), and a few names
that megatron-core 0.16.1 lacks (v0.7.0 and main build against newer ones through the
Bridge submodule). :func:`megatron_worker_modules` provides import-time placeholders for exactly
those, imports upstream's module and ``nemo_ais.nemo_rl.workers.megatron`` for real, and
removes every placeholder (and the modules imported on top of them) afterwards.
``megatron_worker_modules(quant=True)`` does the same for NeMo-RL's ModelOpt QAT worker
module (QARL's ``MegatronQuantPolicyWorker``) and ours on it, with ``modelopt.*``
placeholders as well (ModelOpt has no CPU build here).

A placeholder is a class that raises when called or instantiated and records that in
``Placeholder.used``: tests assert it stays empty, i.e. the code path they drive never
executed anything that was not real.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Iterator
from typing import ClassVar

UPSTREAM_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"
OUR_WORKER = "nemo_ais.nemo_rl.workers.megatron"
UPSTREAM_QUANT_WORKER = "nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker"
OUR_QUANT_WORKER = "nemo_ais.nemo_rl.workers.megatron_quant"
# names megatron-core 0.16.1 lacks; imported (never called) by upstream's worker module
# (v0.7.0's and main's; a name the installed megatron-core has is left alone)
MCORE_MISSING = {
    "megatron.core.inference.engines.dynamic_engine": ("EngineState",),
    "megatron.core.transformer.enums": ("InferenceCudaGraphScope",),
    "megatron.core.inference.utils": ("device_memory_summary",),
    # main only
    "megatron.core.dist_checkpointing.strategies.torch": ("get_async_strategy",),
    "megatron.core.distributed.fsdp.mcore_fsdp_adapter": ("FullyShardedDataParallelV1", "FullyShardedDataParallelV2"),
    "megatron.core.resharding.refit": ("prepare_swap_model_weights",),
}
MCORE_MISSING_MODULES = (
    "megatron.core.inference.config",
    "megatron.core.transformer.moe.moe_logging",  # main only
    "megatron.core.inference.shards",  # main only
)


class Placeholder:
    """Base of every placeholder class: calling one is recorded and raises."""

    used: ClassVar[list[str]] = []

    def __new__(cls, *args, **kwargs):
        Placeholder.used.append(cls.__qualname__)
        raise RuntimeError(f"{cls.__qualname__} is an import placeholder (no CPU build)")


def _placeholder(module: str, name: str) -> type:
    return type(name, (Placeholder,), {"__module__": module, "__qualname__": f"{module}.{name}"})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


def _is_modelopt(fullname: str) -> bool:
    return fullname == "modelopt" or fullname.startswith("modelopt.")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``megatron.bridge.*`` and the megatron-core modules NeMo-RL needs but 0.16.1 lacks;
    with ``modelopt=True`` also ``modelopt.*`` (NVIDIA ModelOpt: no CPU build here)."""

    def __init__(self, modelopt: bool = False) -> None:
        self.created: list[str] = []
        self.modelopt = modelopt

    def find_spec(self, fullname, path, target=None):
        placeholder = fullname.startswith("megatron.bridge") or fullname in MCORE_MISSING_MODULES
        if placeholder or (self.modelopt and _is_modelopt(fullname)):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        self.created.append(module.__name__)


@contextlib.contextmanager
def placeholder_imports() -> Iterator[list[str]]:
    """Import-time placeholders for ``megatron.bridge.*`` while the block runs (the modules
    imported under it keep theirs; for a spawned rank that imports one upstream module)."""
    finder = _PlaceholderFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield finder.created
    finally:
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def megatron_worker_modules(quant: bool = False) -> Iterator[types.SimpleNamespace]:
    """Yield ``(upstream=<upstream worker module>, ours=<our worker module>, placeholders)``.

    ``quant=True``: NeMo-RL's ModelOpt QAT worker module (``MegatronQuantPolicyWorker``,
    QARL) and ours on it, with ``modelopt.*`` placeholders too; ``base`` is then upstream's
    BF16 worker module it imports.
    """
    finder = _PlaceholderFinder(modelopt=quant)
    sys.meta_path.insert(0, finder)
    added = []
    before = set(sys.modules)
    try:
        for module, names in MCORE_MISSING.items():
            mod = importlib.import_module(module)
            for name in names:
                if not hasattr(mod, name):
                    setattr(mod, name, _placeholder(module, name))
                    added.append((mod, name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = importlib.import_module(UPSTREAM_WORKER)
            upstream = importlib.import_module(UPSTREAM_QUANT_WORKER) if quant else base
            ours = importlib.import_module(OUR_QUANT_WORKER if quant else OUR_WORKER)
        yield types.SimpleNamespace(upstream=upstream, ours=ours, base=base, placeholders=finder.created)
    finally:
        sys.meta_path.remove(finder)
        for mod, name in added:
            delattr(mod, name)
        for name in set(sys.modules) - before:  # nothing else may see the placeholders
            if name.startswith(("megatron.bridge", "nemo_rl.", "nemo_ais.nemo_rl.workers")):
                sys.modules.pop(name, None)
            elif _is_modelopt(name):
                sys.modules.pop(name, None)
        for name in MCORE_MISSING_MODULES:
            sys.modules.pop(name, None)
