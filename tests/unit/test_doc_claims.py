# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Claims of the docs and configs that no code backs are labelled as such.

Transformer Engine: no TE test has run (TE is not installable on our CI), so wherever
``docs/``, ``README.md`` or ``configs/`` say that TE and our quantizer give the same bits,
the same place must say "unverified".

docs/results.md says where each of its tables comes from, truthfully. Every markdown table is governed by the nearest ``Source:`` line above it in the same
section (no heading in between), which either

* says ``copied from `runs/<name>/summary.md``` (one file): then the table's header row must
  be one that ``nemo_ais.embedded.report`` writes to ``summary.md``, so a table with columns
  the report does not have cannot claim to be a copy; or
* says ``hand-assembled from`` and names, in backticks, the run files it was read from.

The page's introduction says every table on it is copied by code, and that is true: every
table is governed by a ``copied from`` source (issue 17: nothing assembled by hand).
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import pytest

from nemo_ais.embedded.report import _summary_md
from nemo_ais.embedded.tolerance import tolerance_md, tolerance_table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results.md"
_COPIED = re.compile(r"^Source: copied from `(runs/[^`/]+/summary\.md)`")
_HAND = re.compile(r"^Source: hand-assembled\b.*?from (.*)", re.S)
_RUN_FILE = re.compile(r"`(?:runs/[^`]+/)?(?:metrics\.jsonl|summary\.md)`")


def _tables(lines: list[str]) -> list[tuple[int, str, str | None]]:
    """(line number, header row, governing Source paragraph or None) of every table."""
    out, source, prev_table = [], None, False
    for i, line in enumerate(lines):
        if line.startswith("#"):
            source = None  # a Source line governs its own section only
        elif line.startswith("Source:"):
            paragraph = [line]
            for nxt in lines[i + 1 :]:
                if not nxt.strip():
                    break
                paragraph.append(nxt)
            source = " ".join(paragraph)
        is_table = line.startswith("|")
        if is_table and not prev_table:
            out.append((i + 1, line.strip(), source))
        prev_table = is_table
    return out


def _records(arms) -> list[dict]:
    """Two seeds x 20 steps of ``arms`` (long enough not to be a smoke run, whose summary
    leaves tables out); a dial level's arms carry the curve's x-axes."""
    recs = []
    for arm in arms:
        for seed in (0, 1):
            recs += [{"kind": "val", "arm": arm, "seed": seed, "step": s, "accuracy": 0.01 * s} for s in (0, 10, 20)]
            recs += [{"kind": "train", "arm": arm, "seed": seed, "step": s, "reward": 0.5} for s in range(1, 21)]
    for r in recs:
        if r["kind"] == "train" and r["arm"] != "bf16":
            r.update({"ais/severity": 0.01, "ais/kl_k3": 0.001, "ais/token_mult_prob_error": 1.01})
    return recs


@functools.cache
def _summary_headers() -> frozenset[str]:
    """The header rows ``summary.md`` has: a two-arm run's, and those of the dose presets'
    runs (their summary adds the tolerance curve, one column per correction they run: the
    default include and every arm the preset defines)."""
    from nemo_ais.embedded.config import CONFIG_DIR, load_config

    arm_sets = [("bf16", "fp8-none")]
    for preset in ("dose", "dose-long", "dose-99", "dose-quick"):
        experiment = load_config(CONFIG_DIR / f"{preset}.yaml")["experiment"]
        arm_sets.append(tuple(experiment["include"]))
        arm_sets.append(("bf16", *(a for a in experiment["arms"] if a.startswith("k"))))
    headers = set()
    for arms in arm_sets:
        recs = _records(arms)
        text = _summary_md(Path("run"), recs, "bf16")
        text += "\n" + tolerance_md(tolerance_table(recs, "bf16"), "bf16")
        lines = text.splitlines()
        headers |= {
            line.strip() for line, nxt in itertools.pairwise(lines) if line.startswith("|") and nxt.startswith("|---")
        }
    return frozenset(headers)


TABLES = _tables(RESULTS.read_text().splitlines())


def test_every_table_on_the_page_is_copied_by_code():
    hand = [line for line, _, src in TABLES if not _COPIED.match(src or "")]
    assert len(TABLES) >= 20 and not hand, f"docs/results.md: tables not copied by code at {hand}"


@pytest.mark.parametrize(("line", "header", "source"), TABLES, ids=[str(t[0]) for t in TABLES])
def test_every_table_names_its_source(line, header, source):
    assert source is not None, (
        f"docs/results.md:{line}: table without a 'Source:' line above it in its section "
        "(copied from `runs/<name>/summary.md`, or hand-assembled from the named files)"
    )
    copied, hand = _COPIED.match(source), _HAND.match(source)
    assert copied or hand, f"docs/results.md:{line}: unrecognised source {source!r}"
    if copied:
        assert header in _summary_headers(), (
            f"docs/results.md:{line}: claims to be copied from {copied[1]}, but summary.md "
            f"has no table with the header {header}"
        )
    else:
        assert _RUN_FILE.search(hand[1]), (
            f"docs/results.md:{line}: hand-assembled, but names no run file it was read from"
        )


def test_the_introduction_says_what_the_tables_are_copied_from():
    intro = " ".join(RESULTS.read_text().split("\n## ", 1)[0].replace("**", "").split())
    assert "Every table on this page is copied unedited by `benchmarks/results_tables.py`" in intro
    assert "hand-assembled tables are in the git history, not here" in intro


_TE = re.compile(r"\bTE\b|Transformer Engine")


@pytest.mark.parametrize(
    "path",
    [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("configs/**/*.yaml"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_te_bit_equality_is_labelled_unverified(path):
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not re.search(r"same bits", line, re.I):
            continue
        window = " ".join(lines[max(0, i - 2) : i + 3])  # the claim's sentence or comment
        if _TE.search(window):
            assert "unverified" in window.lower(), (
                f"{path.relative_to(ROOT)}:{i + 1}: claims TE gives the same bits as ours, "
                f"but no TE test has run; say 'unverified': {line.strip()}"
            )


# ---- issue 27, item 10: the statistics vector's size and the KV table, from the code ----

_SLOT_CLAIMS = re.compile(
    r"(\d+)[- ](?:float64 )?(?:slots?|sums|values)\b(?:[^.\n]{0,12}?)[(,;]?\s*(\d+)[- ]bytes?"
    r"|(\d+)[- ]bytes?\S* (?:all-reduce )?\((\d+) float64 (?:slots|sums|values)"
)


def _slot_byte_claims():
    """(file, slots, bytes) of every "N slots, M bytes" / "M-byte ... (N float64 ...)" claim."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = " ".join(path.read_text().split())  # claims may wrap lines
        for m in _SLOT_CLAIMS.finditer(text):
            slots, nbytes = (m[1], m[2]) if m[1] else (m[4], m[3])
            yield path.name, int(slots), int(nbytes)


def test_statistics_vector_size_in_the_docs_is_the_codes():
    from nemo_ais.config import CorrectionConfig
    from nemo_ais.core.stats import NUM_SLOTS, STATS_BYTES, num_slots
    from nemo_ais.modes.m2po import M2PO_BINS

    m2po = num_slots(CorrectionConfig(mode="m2po"))
    allowed = {(NUM_SLOTS, STATS_BYTES), (m2po, m2po * STATS_BYTES // NUM_SLOTS)}
    claims = list(_slot_byte_claims())
    files = {f for f, _, _ in claims}
    # every page that states the size states it (not vacuous), and states the code's
    assert {"README.md", "nemo_rl.md", "method.md", "architecture.md", "benchmarks.md"} <= files
    wrong = [c for c in claims if (c[1], c[2]) not in allowed]
    assert not wrong, f"slots/bytes differ from NUM_SLOTS={NUM_SLOTS}, STATS_BYTES={STATS_BYTES}"
    histogram = re.compile(r"(\d+)[- ]bin histogram|histogram, (\d+) more slots|(\d+)-slot histogram")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in histogram.finditer(" ".join(path.read_text().split())):
            n = int(next(g for g in m.groups() if g))
            assert n in (M2PO_BINS, 2 * M2PO_BINS), (path.name, m[0])


def test_kv_calibration_table_and_default_rule_in_the_docs_are_the_codes():
    from nemo_ais.refit.kv_scales import KVScaleCalibrator, KVScaleConfig

    shape = tuple(KVScaleCalibrator(num_layers=5).local_tables().shape)
    planes, kinds = shape[0], shape[2]
    text = " ".join((ROOT / "docs" / "nemo_rl.md").read_text().split())
    reduction = re.search(r"ONE `all_reduce\(MAX\)`[^`]*`\[(\d+), num_layers, (\d+)\]`", text)
    assert reduction and (int(reduction[1]), int(reduction[2])) == (planes, kinds)
    default = KVScaleConfig().reduction
    assert default == "percentile_of_amax"
    assert f"Default `{default}`, NeMo-RL's own rule" in text
    assert "our default scales are smaller" not in text  # the element rule is not the default


def test_te_backend_is_never_claimed_verified_on_a_gpu():
    # tests/gpu/test_te_backend.py skipped every test on the GPU machine (TE absent)
    text = (ROOT / "docs" / "nemo_rl.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|") and "test_te_backend" in line]
    assert rows
    for row in rows:
        gpu_cell = row.split("|")[4]
        assert "test_te_backend" not in gpu_cell or "skipped" in gpu_cell, row
