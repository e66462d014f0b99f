# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Copy a run's ``summary.md`` tables into docs/results.md, unedited, each under its source.

``summary.md`` is written by :mod:`nemo_ais.embedded.report` from ``metrics.jsonl``; this
copies every table of it (with the paragraph that introduces the table) into the section
``NAME`` of docs/results.md, each under a ``Source: copied from `runs/<dir>/summary.md```
line (what tests/unit/test_doc_claims.py checks), so no number on the page is typed by hand.

    python -m benchmarks.results_tables NAME RUN_DIR [--title TITLE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._record import record_section

RESULTS_MD = Path(__file__).resolve().parents[1] / "docs" / "results.md"


def summary_tables(text: str) -> list[tuple[str, str]]:
    """``(introducing paragraph, table)`` for every markdown table of ``text``, in order."""
    blocks = [b.strip("\n") for b in text.split("\n\n") if b.strip()]
    out, intro = [], ""
    for block in blocks:
        if block.lstrip().startswith("|"):
            out.append((intro, block))
            intro = ""
        elif not block.startswith("#"):
            intro = block
    return out


def section_body(run_dir: Path) -> str:
    """The tables of ``run_dir/summary.md``, each under its ``Source:`` line."""
    summary = run_dir / "summary.md"
    rel = f"runs/{run_dir.name}/summary.md"
    parts = []
    for intro, table in summary_tables(summary.read_text()):
        head = f"Source: copied from `{rel}` (unedited)."
        parts.append("\n\n".join(p for p in (head, intro, table) if p))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="section name in docs/results.md (its bench: marker)")
    parser.add_argument("run_dir", type=Path, help="a run directory with summary.md")
    parser.add_argument("--title", default=None, help="section title (default: the run dir)")
    args = parser.parse_args()
    title = args.title or f"Tables of `runs/{args.run_dir.name}` (copied by code)"
    record_section(args.name, title, section_body(args.run_dir), path=RESULTS_MD, threads="1 per rank")


if __name__ == "__main__":
    main()
