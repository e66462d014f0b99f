# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""NeMo-RL adapter for AIS, for NeMo-RL v0.7.0 and main (:mod:`nemo_ais.nemo_rl.compat`).

``import nemo_ais.nemo_rl`` needs neither NeMo-RL nor torch (names resolve on first use). Without NeMo-RL,
``AISClippedPGLossFn`` and ``AISLossConfig`` raise :class:`NeMoRLNotInstalledError` with installation instructions
(``from ... import`` gets Python's plain "cannot import name" instead).
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_ais.nemo_rl.compat import SUPPORTED

__all__ = [
    "GLOBAL_BATCH_KEY",
    "NEMO_RL_INSTALL_HINT",
    "NEMO_RL_VERSIONS",
    "AISClippedPGLossFn",
    "AISLossConfig",
    "NeMoRLNotInstalledError",
    "core_inputs",
    "global_batch_diagnostics",
    "prepare_global_batches",
    "split_global_batches",
    "validate_loss_config",
]

NEMO_RL_VERSIONS: tuple[str, ...] = tuple(SUPPORTED)  # ("v0.7.0", "main")
NEMO_RL_INSTALL_HINT = (
    f"{' or '.join(SUPPORTED.values())} is required for nemo_ais.nemo_rl's NeMo-RL classes. It is not on PyPI (the "
    "`nemo-rl` name there is a placeholder): `git clone https://github.com/NVIDIA-NeMo/RL`, `git checkout v0.7.0` (or "
    "main) and use its uv environment (`uv run ...`) or put the checkout on PYTHONPATH; then, in that environment, "
    "put this package on PYTHONPATH or `pip install --no-deps -e <nemo_ais checkout>` (keeps NeMo-RL's torch)"
)


class NeMoRLNotInstalledError(AttributeError):
    """A NeMo-RL class asked for without NeMo-RL (``AttributeError``: ``hasattr`` stays False)."""


# public name -> submodule that defines it (seam: torch; loss: torch and nemo_rl)
_LAZY = {
    "GLOBAL_BATCH_KEY": "nemo_ais.nemo_rl.seam",
    "core_inputs": "nemo_ais.nemo_rl.seam",
    "global_batch_diagnostics": "nemo_ais.nemo_rl.seam",
    "prepare_global_batches": "nemo_ais.nemo_rl.seam",
    "split_global_batches": "nemo_ais.nemo_rl.seam",
    "AISClippedPGLossFn": "nemo_ais.nemo_rl.loss",
    "AISLossConfig": "nemo_ais.nemo_rl.loss",
    "validate_loss_config": "nemo_ais.nemo_rl.loss",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] == "nemo_rl":
            raise NeMoRLNotInstalledError(f"{name}: {NEMO_RL_INSTALL_HINT}") from err
        raise
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
