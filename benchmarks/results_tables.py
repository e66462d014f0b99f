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


# summary.md's caveats (nemo_ais.embedded.report): copied above the tables, whatever table they qualify
CAVEATS = ("**Smoke run, not evidence:**", "**Unfinished seeds", "**No finished")


def summary_tables(text: str) -> list[tuple[str, str, str]]:
    """``(introducing paragraph, table, its footnote)`` for every markdown table of ``text``, in order.

    The footnote is the paragraph right after the table when it is one in parentheses (``(mean ± sample std ...)``).
    """
    blocks = [b.strip("\n") for b in text.split("\n\n") if b.strip()]
    out, intro = [], ""
    for i, block in enumerate(blocks):
        if block.lstrip().startswith("|"):
            after = blocks[i + 1] if i + 1 < len(blocks) else ""
            out.append((intro, block, after if after.startswith("(") else ""))
            intro = ""
        elif not block.startswith("#"):
            intro = block
    return out


def section_body(run_dir: Path) -> str:
    """The caveats and tables of ``run_dir/summary.md`` (with their footnotes), each table under its ``Source:`` line."""
    text = (run_dir / "summary.md").read_text()
    rel = f"runs/{run_dir.name}/summary.md"
    caveats = [b.strip("\n") for b in text.split("\n\n") if b.startswith(CAVEATS)]
    parts = [f"Caveat copied from `{rel}`: {c}" for c in caveats]
    for intro, table, note in summary_tables(text):
        head = f"Source: copied from `{rel}` (unedited)."
        parts.append("\n\n".join(p for p in (head, intro, table, note) if p))
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
