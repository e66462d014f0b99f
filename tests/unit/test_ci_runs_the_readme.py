# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""CI runs the README's test command verbatim, and both README commands use a virtualenv.

The README has exactly two copy-paste commands for a fresh machine (the embedded default,
the whole test suite). ``.ci/run`` must run the second one character for character, so
that CI exercises what a user pastes: a fresh virtualenv, the pinned CPU torch, ruff, the
v0.7.0 pass and the ``--nemo-rl main`` pass.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks if "pip install" in b]


def test_the_readme_has_two_install_commands_each_in_a_fresh_virtualenv():
    run, test = _readme_commands()
    for cmd in (run, test):
        assert cmd.startswith(VENV), cmd
        assert "\n" not in cmd and "torch==2.13.0" in cmd  # pinned in the same pip command
    assert run.endswith("python3 -m nemo_ais run")
    assert test.endswith("python3 -m pytest -n 2 --nemo-rl main -m nemo_rl")
    assert "python3 -m pytest -n 2 && " in test  # the v0.7.0 pass, then main's


def test_ci_runs_the_readme_test_command_verbatim():
    _, test = _readme_commands()
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()]
    commands = [ln for ln in lines if not ln.lstrip().startswith("#")]
    assert test in commands, "CI must run the README's test command as written"
    assert commands[-1] == test  # and nothing after it can mask its exit status
    assert ".venv/" in (ROOT / ".gitignore").read_text().splitlines()
