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
"""The NeMo-RL versions ``nemo_ais.nemo_rl`` supports, and what differs between them.

Supported: NeMo-RL **v0.7.0** (tag, commit 81aa43d) and **main** (checked at 7ea279a,
2026-08-22). Main still reports ``0.6.0`` in ``nemo_rl.package_info`` (its version was not
bumped), so versions are told apart by feature probes, never by the version string.

Every difference the adapter depends on is answered HERE, by probing NeMo-RL's interfaces
(the rest of the adapter calls these functions and never branches on a version):

====================================== ==================== ===========================
difference                              v0.7.0               main
====================================== ==================== ===========================
``loss/interfaces.MetricNormalizer``    absent (strings)     enum: :func:`normalizer`
``ClippedPGLossFn.__init__`` flags      ``cfg`` only         ``use_fused_linear_logprobs``:
                                                             :func:`loss_init_kwargs`
``MasterConfig.grpo``                   ``TypedDict`` (dict) pydantic model:
                                                             :func:`grpo_option`
``CheckpointManager`` context manager   no                   yes (flushes async saves):
                                                             :func:`training_context`
after training (``run_grpo.py``)        nothing              stop environments, engines:
                                                             :func:`shutdown_after_training`
====================================== ==================== ===========================

Differences the adapter absorbs without asking (same code on both): the refit methods
forward whatever keywords upstream passes (``buffer_size_bytes`` / ``num_buffers`` on
main), the FP8 refit wraps upstream's ``load_weights`` and delegates what it does not
quantize itself (MXFP8, grouped MoE experts on main).

Not supported on main: the split train-step API of its Megatron worker
(``begin_train_step`` / ``train_microbatch`` / ``finish_train_step``), which only
TransferQueue's ``TQPolicy`` drives (``data_plane.enabled``). ``launchers/run_grpo_ais.py``
refuses ``data_plane.enabled=true`` before Ray starts, and the AIS workers'
``begin_train_step`` raises ``NotImplementedError`` for an AIS loss. The prepare step has
no place to run there: ``begin_train_step(loss_fn, gbs, mbs)`` receives no data, and
``train_microbatch`` gets one chunk at a time and calls the loss on it before the rest of
the global batch has arrived, while the AIS statistics of the whole global batch are needed
before the first loss call (docs/upstream.md proposes the hook upstream would need).

:func:`require_supported` is the launch guard: it names the NeMo-RL it found and the
supported versions, and raises for anything else.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "SUPPORTED",
    "NeMoRLVersion",
    "UnsupportedNeMoRLError",
    "detect",
    "grpo_option",
    "loss_init_kwargs",
    "normalizer",
    "normalizers",
    "require_supported",
    "shutdown_after_training",
    "training_context",
    "upstream_quantizes_mx",
]

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
    """Which supported NeMo-RL is importable.

    Raises:
        UnsupportedNeMoRLError: NeMo-RL imports but matches neither supported version
            (naming the probes and the supported versions).
        ModuleNotFoundError: NeMo-RL is not importable.
    """
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
    """The launch guard: the detected version, or an error naming the supported ones.

    Raises:
        UnsupportedNeMoRLError: see :func:`detect`.
    """
    return detect()


def _metric_normalizer_enum() -> Any:
    from nemo_rl.algorithms.loss import interfaces

    return getattr(interfaces, "MetricNormalizer", None)


def normalizer(kind: str) -> Any:
    """``tokens`` / ``sequences`` / ``none`` as NeMo-RL's loss interface spells it.

    main: the ``MetricNormalizer`` member (its split-step trainer compares with ``is``;
    a string would fall back to the gradient's normaliser). v0.7.0: the string itself.

    Raises:
        ValueError: ``kind`` is not one of the three.
    """
    if kind not in ("tokens", "sequences", "none"):
        raise ValueError(f"metric normaliser {kind!r}: expected tokens, sequences or none")
    enum = _metric_normalizer_enum()
    return kind if enum is None else enum[kind.upper()]


def normalizers(kinds: Mapping[str, str]) -> dict[str, Any]:
    """``{metric: normaliser}`` with each value converted by :func:`normalizer`."""
    return {name: normalizer(kind) for name, kind in kinds.items()}


def loss_init_kwargs(loss_fn: Any) -> dict[str, Any]:
    """The flags upstream's ``setup()`` passed to ``ClippedPGLossFn(cfg, ...)``, read back.

    Every keyword of ``ClippedPGLossFn.__init__`` after ``cfg`` is stored by upstream on
    the instance under the same name (main: ``use_fused_linear_logprobs``; v0.7.0: none),
    so the AIS loss is built with the values ``setup()`` chose.

    Raises:
        TypeError: a keyword of ``__init__`` is not stored on ``loss_fn`` (an upstream
            change to re-check in this module).
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
    """True when upstream's FP8 refit config is MXFP8 (main's ``is_mx``; absent on v0.7.0).

    ``fp8_module``: ``nemo_rl.models.generation.vllm.quantization.fp8`` as the vLLM worker
    imported it (its ``global_fp8_config``).
    """
    return bool(getattr(getattr(fp8_module, "global_fp8_config", None), "is_mx", False))


def grpo_option(config: Any, key: str, default: Any = None) -> Any:
    """``master_config.grpo[key]``: a pydantic model on main, a dict on v0.7.0."""
    grpo = config.grpo
    if isinstance(grpo, Mapping):
        value = grpo.get(key, default)
    else:
        value = getattr(grpo, key, default)
    if value is not None and not isinstance(value, Mapping) and hasattr(value, "model_dump"):
        return value.model_dump()  # nested sections (async_grpo) as dicts, as on v0.7.0
    return value


def training_context(checkpointer: Any) -> contextlib.AbstractContextManager:
    """``with checkpointer:`` where the checkpointer is a context manager, else a no-op.

    main's ``CheckpointManager`` flushes its background checkpoint saves on exit (upstream's
    ``run_grpo.py`` trains inside it); v0.7.0's saves synchronously and is no context manager.
    """
    if hasattr(checkpointer, "__enter__") and hasattr(checkpointer, "__exit__"):
        return checkpointer
    return contextlib.nullcontext()


def shutdown_after_training(task_to_env: Any, val_task_to_env: Any, policy_generation: Any) -> None:
    """What upstream's ``run_grpo.py`` does after training, where its ``grpo`` module has it.

    main: ``grpo.shutdown_environments(...)`` then ``policy_generation.shutdown()`` (an
    error of the latter is printed, as upstream). v0.7.0's entry point does neither.
    """
    from nemo_rl.algorithms import grpo

    shutdown_environments = getattr(grpo, "shutdown_environments", None)
    if shutdown_environments is None:
        return
    shutdown_environments(task_to_env, val_task_to_env)
    try:
        policy_generation.shutdown()
    except Exception as error:  # upstream prints and goes on
        print(f"Error shutting down generation: {error}", flush=True)
