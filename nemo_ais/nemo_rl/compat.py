# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The NeMo-RL versions ``nemo_ais.nemo_rl`` supports, and what differs between them.

Supported: NeMo-RL **v0.7.0** (81aa43d) and **main** (checked at 7ea279a). Main still reports ``0.6.0``, so versions are
told apart by feature probes. Every difference the adapter depends on is answered here:

====================================== ==================== ===========================
difference                              v0.7.0               main
====================================== ==================== ===========================
``loss/interfaces.MetricNormalizer``    absent (strings)     enum: :func:`normalizer`
``ClippedPGLossFn.__init__`` flags      ``cfg`` only         :func:`loss_init_kwargs`
``MasterConfig.grpo``                   ``TypedDict`` (dict) pydantic: :func:`grpo_option`
``CheckpointManager`` context manager   no                   :func:`training_context`
after training (``run_grpo.py``)        nothing              :func:`shutdown_after_training`
====================================== ==================== ===========================

Not supported on main: the split train-step API (``begin_train_step``, TransferQueue's
``TQPolicy``): the prepare step needs the whole global batch before the first loss call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

# version name -> what exactly is supported (the launch guard prints it)
SUPPORTED = {
    "v0.7.0": "NeMo-RL v0.7.0 (tag v0.7.0, commit 81aa43d)",
    "main": "NeMo-RL main (checked at commit 7ea279a, 2026-08-22)",
}


class UnsupportedNeMoRLError(RuntimeError):
    """The importable NeMo-RL is neither v0.7.0 nor main as nemo_ais knows them."""


class NeMoRLVersion(NamedTuple):
    """What :func:`detect` found."""

    name: str  # a key of SUPPORTED
    version_string: str  # nemo_rl.package_info.__version__ (main still says 0.6.0)
    location: str  # where nemo_rl was imported from


def _probes() -> dict[str, bool]:
    """The interface facts that tell the supported versions apart (imports loss modules)."""
    from nemo_rl.algorithms.loss import interfaces
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn

    init = inspect.signature(ClippedPGLossFn.__init__).parameters
    return {
        "MetricNormalizer": hasattr(interfaces, "MetricNormalizer"),
        "use_fused_linear_logprobs": "use_fused_linear_logprobs" in init,
    }


@functools.cache
def detect() -> NeMoRLVersion:
    """Which supported NeMo-RL is importable (UnsupportedNeMoRLError, ModuleNotFoundError)."""
    import nemo_rl
    from nemo_rl import package_info

    found = _probes()
    where = str(next(iter(nemo_rl.__path__), "?"))
    if all(found.values()):
        return NeMoRLVersion("main", package_info.__version__, where)
    if not any(found.values()) and package_info.__version__.startswith("0.7.0"):
        return NeMoRLVersion("v0.7.0", package_info.__version__, where)
    raise UnsupportedNeMoRLError(
        f"NeMo-RL {package_info.__version__} at {where} is not supported: its interfaces "
        f"{found} match neither {' nor '.join(SUPPORTED.values())}. Use one of those "
        "(nemo_ais/nemo_rl/compat.py lists what differs between them)."
    )


def require_supported() -> NeMoRLVersion:
    """The launch guard: the version, or ``UnsupportedNeMoRLError`` naming the supported ones."""
    return detect()


def normalizer(kind: str) -> Any:
    """``tokens`` / ``sequences`` / ``none`` as NeMo-RL spells it (main: ``MetricNormalizer``)."""
    if kind not in ("tokens", "sequences", "none"):
        raise ValueError(f"metric normaliser {kind!r}: expected tokens, sequences or none")
    from nemo_rl.algorithms.loss import interfaces

    enum = getattr(interfaces, "MetricNormalizer", None)
    return kind if enum is None else enum[kind.upper()]


def loss_init_kwargs(loss_fn: Any) -> dict[str, Any]:
    """The flags ``setup()`` passed to ``ClippedPGLossFn(cfg, ...)``, read back from the instance.

    Raises:
        TypeError: a keyword of ``__init__`` is not stored on ``loss_fn`` (re-check upstream).
    """
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn

    params = list(inspect.signature(ClippedPGLossFn.__init__).parameters)[2:]  # self, cfg
    missing = [p for p in params if not hasattr(loss_fn, p)]
    if missing:
        raise TypeError(
            f"ClippedPGLossFn.__init__ takes {missing} but the loss setup() returned does not "
            "store them: re-check nemo_ais/nemo_rl/compat.py against this NeMo-RL"
        )
    return {p: getattr(loss_fn, p) for p in params}


def upstream_quantizes_mx(fp8_module: Any) -> bool:
    """True when upstream's FP8 refit config (``fp8_module.global_fp8_config``) is MXFP8 (main)."""
    return bool(getattr(getattr(fp8_module, "global_fp8_config", None), "is_mx", False))


def grpo_option(config: Any, key: str, default: Any = None) -> Any:
    """``master_config.grpo[key]``: a pydantic model on main, a dict on v0.7.0."""
    grpo = config.grpo
    value = grpo.get(key, default) if isinstance(grpo, Mapping) else getattr(grpo, key, default)
    if value is not None and not isinstance(value, Mapping) and hasattr(value, "model_dump"):
        return value.model_dump()  # nested sections (async_grpo) as dicts, as on v0.7.0
    return value


def training_context(checkpointer: Any) -> contextlib.AbstractContextManager:
    """``with checkpointer:`` where it is a context manager (main: flushes saves), else a no-op."""
    if hasattr(checkpointer, "__enter__") and hasattr(checkpointer, "__exit__"):
        return checkpointer
    return contextlib.nullcontext()


def shutdown_after_training(task_to_env: Any, val_task_to_env: Any, policy_generation: Any) -> None:
    """What main's ``run_grpo.py`` does after training (stop environments, engines)."""
    from nemo_rl.algorithms import grpo

    shutdown_environments = getattr(grpo, "shutdown_environments", None)
    if shutdown_environments is None:
        return
    shutdown_environments(task_to_env, val_task_to_env)
    try:
        policy_generation.shutdown()
    except Exception as error:  # upstream prints and goes on
        print(f"Error shutting down generation: {error}", flush=True)
