# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""FP8 refit seam: the vLLM worker quantizes synced weights with :mod:`nemo_ais.refit`.

NeMo-RL's vLLM worker extension (hard-coded ``worker_extension_cls``) refits an FP8 engine
through ``nemo_rl.models.generation.vllm.quantization.fp8.load_weights``, which quantizes
with upstream's own blockwise quantizer. This module WRAPS that ONE attribute, in the vLLM
worker process only, after checking :data:`RECORDED_SIGNATURES` (v0.7.0 and main):

* :func:`refit_pairs` -- the :class:`~nemo_ais.refit.stream.RefitStream` pairs of each
  tensor the engine holds in FP8; every other tensor goes to ``passthrough``.
* :func:`install` -- wraps ``load_weights`` (idempotent); upstream's own function handles
  what the engine does not hold as an FP8 linear weight (grouped MoE slabs on main) and
  the whole stream when its FP8 config is MXFP8 (main's ``is_mx``).
* :func:`install_on_import` / :func:`patched_spec` -- a ``sys.meta_path`` hook, armed in
  every Ray worker by ``_vllm_hook/sitecustomize.py`` when :data:`ENV_VAR` (the JSON of an
  :class:`~nemo_ais.refit.config.Fp8SyncConfig`) is set (``launchers/run_grpo_ais.py``
  sets it from ``ais_fp8_refit``).
* :func:`require_active` -- the driver asks every vLLM worker process (:func:`hook_status`)
  and stops the run where the refit would use NeMo-RL's quantizer.

The same hook carries the NVFP4 / MXFP8 refit (:mod:`nemo_ais.nemo_rl.refit_block`,
``NEMO_AIS_BLOCK_REFIT``; :func:`refit_config_from_env` reads either).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch

from nemo_ais.config import require_config
from nemo_ais.nemo_rl import compat, vllm_refit
from nemo_ais.nemo_rl.vllm_refit import (
    PATCHED,
    RECORDED_SIGNATURES,
    TARGET_MODULE,
    engine_pairs,
    unchanged,
    upstream_pairs,
)
from nemo_ais.refit.stream import BlockSyncConfig, Fp8SyncConfig, RefitStream

__all__ = [
    "ENV_VAR",
    "RECORDED_SIGNATURES",
    "TARGET_MODULE",
    "HookStatus",
    "ais_load_weights",
    "check_signatures",
    "config_from_env",
    "decide_backend",
    "hook_status",
    "install",
    "install_on_import",
    "patched_spec",
    "refit_config_from_env",
    "refit_pairs",
    "require_active",
]

logger = logging.getLogger(__name__)

ENV_VAR = "NEMO_AIS_FP8_REFIT"
BLOCK_ENV_VAR = "NEMO_AIS_BLOCK_REFIT"  # nemo_ais.nemo_rl.refit_block.ENV_VAR


def check_signatures(
    module: Any, names: Iterable[str] = ("load_weights", "_is_fp8_weight")
) -> None:
    """Raise ``RuntimeError`` if an upstream function differs from :data:`RECORDED_SIGNATURES`."""
    fix = (
        "(NeMo-RL v0.7.0). The AIS FP8 refit patch targets v0.7.0; re-check "
        f"nemo_ais/nemo_rl/refit.py against this NeMo-RL version or unset {ENV_VAR}."
    )
    vllm_refit.check_signatures(module, names, RECORDED_SIGNATURES, fix)


def refit_pairs(
    weights: Iterable[tuple[str, torch.Tensor]],
    is_fp8_weight: Callable[[str], bool],
    config: Fp8SyncConfig,
    passthrough: Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]] = unchanged,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` -> vLLM ``load_weights`` pairs, quantizing what the engine holds in FP8.

    Raises:
        ValueError: the engine holds ``name`` in FP8 but the stream would keep it in BF16, or
            the stream's own errors (NaN/Inf, TP shard).
    """
    return engine_pairs(weights, is_fp8_weight, RefitStream(config), passthrough)


def ais_load_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    model_runner: Any,
    *,
    config: Fp8SyncConfig,
    is_fp8_weight: Callable[[str, Any], bool],
    upstream_load_weights: Callable[[Any, Any], None] | None = None,
) -> None:
    """NeMo-RL's ``fp8.load_weights`` by :func:`refit_pairs`, in ONE ``model.load_weights``."""
    model = model_runner.model
    passthrough = unchanged
    if upstream_load_weights is not None:
        passthrough = upstream_pairs(upstream_load_weights, model)
    model.load_weights(
        refit_pairs(weights, lambda name: is_fp8_weight(name, model), config, passthrough)
    )


def decide_backend(config: Fp8SyncConfig) -> Fp8SyncConfig:
    """``backend: auto`` decided once per process (``te`` or ``torch``), not once per tensor."""
    if config.backend != "auto":
        return config
    from nemo_ais.formats import te_backend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe = torch.empty(0, device=device)
    te = te_backend.use_te(probe, "auto", family=config.family, block=config.block)
    return config.model_copy(update={"backend": "te" if te else "torch"})


def _require_refit_config(config: Any, where: str) -> None:
    if not isinstance(config, BlockSyncConfig):
        require_config(config, Fp8SyncConfig, where)


def install(module: Any, config: Fp8SyncConfig | BlockSyncConfig) -> bool:
    """Wrap ``module.load_weights`` with :func:`ais_load_weights`; False if already patched.

    A :class:`BlockSyncConfig` installs :func:`nemo_ais.nemo_rl.refit_block.install` instead.

    Raises:
        RuntimeError: the upstream signatures differ from the recorded ones.
        TypeError: ``config`` is not an :class:`Fp8SyncConfig`.
    """
    if isinstance(config, BlockSyncConfig):
        from nemo_ais.nemo_rl import refit_block

        return refit_block.install(module, config)
    require_config(config, Fp8SyncConfig, "install(config)")
    if getattr(module.load_weights, PATCHED, False):
        return False
    try:
        check_signatures(module)
    except RuntimeError as err:
        logger.warning("nemo_ais: AIS FP8 refit NOT installed in pid %d: %s", os.getpid(), err)
        raise
    config = decide_backend(config)  # once per process, not once per tensor
    original = module.load_weights

    def load_weights(weights, model_runner):
        if compat.upstream_quantizes_mx(module):  # MXFP8: upstream's quantizer, unchanged
            return original(weights, model_runner)
        return ais_load_weights(
            weights,
            model_runner,
            config=config,
            is_fp8_weight=module._is_fp8_weight,
            upstream_load_weights=original,
        )

    vllm_refit.patch(module, "load_weights", load_weights)
    logger.warning(
        "nemo_ais: %s.load_weights wrapped in pid %d: FP8 linear weights are quantized by "
        "nemo_ais.fp8 (family %s, backend %s)",
        module.__name__,
        os.getpid(),
        config.family,
        config.backend,
    )
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, config: Fp8SyncConfig):
        self.inner, self.config = inner, config

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        install(module, self.config)


def patched_spec(fullname: str, config: Fp8SyncConfig | BlockSyncConfig | None) -> Any:
    """The spec of ``fullname`` whose loader then runs :func:`install` (TypeError: no config)."""
    _require_refit_config(config, "patched_spec(config)")
    ours = [f for f in sys.meta_path if isinstance(f, _Finder) and f.target == fullname]
    for finder in ours:  # find the real spec without recursing into this hook
        sys.meta_path.remove(finder)
    try:
        spec = importlib.util.find_spec(fullname)
    finally:
        sys.meta_path[:0] = ours
    if spec is not None and spec.loader is not None:
        spec.loader = _Loader(spec.loader, config)
    return spec


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, config: Fp8SyncConfig):
        self.target, self.config = target, config

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        return patched_spec(fullname, self.config)


def install_on_import(config: Fp8SyncConfig | BlockSyncConfig, target: str = TARGET_MODULE) -> None:
    """Patch ``target`` when it is imported (now, if it already is); the config is checked now."""
    _require_refit_config(config, "install_on_import(config)")
    module = sys.modules.get(target)
    if module is not None:
        install(module, config)
        return
    if not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, config))


class HookStatus(NamedTuple):
    """The AIS FP8 refit in one process (a vLLM worker), as :func:`hook_status` sees it."""

    pid: int
    host: str
    configured: bool  # NEMO_AIS_FP8_REFIT (or NEMO_AIS_BLOCK_REFIT) set in this process
    armed: bool  # an import hook waits for NeMo-RL's FP8 refit module
    imported: bool  # that module is imported here
    patched: bool  # and its load_weights is ours
    error: str | None  # what the hook raised when the module was imported

    @property
    def active(self) -> bool:
        """The next refit in this process quantizes with nemo_ais.fp8."""
        return self.error is None and (self.patched or (self.armed and not self.imported))

    def problem(self) -> str:
        """Why the refit is not active here ('' if it is)."""
        if self.active:
            return ""
        if self.error is not None:
            return f"the hook failed when NeMo-RL's FP8 module was imported: {self.error}"
        if not self.configured:
            return f"{ENV_VAR} is not set in this process (the launcher's environment did not reach it)"
        if self.imported:
            return f"{TARGET_MODULE}.load_weights is NeMo-RL's own (imported before the hook)"
        return (
            "no hook is armed: nemo_ais/nemo_rl/_vllm_hook/sitecustomize.py did not run "
            "(not on PYTHONPATH, or another sitecustomize earlier on sys.path shadows it)"
        )


def hook_status(worker: Any = None) -> HookStatus:
    """This process's AIS FP8 refit state (``worker``: what vLLM's ``collective_rpc`` passes)."""
    module = sys.modules.get(TARGET_MODULE)
    hooks = [f for f in sys.meta_path if getattr(f, "nemo_ais_fp8_refit", False)]
    finders = [f for f in sys.meta_path if isinstance(f, _Finder) and f.target == TARGET_MODULE]
    error = next((f.error for f in hooks if getattr(f, "error", None)), None)
    return HookStatus(
        pid=os.getpid(),
        host=socket.gethostname(),
        configured=bool(os.environ.get(ENV_VAR) or os.environ.get(BLOCK_ENV_VAR)),
        armed=bool(hooks or finders),
        imported=module is not None,
        patched=module is not None and getattr(module.load_weights, PATCHED, False),
        error=error,
    )


def _engine_statuses(generation_worker: Any) -> list[HookStatus]:
    """On a NeMo-RL vLLM generation worker (Ray actor): every vLLM worker process's status."""
    llm = getattr(generation_worker, "llm", None)
    if llm is None:  # no engine in this actor: the actor's own process
        return [hook_status()]
    return list(llm.collective_rpc(hook_status))


def require_active(policy_generation: Any) -> list[HookStatus]:
    """Ask every vLLM worker process whether the AIS refit is active; return their statuses.

    Raises:
        RuntimeError: naming each generation worker / vLLM process where it is not, and why.
    """
    import ray

    futures = policy_generation.worker_group.run_all_workers_single_data(
        "__ray_call__",
        fn=_engine_statuses,
        run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"],
    )
    per_worker = ray.get(futures)
    problems = [
        f"generation worker {w}, vLLM process {s.pid} on {s.host}: {s.problem()}"
        for w, statuses in enumerate(per_worker)
        for s in statuses
        if not s.active
    ]
    if problems:
        logger.warning("nemo_ais: AIS FP8 refit NOT active: %s", "; ".join(problems))
        raise RuntimeError(
            "ais_fp8_refit (or ais_nvfp4_refit).enabled=true but the AIS refit hook is not "
            "active in every vLLM worker, which would refit with NeMo-RL's own quantizer (or, "
            "NVFP4, not at all):\n  " + "\n  ".join(problems)
        )
    statuses = [s for group in per_worker for s in group]
    logger.warning(
        "nemo_ais: AIS FP8 refit armed in %d vLLM worker processes of %d generation workers",
        len(statuses),
        len(per_worker),
    )
    return statuses


def config_from_env(environ: dict[str, str] | None = None) -> Fp8SyncConfig | None:
    """The :class:`Fp8SyncConfig` in :data:`ENV_VAR` (None when unset)."""
    return vllm_refit.config_from_env(ENV_VAR, Fp8SyncConfig, environ)


def refit_config_from_env(
    environ: dict[str, str] | None = None,
) -> Fp8SyncConfig | BlockSyncConfig | None:
    """The hook's config: :data:`ENV_VAR`'s or ``NEMO_AIS_BLOCK_REFIT``'s (ValueError: both)."""
    from nemo_ais.nemo_rl import refit_block

    fp8, block = config_from_env(environ), refit_block.config_from_env(environ)
    if fp8 is not None and block is not None:
        raise ValueError(
            f"{ENV_VAR} and {BLOCK_ENV_VAR} are both set: the FP8 and the NVFP4/MXFP8 refit "
            "replace the same vLLM refit; set one (ais_fp8_refit or ais_nvfp4_refit)"
        )
    return fp8 if fp8 is not None else block
