# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Record a benchmark's markdown table in ``docs/benchmarks.md``.

Each benchmark owns one section, delimited by ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->`` markers, and rewrites only that section, so scripts can run
in any order. The section carries the machine, library versions and the command.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

BENCH_MD = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
_TITLE = "# Benchmarks\n\nEach section is rewritten by the script named in it.\n"


def machine_line(threads: str | None = None) -> str:
    """One line describing the machine and software versions (``threads``: torch threads used)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    dev = "CPU only"
    if torch.cuda.is_available():
        dev = torch.cuda.get_device_name()
    return (
        f"{cpu}, {os.cpu_count()} cores ({threads or torch.get_num_threads()} torch threads), {dev}; "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def record_section(name: str, title: str, body_md: str, path: Path = BENCH_MD, threads: str | None = None) -> None:
    """Replace (or append) section ``name`` of ``docs/benchmarks.md``.

    ``threads`` describes the torch thread counts of the run (default: the current one).
    """
    script = Path(sys.argv[0])
    # Benchmarks import each other as the ``benchmarks`` package: record the ``-m`` form.
    target = f"-m benchmarks.{script.stem}" if script.parent.name == "benchmarks" else str(script)
    cmd = " ".join(["python", target, *sys.argv[1:]])
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = (
        f"<!-- bench:{name} -->\n## {title}\n\n"
        f"- Machine: {machine_line(threads)}\n- Command: `{cmd}`\n- Recorded: {stamp}\n\n"
        f"{body_md.strip()}\n<!-- /bench:{name} -->\n"
    )
    text = path.read_text() if path.exists() else _TITLE
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->\n?", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
