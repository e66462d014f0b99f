# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup.

* NeMo-RL v0.7.0 is a REQUIRED test dependency. Its source is vendored read-only beside
  the project (``../shared/vendor/nemo-rl-v0.7.0``; override with ``NEMO_RL_DIR``); it is
  put on ``sys.path`` and ``PYTHONPATH`` here, with the Python 3.11 ``TypedDict`` shim of
  ``tests/_nemo_rl_env/sitecustomize.py`` (test harness only, see its docstring). If
  NeMo-RL does not import, the session stops with a usage error instead of skipping
  the tests that meet upstream code: a green run always exercised NeMo-RL.
* Deterministic seeds, CPU threads kept small (2-core CI machine).
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM_DIR = Path(__file__).resolve().parent / "_nemo_rl_env"
NEMO_RL_DIR = Path(
    os.environ.get("NEMO_RL_DIR") or REPO_ROOT.parent / "shared" / "vendor" / "nemo-rl-v0.7.0"
).resolve()


def _prepend_pythonpath(*paths: Path) -> None:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(p) for p in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(new + [p for p in parts if p not in new])
    for p in reversed(new):
        if p not in sys.path:
            sys.path.insert(0, p)


def _install_nemo_rl() -> None:
    # SHIM_DIR first: its sitecustomize runs in every child process (spawned gloo ranks,
    # launcher subprocesses); in this process we apply it directly.
    _prepend_pythonpath(SHIM_DIR, NEMO_RL_DIR, REPO_ROOT)
    spec = importlib.util.spec_from_file_location(
        "_nemo_ais_test_shim", SHIM_DIR / "sitecustomize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install_nemo_rl()


def pytest_configure(config: pytest.Config) -> None:
    try:
        import nemo_rl  # noqa: F401  (cheap; the tests import the driver modules)
    except Exception as err:
        raise pytest.UsageError(
            f"NeMo-RL v0.7.0 must be importable for the test suite (tried {NEMO_RL_DIR}; set "
            f"NEMO_RL_DIR to a v0.7.0 checkout and install the [test] extra): "
            f"{type(err).__name__}: {err}"
        ) from err


# Two cores on CI: keep intra-op threads small so gloo multi-process tests do not
# oversubscribe the machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# The only reasons a test may skip: hardware or packages this CPU machine cannot have.
# Anything else (NeMo-RL missing, a race lost, ...) is reported as a failure, so a green
# run never hides a test that did not execute (tests/_nemo_rl_env, .ci/run).
ALLOWED_SKIP = re.compile(r"CUDA|GPU|transformer.engine|Transformer Engine|vLLM|vllm", re.I)


def _refuse_disallowed_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not ALLOWED_SKIP.search(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for a reason this suite does not allow (only CUDA/GPU, Transformer "
            f"Engine or vLLM may be absent): {reason}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _refuse_disallowed_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    # module-level pytest.skip / importorskip: the whole file would vanish from the run
    outcome = yield
    _refuse_disallowed_skip(outcome.get_result())
