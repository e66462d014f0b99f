# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The shipped NeMo-RL configs and the launcher module, as the tests load them.

``from shipped_configs import CONFIG_DIR, FULL_CONFIGS, flat, launcher`` (``tests/`` is on
``sys.path`` under pytest's default import mode, as for ``oracles``).

``RUNS_ON[path]``: the NeMo-RL versions that run a full config's rollout format
(``nemo_ais.preflight.supported_versions``: NVFP4 W4A4 and MXFP8 need main).
``configs_for(version)``: the full configs that version runs; the others are refused by
the launcher before Ray (``tests/upstream/test_setup_real.py``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from nemo_ais.preflight import get, is_mixin, load_config, supported_versions

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs" / "nemo_rl"
LAUNCHER = REPO_ROOT / "launchers" / "run_grpo_ais.py"
_LOADED = {p: load_config(p) for p in sorted(CONFIG_DIR.rglob("*.yaml"))}
# every full config (arm mixins, which hold only loss_fn.ais, excluded)
FULL_CONFIGS = [p for p, cfg in _LOADED.items() if not is_mixin(cfg)]
RUNS_ON = {p: supported_versions(_LOADED[p]) for p in FULL_CONFIGS}


def configs_for(version: str) -> list[Path]:
    """The full configs NeMo-RL ``version`` (``v0.7.0`` | ``main``) runs, sorted."""
    return [p for p in FULL_CONFIGS if version in RUNS_ON[p]]


def launcher() -> ModuleType:
    """``launchers/run_grpo_ais.py`` as the module ``run_grpo_ais`` (loaded once)."""
    module = sys.modules.get("run_grpo_ais")
    if module is None:
        spec = importlib.util.spec_from_file_location("run_grpo_ais", LAUNCHER)
        module = importlib.util.module_from_spec(spec)
        sys.modules["run_grpo_ais"] = module
        spec.loader.exec_module(module)
    return module


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    """``{"a.b.c": leaf}`` of a nested config dict (an empty dict is a leaf)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_input_amax_files(root: Path) -> list[Path]:
    """The ``ais_nvfp4_refit.input_amax_file`` of every shipped config, written under ``root`` (the job's working
    directory, where a relative one is read): the launcher reads each before Ray. A readable, valid calibration
    (``{}``: no module calibrated) -- what the stubbed engines would do with its values is not run here."""
    written = []
    for cfg in _LOADED.values():
        name = get(cfg, "ais_nvfp4_refit.input_amax_file")
        if isinstance(name, str) and name:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({}))
            written.append(path)
    return written
