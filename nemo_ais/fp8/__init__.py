# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Compatibility face of the former ``nemo_ais.fp8`` package: its public names keep importing.

So does every former submodule path (``nemo_ais.fp8.twin``, ...), as the module that replaced it (the same object).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from nemo_ais.formats import *  # noqa: F403
from nemo_ais.formats import __all__ as _formats_all
from nemo_ais.refit import *  # noqa: F403
from nemo_ais.refit import __all__ as _refit_all

__all__ = sorted([*_formats_all, *_refit_all])

MOVED_MODULES = {
    "attribution": "nemo_ais.tools.attribution",
    "checks": "nemo_ais.formats.checks",
    "cpu_kernel": "nemo_ais.formats.cpu_kernel",
    "formats": "nemo_ais.rollout.fake_quant",
    "fp8_linear": "nemo_ais.rollout.linear",
    "generation": "nemo_ais.rollout.sampling",
    "grids": "nemo_ais.formats.grids",
    "input_amax_file": "nemo_ais.tools.input_amax_file",
    "kv_cache": "nemo_ais.rollout.kv_cache",
    "kv_scales": "nemo_ais.refit.kv_scales",
    "mxfp4": "nemo_ais.formats.mxfp4",
    "mxfp8": "nemo_ais.formats.mxfp8",
    "nvfp4": "nemo_ais.formats.nvfp4",
    "quant": "nemo_ais.formats.fp8_block",
    "quant_linear": "nemo_ais.rollout.linear",
    "rollout_config": "nemo_ais.rollout.config",
    "stream": "nemo_ais.refit.stream",
    "stream_block": "nemo_ais.refit.stream",
    "te_backend": "nemo_ais.formats.te_backend",
    "twin": "nemo_ais.rollout.twin",
    "twin_calibration": "nemo_ais.rollout.calibration",
    "twin_modules": "nemo_ais.rollout.modules",
    "twin_refit": "nemo_ais.rollout.weight_loader",
}
"""``{former submodule of nemo_ais.fp8: the module that holds its code now}``."""


class _MovedModuleLoader(importlib.abc.Loader, importlib.abc.MetaPathFinder):
    """Resolves ``nemo_ais.fp8.<former>`` to the module named in :data:`MOVED_MODULES`."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package != __name__ or leaf not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED_MODULES[spec.name.rpartition(".")[2]])
        spec.loader_state = module.__spec__  # the import system overwrites __spec__
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # executed already: restore its spec


if not any(isinstance(f, _MovedModuleLoader) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleLoader())
