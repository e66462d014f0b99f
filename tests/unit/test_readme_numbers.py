# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The README quotes each result next to the command that produces it, from docs/results.md.

Issue 28, item 4: the README said "BF16 0.00 → 0.47" beside ``nemo-ais run``, but 0.47 was
the evidence preset's and the default run gives 0.450. The README's results table
(``<!-- readme:numbers -->``) now has one row per command; each number in a row must be
the one in the docs/results.md section whose heading names that command (tables copied
by ``benchmarks/results_tables.py`` from the run's ``summary.md``):

* ``initial → primary``: bf16's "initial acc." and "primary metric" means;
* ``ARM Δ [lo, hi]``: ARM's "Δ vs bf16" cell, exactly; "the other N arms within a … b":
  N, the minimum and the maximum of the Δ means of the arms not named;
* ``ARM: D, tmpe``: ARM's "severity D" and "token_mult_prob_error" cells.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()


def _readme_rows() -> list[list[str]]:
    block = re.search(r"<!-- readme:numbers -->\n(.*?)<!-- /readme:numbers -->", README, re.S)
    assert block, "README.md: no <!-- readme:numbers --> table"
    lines = [ln for ln in block[1].splitlines() if ln.startswith("|")][2:]  # header, rule
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def _section_of(command: str) -> str:
    """The copied tables of the results.md section whose ``## `` heading names ``command``."""
    pattern = rf"^## [^\n]*\(`{re.escape(command)}`\)\n(.*?)<!-- bench:(\w+) -->\n(.*?)<!-- /bench:\2 -->"
    found = re.findall(pattern, RESULTS, re.S | re.M)
    assert len(found) == 1, f"docs/results.md: {len(found)} sections for `{command}`"
    return found[0][2]


def _table(section: str, header_start: str) -> dict[str, list[str]]:
    """Rows (arm -> cells) of the first table whose header starts with ``header_start``."""
    lines = section.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(header_start))
    rows = {}
    for ln in lines[i + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _mean(cell: str) -> str:
    """``**0.450 ± 0.047**`` -> ``0.450``."""
    return cell.strip("*").split(" ± ")[0]


ROWS = _readme_rows()


def test_one_row_per_command_with_results():
    commands = [re.match(r"`([^`]+)`", row[0])[1] for row in ROWS]
    assert commands == ["nemo-ais run", "nemo-ais run --preset evidence", "nemo-ais run --preset fp4-evidence"]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_the_readme_numbers_are_the_commands_results(row):
    command = re.match(r"`([^`]+)`", row[0])[1]
    section = _section_of(command)
    primary = _table(section, "| arm | seeds | initial acc.")
    mismatch = _table(section, "| arm | severity D |")
    # BF16: initial -> primary metric
    initial, final = row[1].split(" → ")
    assert (initial, final) == (_mean(primary["bf16"][1]), _mean(primary["bf16"][3])), command
    # each arm's paired difference, and the range of the arms not named
    named = set()
    for arm, delta in re.findall(r"([\w.-]+) ([+-]\d\.\d{3} \[[^\]]+\])", row[2]):
        assert delta == primary[arm][4], (command, arm)
        named.add(arm)
    others = [float(cells[4].split()[0]) for a, cells in primary.items() if a not in named | {"bf16"}]
    rest = re.search(r"the other (\d+) arms within (\S+) … (\S+)", row[2])
    if rest:
        assert int(rest[1]) == len(others), command
        assert (float(rest[2]), float(rest[3])) == (min(others), max(others)), command
    else:
        assert not others, f"{command}: arms not quoted and no range: {sorted(others)}"
    # the uncorrected arm's mismatch
    arm, d, tmpe = re.fullmatch(r"([\w.-]+): (\S+), (\S+)", row[3]).groups()
    assert (d, tmpe) == (mismatch[arm][0], mismatch[arm][4]), (command, arm)


def test_no_result_number_is_quoted_outside_the_table():
    """The README's prose around the results quotes none of them (0.47 was the evidence's)."""
    prose = re.sub(r"<!-- readme:numbers -->.*?<!-- /readme:numbers -->", "", README, flags=re.S)
    for quote in ("0.00 to 0.47", "0.450", "0.472", "D ≈", "≈ 1.01", "±0.011", "error 2.6"):
        assert quote not in prose, quote
