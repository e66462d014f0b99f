# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Test-harness shim: make NeMo-RL v0.7.0's GRPO driver importable on Python 3.11.

NeMo-RL v0.7.0 targets Python 3.13. Its config schemas (``MasterConfig`` and friends) are
``typing.TypedDict`` subclasses that pydantic validates, and pydantic refuses
``typing.TypedDict`` below Python 3.12 ("Please use typing_extensions.TypedDict instead").
This project's CI runs Python 3.11, so the test harness (and only the test harness)
rebinds ``typing.TypedDict`` to ``typing_extensions.TypedDict`` before the first
``nemo_rl`` import. On Python >= 3.12 it does nothing.

``tests/conftest.py`` applies it in the pytest process and puts this folder on
``PYTHONPATH`` so every process the tests start (gloo ranks spawned with
``multiprocessing``, launcher subprocesses) applies it too, at interpreter start-up, as
Python's ``site`` module imports ``sitecustomize``. Nothing under ``nemo_ais/`` relies on
it: in NeMo-RL's own environment (Python 3.13) it is never on the path.
"""

import sys


def apply_typeddict_shim() -> bool:
    """Rebind ``typing.TypedDict`` on Python < 3.12; True if it did."""
    if sys.version_info >= (3, 12):
        return False
    import typing

    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict
    return True


apply_typeddict_shim()
