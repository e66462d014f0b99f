# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Arms the AIS refit in processes started with this folder on PYTHONPATH (stdlib only).

With ``NEMO_AIS_REFIT`` set, a trampoline on ``sys.meta_path`` waits until the process imports NeMo-RL's FP8 refit
module, then wraps its ``load_weights`` (:func:`nemo_ais.nemo_rl.refit.patched_spec`); a failure is logged and raised.
"""

import importlib.abc
import logging
import os
import sys

TARGET = "nemo_rl.models.generation.vllm.quantization.fp8"
_log = logging.getLogger("nemo_ais.fp8_refit")


class AISFp8RefitTrampoline(importlib.abc.MetaPathFinder):
    """Waits for the import of :data:`TARGET`, then hands it to ``nemo_ais.nemo_rl.refit``."""

    nemo_ais_fp8_refit = True  # the marker nemo_ais.nemo_rl.refit.hook_status looks for

    def __init__(self) -> None:
        self.fired = False
        self.error = None

    def find_spec(self, fullname, path, target=None):
        """The wrapped spec of TARGET on its first import (raises what arming raised)."""
        if fullname != TARGET or self.fired:
            return None
        self.fired = True
        try:
            from nemo_ais.nemo_rl import refit

            return refit.patched_spec(fullname, refit.config_from_env())
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            _log.warning(
                "nemo_ais: the AIS FP8 refit could NOT be armed in pid %d (%s); refusing to "
                "let this vLLM worker refit with NeMo-RL's own FP8 quantizer",
                os.getpid(),
                self.error,
            )
            raise


_ARMED = os.environ.get("NEMO_AIS_REFIT")  # nemo_ais.nemo_rl.refit.ENV_VAR
if _ARMED and not any(getattr(f, "nemo_ais_fp8_refit", False) for f in sys.meta_path):
    sys.meta_path.insert(0, AISFp8RefitTrampoline())
