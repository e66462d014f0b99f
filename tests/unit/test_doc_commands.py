# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every shell command of the README and the docs runs as written (issue 28, item 7).

The README's Slurm example was refused as pasted (a 2-node config needs ``HF_HOME`` on a
shared filesystem): no test ran it. Here every ``bash``/``sh``/``console`` block of
README.md, docs/*.md and launchers/README.md is parsed out and run with bash, in a
scratch working directory that holds the repository's ``configs/`` and ``launchers/``
(links), the logs the ``nemo-ais analyze`` examples name (written by NeMo-RL's real
logger), and NeMo-RL's ``examples/configs`` with docs/migration.md's config file beside
them (the guide's commands run from the NeMo-RL checkout). What differs from a user's shell, and only that:

* the launchers get ``--dry-run`` where a block has none: they print the ``cd``, the
  environment and the ``sbatch`` / ``uv run`` line instead of submitting (tests/unit/
  test_launchers.py checks that a dry run prints exactly what a real run executes);
* ``NEMO_RL_DIR=<a path>``, the reader's own NeMo-RL checkout, is the vendored one the
  suite runs against;
* ``nemo-ais`` is ``tests/doc_commands.py``, run in this process (bash records each call,
  quoted, and the test replays them in order from the same directory): ``analyze`` and
  ``report`` run for real; ``run`` and ``attribute`` are parsed and their config (preset,
  overrides, every arm) loaded and validated, not trained; ``calibrate-input-amax`` is
  parsed (it needs the named checkpoint and a GPU).

Inline commands in prose (a backtick span that starts with ``nemo-ais`` or
``python -m nemo_ais``, other than the bare name of a tool that needs arguments, and holds
no placeholder such as ``LOG_DIR`` or ``<file>``) run the same way, one command each.

A ``console`` block runs its ``$``-prompted lines; the lines shown below them are output.
If the block shows a ``[FAIL]`` check, the command must fail (exit 1); otherwise every
block must exit 0. Blocks that cannot run here are listed in :data:`NOT_RUN` with the
test that covers them instead; any other block runs, so a new example is covered without
editing this test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_analyze_logs import write_run

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "launchers/README.md"]
MIGRATION = (ROOT / "docs" / "migration.md").read_text()
_FENCE = re.compile(r"^```(bash|sh|console)[^\n]*\n(.*?)^```", re.S | re.M)
_LAUNCHER = re.compile(r"(launchers/(?:local|slurm)_grpo_ais\.sh)(?!\s+--dry-run)")
_NEMO_RL_DIR = re.compile(r"\bNEMO_RL_DIR=\S+")

# A block that contains one of these is not run here: why, and what runs it instead.
NOT_RUN = {
    "pip install": "the install commands: tests/e2e/test_wheel.py and .ci/run run them",
    "uv run python": "NeMo-RL's uv environment on GPU nodes: tests/upstream/test_migration.py "
    "and tests/adapters/test_run_grpo_ais.py drive launchers/run_grpo_ais.py through "
    "NeMo-RL's real grpo.setup()",
}

_PRELUDE = """\
set -eo pipefail
nemo-ais() { printf '%q ' "$@" >> "$NEMO_AIS_CALLS"; echo >> "$NEMO_AIS_CALLS"; }
python() { "$PYTHON" "$@"; }
python3() { "$PYTHON" "$@"; }
"""


def _nemo_ais(argv: list[str], workdir: Path, monkeypatch) -> int:
    """``nemo-ais argv`` as tests/doc_commands.py runs it, in this process, from ``workdir``."""
    from doc_commands import check

    monkeypatch.chdir(workdir)
    try:
        return check(argv)
    except SystemExit as exit_:  # argparse's --version and --help exit
        return exit_.code


def _not_run(body: str) -> str | None:
    """The NOT_RUN key of a block that is not run here, else None."""
    return next((key for key in NOT_RUN if key in body), None)


def _blocks() -> list[tuple[str, str, str]]:
    """(id ``file:line``, language, body) of every shell block."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return out


def _console_commands(body: str) -> str:
    """The ``$``-prompted lines of a console block and their continuation lines."""
    lines, keep = [], False
    for line in body.splitlines():
        if line.startswith("$ "):
            lines.append(line[2:])
            keep = line.endswith("\\")
        elif keep:
            lines.append(line)
            keep = line.endswith("\\")
    return "\n".join(lines) + "\n"


BLOCKS = _blocks()


def _env(tmp_path: Path) -> dict[str, str]:
    """A clean environment: this Python for the launchers' check, HOME under tmp_path."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "USER": "me",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "NEMO_AIS_DIR": str(ROOT),  # the launchers' default, the script's repository
        "NEMO_AIS_CALLS": str(tmp_path / "nemo_ais_calls"),
    }


def _script(lang: str, body: str) -> str:
    nemo_rl_dir = Path(sys.modules["nemo_rl"].__path__[0]).parent
    script = _console_commands(body) if lang == "console" else body
    script = _NEMO_RL_DIR.sub(f"NEMO_RL_DIR={nemo_rl_dir}", script)
    return _PRELUDE + _LAUNCHER.sub(r"\1 --dry-run", script)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """configs/ and launchers/ of the repository, and the logs the analyze examples name."""
    work = tmp_path_factory.mktemp("doc_commands")
    for name in ("configs", "launchers"):
        (work / name).symlink_to(ROOT / name)
    write_run(work / "logs" / "exp_001", [1, 2, 3], scale=0.004)
    # docs/migration.md's file, beside a copy of NeMo-RL's examples/configs (its commands run
    # from the NeMo-RL checkout)
    nemo_rl_dir = Path(sys.modules["nemo_rl"].__path__[0]).parent
    configs = work / "examples" / "configs"
    shutil.copytree(nemo_rl_dir / "examples" / "configs", configs)
    block = re.search(r"<!-- migration:config -->\s*```yaml\n(.*?)^```", MIGRATION, re.S | re.M)
    (configs / "grpo_math_8B_megatron_fp8_ais.yaml").write_text(block[1])
    run = work / "runs" / "default"  # what `nemo-ais run` leaves (for report and analyze)
    records = []
    for arm in ("bf16", "fp8-ais"):
        write_run(run / "logs" / f"{arm}_seed0", [1, 2], scale=0.004)
        records += [{"kind": "val", "arm": arm, "seed": 0, "step": s, "accuracy": 0.1 * s} for s in (0, 2)]
        records += [{"kind": "train", "arm": arm, "seed": 0, "step": s, "reward": 0.5, "alpha": 0.0} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return work


@pytest.mark.parametrize(("where", "lang", "body"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_documented_command_runs_as_written(where, lang, body, workdir, tmp_path, monkeypatch):
    if _not_run(body):
        return  # listed in NOT_RUN, checked by the test below
    env = _env(tmp_path)
    res = subprocess.run(
        ["bash", "-c", _script(lang, body)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    shown_failure = lang == "console" and "[FAIL]" in body
    out = f"{where}:\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    calls = env["NEMO_AIS_CALLS"]
    for line in Path(calls).read_text().splitlines() if Path(calls).exists() else []:
        assert _nemo_ais(shlex.split(line), workdir, monkeypatch) == 0, f"{where}: nemo-ais {line}"
    if shown_failure:
        assert res.returncode == 1, out
        first_fail = next(line for line in body.splitlines() if "[FAIL]" in line).strip()
        assert first_fail[:60] in res.stdout, out
    else:
        assert res.returncode == 0, out


def test_the_blocks_not_run_are_the_install_commands_and_the_gpu_launch():
    not_run = [(where.split(":")[0], _not_run(body)) for where, _, body in BLOCKS]
    not_run = [(doc, key) for doc, key in not_run if key]
    assert not_run == [
        ("README.md", "pip install"),  # installs and runs the embedded default
        ("README.md", "pip install"),  # installs and runs the test suite
        ("docs/nemo_rl.md", "uv run python"),
    ]
    assert len(BLOCKS) - len(not_run) >= 10  # every other block runs


_FENCED_ANY = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
_INLINE = re.compile(r"`((?:nemo-ais |python3? -m nemo_ais)[^`\n]*)`")
_TOOL_NAMES = {"nemo-ais analyze", "nemo-ais report", "nemo-ais calibrate-input-amax"}
_PLACEHOLDER = re.compile(r"<|\.\.\.|\b[A-Z][A-Z_]{2,}\b")


def _inline_commands() -> list[tuple[str, str]]:
    """(first ``file`` that names it, command) of every runnable inline command, once."""
    out: dict[str, str] = {}
    for path in DOCS:
        text = _FENCED_ANY.sub("", path.read_text())
        for m in _INLINE.finditer(text):
            cmd = m.group(1).strip()
            if cmd in _TOOL_NAMES or (cmd.startswith("python") and len(cmd.split()) < 4):
                continue  # the name of a tool that needs arguments, not a command
            if not _PLACEHOLDER.search(cmd):
                out.setdefault(cmd, str(path.relative_to(ROOT)))
    return [(where, cmd) for cmd, where in out.items()]


INLINE = _inline_commands()


@pytest.mark.parametrize(("where", "cmd"), INLINE, ids=[f"{w}:{c}" for w, c in INLINE])
def test_every_inline_command_runs_as_written(where, cmd, workdir, tmp_path, monkeypatch):
    argv = shlex.split(cmd)
    if argv[0] == "nemo-ais":
        assert _nemo_ais(argv[1:], workdir, monkeypatch) == 0, f"{where}: {cmd}"
        return
    res = subprocess.run(
        ["bash", "-c", _script("bash", cmd + "\n")],
        cwd=workdir,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"{where}: {cmd}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"


def test_inline_commands_are_found():
    cmds = {cmd for _, cmd in INLINE}
    assert {"nemo-ais run --preset evidence", "nemo-ais run --preset fp4-evidence"} <= cmds
    assert "python -m nemo_ais.preflight examples/configs/grpo_math_8B_megatron_fp8_ais.yaml" in cmds
    assert not any("LOG_DIR" in c or "<" in c for c in cmds)
