# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every tracked source file carries the project's SPDX license header (CONTRIBUTING.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / ".ci" / "license_header.txt").read_text()
ONE_LINE = "# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0\n"


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / f for f in out]


def test_header_file_is_the_spdx_pair():
    assert HEADER.splitlines() == [
        "# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.",
        "# SPDX-License-Identifier: Apache-2.0",
    ]
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_every_source_file_starts_with_the_header():
    bad = []
    for path in _tracked("*.py", "*.sh", ".ci/run"):
        text = path.read_text()
        if text.startswith("#!"):
            text = text.split("\n", 1)[1]
        if text.startswith("# shellcheck"):
            text = text.split("\n", 1)[1]
        rel = path.relative_to(ROOT).as_posix()
        ok = text.startswith(HEADER) or (rel.startswith("tests/") and text.startswith(ONE_LINE))
        if not ok and text.strip():  # an empty __init__.py needs none
            bad.append(rel)
    assert not bad, f"files without the SPDX header of .ci/license_header.txt: {bad}"
    cpp = (ROOT / "nemo_ais/formats/csrc/quantize_cpu.cpp").read_text()
    assert "SPDX-License-Identifier: Apache-2.0" in cpp.splitlines()[0]
