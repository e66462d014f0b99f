# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""What may skip in this suite, and the pytest hooks that hold every test to it.

A green run must not hide a test that did not execute. So a skip is allowed only for one
of the exact reasons of :data:`ALLOWED_SKIP_REASONS` (hardware, or an optional package,
that a CPU CI machine cannot have, each reason written once in the test that skips), and
an xfail (or xpass) only for one of :data:`ALLOWED_XFAIL_REASONS` (none today). Any other
skip or xfail is reported as a failure naming its reason; a module-level skip fails the
module's collection.

Transformer Engine: :func:`require_te` skips only when the ``transformer_engine``
package is absent. An install that is present but does not import (a broken build, an
ABI mismatch with torch) fails the test instead of skipping it.

``tests/conftest.py`` imports the two hooks, which registers them.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest

__all__ = [
    "ALLOWED_SKIP_REASONS",
    "ALLOWED_XFAIL_REASONS",
    "NO_CUDA",
    "TE_ABSENT",
    "TE_INSTALLED",
    "TE_MODULE",
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
    "refusal",
    "require_te",
]

NO_CUDA = "needs a CUDA device"
TE_ABSENT = "Transformer Engine not installed (pip install 'nemo-ais[te]')"
TE_INSTALLED = "Transformer Engine installed: see the te test"
TE_MODULE = "transformer_engine.pytorch.tensor.float8_blockwise_tensor"

ALLOWED_SKIP_REASONS = frozenset({NO_CUDA, TE_ABSENT, TE_INSTALLED})
ALLOWED_XFAIL_REASONS: frozenset[str] = frozenset()


def require_te() -> ModuleType:
    """TE's blockwise FP8 tensor module; skip if TE is absent, fail if it is broken."""
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip(TE_ABSENT)
    try:
        return importlib.import_module(TE_MODULE)
    except Exception as err:  # a present TE must import: anything else is a failure
        pytest.fail(
            f"Transformer Engine is installed but {TE_MODULE} does not import "
            f"({type(err).__name__}: {err}); fix or uninstall it",
            pytrace=False,
        )


def _strip(reason: str, prefix: str) -> str:
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


def refusal(skip_reason: str | None, xfail_reason: str | None) -> str | None:
    """Why a report breaks the policy, or None if it may stand.

    Args:
        skip_reason: the reason of a skip (None: not skipped); pytest's ``"Skipped: "``
            prefix is ignored.
        xfail_reason: the reason of an xfail or xpass (None: neither); pytest's
            ``"reason: "`` prefix is ignored.
    """
    if xfail_reason is not None:
        reason = _strip(xfail_reason, "reason: ")
        if reason not in ALLOWED_XFAIL_REASONS:
            return (
                f"xfail is not allowed in this suite (reason {reason!r}; allowed: "
                f"{sorted(ALLOWED_XFAIL_REASONS) or 'none'}): fix the test or the code"
            )
        return None
    if skip_reason is not None:
        reason = _strip(skip_reason, "Skipped: ")
        if reason not in ALLOWED_SKIP_REASONS:
            return (
                f"skipped for a reason this suite does not allow ({reason!r}; allowed, "
                f"exactly: {sorted(ALLOWED_SKIP_REASONS)})"
            )
    return None


def _apply(report: pytest.TestReport | pytest.CollectReport) -> None:
    xfail = getattr(report, "wasxfail", None)
    skip = None
    if report.skipped and xfail is None:
        longrepr = report.longrepr
        skip = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    why = refusal(skip, xfail)
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why
        if xfail is not None:
            del report.wasxfail  # else pytest would still count it as xfailed / xpassed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _apply(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    # module-level pytest.skip / importorskip: the whole file would vanish from the run
    outcome = yield
    _apply(outcome.get_result())
