# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup.

* NeMo-RL is a REQUIRED test dependency. Two versions are supported and vendored
  read-only beside the project: ``--nemo-rl v0.7.0`` (the default,
  ``../shared/vendor/nemo-rl-v0.7.0``) and ``--nemo-rl main``
  (``../shared/vendor/nemo-rl-main-7ea279a``); ``NEMO_RL_DIR`` overrides the directory
  (a checkout of the chosen version). The source is put on ``sys.path`` and
  ``PYTHONPATH`` in ``pytest_configure``, with the Python 3.11 ``TypedDict`` shim of
  ``tests/_nemo_rl_env/sitecustomize.py`` (test harness only, see its docstring), and
  the version is exported as ``NEMO_AIS_TEST_NEMO_RL`` (``tests/nemo_rl_version.py``
  reads it). If NeMo-RL does not import, or ``nemo_ais.nemo_rl.compat`` recognises a
  different version than the one asked for, the session stops with a usage error instead
  of skipping: a green run always exercised the version it names.
* Tests that drive NeMo-RL's code carry the ``nemo_rl`` marker; CI runs the whole suite
  against v0.7.0 and then ``-m nemo_rl`` against main (README, ``.ci/run``).
* Deterministic seeds, CPU threads kept small (2-core CI machine).
* Tests write only under their tmp dirs: after each test, the TensorBoard writers it
  started (NeMo-RL's real ``Logger``, whose ``logger.log_dir`` is relative in the shipped
  configs) are closed while the test's working directory (its ``tmp_path``) is still
  current, so no writer thread flushes into the repository later; and a test that leaves a
  new file or directory at the top of the repository fails, naming it.
* Skip policy (``tests/skip_policy.py``): a skip only for one of its exact reasons (no
  CUDA device, Transformer Engine absent), no xfail; a present but broken TE fails.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from nemo_rl_sources import NEMO_RL_SOURCES, REPO_ROOT
from repo_guard import writes_stay_in_tmp

# Skips and xfails: only the exact reasons of tests/skip_policy.py; anything else (NeMo-RL
# missing, a race lost, a broken Transformer Engine, any xfail) is reported as a failure,
# so a green run never hides a test that did not execute (tests/_nemo_rl_env, .ci/run).
from skip_policy import (  # noqa: F401  (imported hooks are registered hooks)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

SHIM_DIR = Path(__file__).resolve().parent / "_nemo_rl_env"
VERSION_ENV = "NEMO_AIS_TEST_NEMO_RL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nemo-rl",
        choices=[*sorted(NEMO_RL_SOURCES), "none"],
        default="v0.7.0",
        help="NeMo-RL version the tests drive (vendored source; NEMO_RL_DIR overrides the path); "
        "'none' only with -m gpu, on the GPU machine, whose kernel tests need no NeMo-RL",
    )


def _prepend_pythonpath(*paths: Path) -> None:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(p) for p in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(new + [p for p in parts if p not in new])
    for p in reversed(new):
        if p not in sys.path:
            sys.path.insert(0, p)


def _install_nemo_rl(nemo_rl_dir: Path) -> None:
    # SHIM_DIR first: its sitecustomize runs in every child process (spawned gloo ranks,
    # launcher subprocesses); in this process we apply it directly.
    _prepend_pythonpath(SHIM_DIR, nemo_rl_dir, REPO_ROOT)
    spec = importlib.util.spec_from_file_location("_nemo_ais_test_shim", SHIM_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def pytest_configure(config: pytest.Config) -> None:
    version = config.getoption("--nemo-rl")
    if version == "none":
        # The GPU machine (benchmarks/gpu_checks.sh) has neither the vendored source nor
        # NeMo-RL's dependencies (Ray, ...): only its kernel tests run there, and a test that
        # imports NeMo-RL fails with ModuleNotFoundError rather than skipping.
        if config.option.markexpr != "gpu":
            raise pytest.UsageError(
                f"--nemo-rl none: got -m {config.option.markexpr!r}, expected -m gpu (every "
                "other test drives NeMo-RL: pick --nemo-rl "
                f"{{{','.join(sorted(NEMO_RL_SOURCES))}}})"
            )
        _prepend_pythonpath(REPO_ROOT)
        return
    nemo_rl_dir = Path(os.environ.get("NEMO_RL_DIR") or NEMO_RL_SOURCES[version]).resolve()
    os.environ[VERSION_ENV] = version
    _install_nemo_rl(nemo_rl_dir)
    try:
        import nemo_rl  # noqa: F401  (cheap; the tests import the driver modules)

        from nemo_ais.nemo_rl import compat

        found = compat.detect().name
    except Exception as err:
        raise pytest.UsageError(
            f"NeMo-RL {version} must be importable for the test suite (tried {nemo_rl_dir}; "
            f"pick --nemo-rl {{{','.join(sorted(NEMO_RL_SOURCES))}}}, set NEMO_RL_DIR to a "
            f"checkout of it, and install the [test] extra): {type(err).__name__}: {err}"
        ) from err
    if found != version:
        raise pytest.UsageError(
            f"--nemo-rl {version}: the NeMo-RL at {nemo_rl_dir} is {found} "
            "(nemo_ais.nemo_rl.compat.detect); point NEMO_RL_DIR at a checkout of "
            f"{version} or pass --nemo-rl {found}"
        )


def pytest_report_header(config: pytest.Config) -> str:
    if "nemo_rl" not in sys.modules:
        return "NeMo-RL: none (-m gpu)"
    return f"NeMo-RL: {config.getoption('--nemo-rl')} ({sys.modules['nemo_rl'].__path__[0]})"


# Two cores on CI: keep intra-op threads small so gloo multi-process tests do not
# oversubscribe the machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny GEMMs (``pytest.mark.usefixtures``).

    As fast on an idle machine, and no >10x slowdown from OpenMP spin-waiting when the
    cores are shared (pytest-xdist's workers, a background run).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _writes_stay_in_tmp(monkeypatch):
    """Close the test's TensorBoard writers, then fail if it left anything in the repo.

    ``monkeypatch`` is set up before this fixture, so it is torn down after it: a
    ``monkeypatch.chdir(tmp_path)`` of the test still holds when the writers close
    (``tests/repo_guard.py``).
    """
    with writes_stay_in_tmp(REPO_ROOT, monkeypatch):
        yield
