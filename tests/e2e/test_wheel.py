# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The package as a user installs it: a wheel, a fresh venv, ``nemo-ais run --quick`` elsewhere.

Offline and without the repository on any path:

1. the sources (``pyproject.toml``, ``README.md``, ``LICENSE``, ``nemo_ais/``) are copied to
   ``tmp_path`` and built with ``pip wheel --no-deps --no-build-isolation --no-index``
   (setuptools from this interpreter; nothing is written into the checkout);
2. the wheel must hold every tracked file of ``nemo_ais/`` that ships (modules, presets,
   ``py.typed``, the vLLM hook, the C++ sources) and the LICENSE;
3. a fresh venv gets the wheel, non-editable, ``--no-deps --ignore-installed``; torch and the other
   dependencies come from the environment running the tests, wherever it is (a user's or
   CI's virtualenv, or a system interpreter), through a ``.pth`` file naming that
   environment's own site directories (:func:`_dependency_dirs`), no network;
4. the venv's ``nemo-ais`` console script runs ``--version`` and ``run --quick`` (shrunk by
   :data:`SHRINK`: two arms, a warm start trained from the wheel, checkpoints, plots) with
   the working directory in ``tmp_path`` and an environment without ``PYTHONPATH`` (the test
   session's own points at NeMo-RL's vendored source) or a user site.

Why not ``--system-site-packages``: from a virtualenv's interpreter it exposes the *base*
interpreter's site-packages, not the virtualenv's, so the test failed wherever the
dependencies were installed into a virtualenv (as the README does). A ``.pth`` line adds a
directory to ``sys.path`` without running the ``.pth`` files inside it, so the test
environment's ``__editable__`` finder (which would serve a module missing from the wheel
from the checkout) is not installed in the new venv; step 4 still checks that
``nemo_ais.__file__`` and every ``nemo_ais`` module a run imports lie in the venv.

Runtime on a 2-core CPU: ~20 s, most of it the shrunk quick run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_SUFFIXES = (".py", ".yaml", ".typed", ".cpp")
# The reference arm and one FP8 arm with a correction (the twin, the C++ kernels, the
# loss): the other arms of the preset run the same installed code (CI's 20 minutes).
ARMS = {"bf16", "fp8-ais"}
# The quick preset with every stage kept and each made small: a 2-step warm start (trained,
# not read from a cache), 2 GRPO steps (a checkpoint and an evaluation at step 2), 8
# held-out problems. What this module proves is the installed package, not the training.
SHRINK = [
    "policy.warm_start.steps=2",
    "grpo.max_num_steps=2",
    "data.eval_size=8",
    f"experiment.include=[{','.join(sorted(ARMS))}]",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _tracked_package_files() -> list[str]:
    """``nemo_ais/...`` files in git that the wheel must carry (sources and package data)."""
    out = subprocess.run(["git", "ls-files", "nemo_ais"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split() if f.endswith(SHIPPED_SUFFIXES)]


def _dependency_dirs() -> list[str]:
    """The site directories of the environment running the tests (venv or system)."""
    import site
    import sysconfig

    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()]
    return list(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


def _clean_env(venv: Path, home: Path) -> dict[str, str]:
    """This process's environment minus whatever could point Python at the checkout."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("PIP_", "NEMO_"))}
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
        VIRTUAL_ENV=str(venv),
        PYTHONNOUSERSITE="1",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        HF_HUB_OFFLINE="1",
        MPLCONFIGDIR=str(home / "mpl"),
    )
    return env


def _sh(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 120) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(
        REPO_ROOT / "nemo_ais", src / "nemo_ais", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
    dist = tmp_path_factory.mktemp("dist")
    _sh(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(dist), str(src)],
        cwd=src,
    )  # fmt: skip
    (whl,) = dist.glob("nemo_ais-*.whl")
    return whl


def test_wheel_holds_every_shipped_file_and_the_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(set(_tracked_package_files()) - names)
    assert not missing, f"tracked files absent from {wheel.name}: {missing}"
    assert {f"nemo_ais/embedded/presets/{p}.yaml" for p in ("default", "quick")} <= names
    version = metadata.version("nemo-ais")
    dist_info = f"nemo_ais-{version}.dist-info"
    assert f"{dist_info}/licenses/LICENSE" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "nemo-ais = nemo_ais.cli:main" in entry_points


def test_installed_wheel_runs_quick_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    env = _clean_env(venv, tmp_path)
    python = str(venv / "bin" / "python")
    site = Path(_sh([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=tmp_path, env=env).strip())  # fmt: skip
    (site / "_test_dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    _sh(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        cwd=tmp_path,
        env=env,
    )
    package_dir = site / "nemo_ais"
    assert package_dir.is_dir() and not list(site.glob("__editable__*nemo_ais*"))
    # the dependencies resolve from the test environment (a venv or not), nemo_ais from here
    probe = "import omegaconf, torch, nemo_ais; print(nemo_ais.__file__)"
    assert _sh([python, "-c", probe], cwd=tmp_path, env=env).strip() == str(package_dir / "__init__.py")

    work = tmp_path / "work"  # neither the repository nor the venv
    work.mkdir()
    version = _sh(["nemo-ais", "--version"], cwd=work, env=env).strip()
    python_xy = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert version == (f"nemo-ais {metadata.version('nemo-ais')} from {package_dir} (python {python_xy})")
    assert shutil.which("nemo-ais", path=env["PATH"]) == str(venv / "bin" / "nemo-ais")

    # the command a user types, the console script of the venv
    _sh(["nemo-ais", "run", "--quick", *SHRINK], cwd=work, env=env, timeout=240)

    run_dir = work / "runs" / "quick"
    for name in ("metrics.jsonl", "summary.md", "config.yaml", "reward.png", "accuracy.png"):
        assert (run_dir / name).is_file(), name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in rows if r["kind"] == "train"} == ARMS
    assert {r["step"] for r in rows if r["kind"] == "train"} == {1, 2}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(ARMS)

    # what the run imported came from the venv, never the checkout
    probe = (
        "import json, sys; from nemo_ais.cli import main; import nemo_ais.embedded.recipe; "
        "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items() "
        "if n == 'nemo_ais' or n.startswith('nemo_ais.')}))"
    )
    files = json.loads(_sh([python, "-c", probe], cwd=work, env=env))
    assert files["nemo_ais"] == str(package_dir / "__init__.py")
    outside = {n: f for n, f in files.items() if f and not Path(f).is_relative_to(package_dir)}
    assert not outside, outside
