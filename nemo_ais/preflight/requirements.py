# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What the pre-flight tool needs from the Python that runs it; run as a script, a probe.

``python nemo_ais/preflight/requirements.py`` exits 0 when this interpreter can run ``python -m nemo_ais.preflight``,
else prints what is missing on one line and exits 1 (the launchers run it first: one line naming ``PYTHON``, not a
traceback). Standard library and Python 3.6 syntax only, so that an old interpreter still gets to say it is too old.
"""

import importlib
import re
import sys

PYTHON = (3, 11)
"""The oldest Python the package supports (``requires-python`` in pyproject.toml)."""

REQUIREMENTS = (
    ("pydantic", "pydantic", (2, 7)),
    ("omegaconf", "omegaconf", (2, 3)),
    ("yaml", "pyyaml", (6, 0)),
    ("hydra", "hydra-core", (1, 3)),
)
"""(module, distribution, oldest version) of each package the pre-flight tool imports."""


def describe():
    """``Python >= 3.11 with pydantic>=2.7, omegaconf>=2.3, pyyaml>=6.0, hydra-core>=1.3``."""
    packages = ", ".join(f"{dist}>={'.'.join(map(str, floor))}" for _, dist, floor in REQUIREMENTS)
    return f"Python >= {'.'.join(map(str, PYTHON))} with {packages}"


def _version(module, dist):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # no metadata (a vendored copy): the module's own attribute
        return str(getattr(module, "__version__", getattr(module, "VERSION", "0")))


def missing():
    """One message per unmet requirement, in order (empty: this Python can run the tool)."""
    if sys.version_info[:2] < PYTHON:
        return [f"Python {sys.version.split()[0]} is older than {'.'.join(map(str, PYTHON))}"]
    problems = []
    for name, dist, floor in REQUIREMENTS:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            problems.append(f"{dist} is not importable ({err})")
            continue
        found = _version(module, dist)
        parts = tuple(int(p) for p in re.findall(r"\d+", found)[:2])
        if parts < floor:
            problems.append(f"{dist} {found} is older than {'.'.join(map(str, floor))}")
    return problems


if __name__ == "__main__":
    problems = missing()
    if problems:
        print("; ".join(problems))
        sys.exit(1)
