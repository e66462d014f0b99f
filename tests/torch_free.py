# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""A Python environment without torch: what a Slurm login node gives the launchers.

``torch_free_env(tmp_path)`` returns the environment of a subprocess whose interpreter
(this one) can import the standard library, ``nemo_ais`` and the pre-flight tool's
declared dependencies (:data:`ALLOWED`) and nothing else: a ``sitecustomize`` on
``PYTHONPATH`` puts a meta-path finder first that raises ``ModuleNotFoundError`` for every
other top-level module (torch, transformers, tqdm, NeMo-RL, numpy, ...). An allowlist, not
a blocklist, so a new heavy import anywhere on the pre-flight path fails the test that
runs it. ``PYTHONPATH`` is the blocker's folder, then the repository only: no vendored
NeMo-RL, no test shim.

``from torch_free import torch_free_env`` (``tests/`` is on ``sys.path``, as for
``shipped_configs``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# Top-level modules of pydantic>=2.7, omegaconf>=2.3, pyyaml>=6.0 and hydra-core>=1.3 and of
# what pip installs with them (pydantic-core, typing-extensions, annotated-types,
# typing-inspection, antlr4-python3-runtime, packaging); ``_yaml`` is PyYAML's optional C extension.
ALLOWED = (
    "nemo_ais",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
    "annotated_types",
    "typing_inspection",
    "omegaconf",
    "antlr4",
    "hydra",
    "packaging",
    "yaml",
    "_yaml",
)

_SITECUSTOMIZE = '''"""Test blocker: only the standard library and ALLOWED import (tests/torch_free.py)."""
import sys

ALLOWED = frozenset({allowed!r})


class _AllowList:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        # _sysconfigdata_*: the platform's sysconfig data, stdlib but not in the list
        if top in sys.stdlib_module_names or top in ALLOWED or top.startswith("_sysconfigdata"):
            return None
        raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by tests/torch_free.py)", name=name)


sys.meta_path.insert(0, _AllowList())
'''


def torch_free_env(tmp_path: Path, base: dict[str, str], allowed: Iterable[str] = ALLOWED) -> dict[str, str]:
    """``base`` with ``PYTHONPATH`` = the blocker's folder, then this repository.

    ``allowed``: the importable top-level modules besides the standard library (default
    :data:`ALLOWED`; a test takes one away to make a Python that lacks it).
    """
    blocker = tmp_path / "torch_free_site"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(allowed=sorted(allowed)))
    return {**base, "PYTHONPATH": f"{blocker}:{REPO_ROOT}"}
