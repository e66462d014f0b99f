# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Streaming reader of NeMo-RL's ``<log_dir>/train_data_step{N}.jsonl`` files.

NeMo-RL v0.7.0 (``Logger.log_batched_dict_as_jsonl``, called by ``grpo_train``) writes one JSON object per sample,
each value a batch of one: ``[[v_0, ..., v_{S-1}]]`` for ``token_ids``, ``token_loss_mask``, ``generation_logprobs``,
``prev_logprobs``, ``advantages`` (position j: token j and its log-prob given tokens < j, 0 on the prompt), ``[x]`` for
``sample_loss_mask``, ``rewards``, ``input_lengths``; also ``content``, ``idx``. NaN, +-inf: ``NaN``, ``Infinity``.

Rows are aligned as NeMo-RL's loss does (``x[:, 1:]``, ``mask = token_loss_mask[:, 1:] * sample_loss_mask``) into
chunks of at most ``chunk_tokens`` positions (memory bounded by the chunk); bad input raises :class:`BadInputError`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nemo_ais.formats.grids import FP32_MAX

logger = logging.getLogger(__name__)

STEP_FILE = re.compile(r"^train_data_step(\d+)\.jsonl$")
# NeMo-RL's get_next_experiment_dir: every launch of an entry point logs to a new <logger.log_dir>/exp_NNN
LAUNCH_DIR = re.compile(r"^exp_(\d+)$")
REQUIRED_KEYS = ("prev_logprobs", "generation_logprobs", "token_loss_mask", "sample_loss_mask")
# Per-position lists that NeMo-RL writes with one value per token of the sequence.
_PER_TOKEN_KEYS = ("token_ids", "token_loss_mask", "generation_logprobs", "prev_logprobs", "advantages")
_DTYPE = torch.float64
_MAX_HINTS = 3  # sub-directories named when log_dir itself holds no step file
# a NeMo-RL log root (logs/exp_001: 1), a nemo-ais run (runs/default/logs/bf16_seed0: 2), the runs/ above it (3), + 1
SEARCH_DEPTH = 4
_SKIP_BAD_ROWS_HINT = "--skip-bad-rows skips and counts such rows"

try:  # optional fast path; it rejects NaN/Infinity, which then go through json
    import orjson as _orjson

    _FAST_ERRORS: tuple[type[Exception], ...] = (_orjson.JSONDecodeError,)
    _fast_loads: Callable[[bytes], object] | None = _orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _FAST_ERRORS, _fast_loads = (), None


class BadInputError(ValueError):
    """Bad log input: ``str()`` is one line, ``file:line: problem`` (line 0: the file)."""

    def __init__(self, path: Path | str, line: int, problem: str) -> None:
        self.path, self.line, self.problem = Path(path), line, problem
        super().__init__(f"{path}:{line}: {problem}")


class EmptyStepError(BadInputError):
    """A step file with no row to analyse (empty, or every row bad): ``--skip-bad-rows`` skips the step."""


class CutOffStepError(EmptyStepError):
    """A step file whose last row is cut off mid-row (a run stopped mid-write, or a file still being written).

    An unknown number of rows after it is missing, so the step is no global batch: ``--skip-bad-rows`` skips
    the whole step rather than analyse the rows before the cut as if they were all.
    """


class _RowError(ValueError):
    """A problem with one row (becomes a :class:`BadInputError` with the line number)."""


@dataclass(frozen=True)
class StepFile:
    """One ``train_data_step{N}.jsonl``: the step N, its path and size in bytes."""

    step: int
    path: Path
    nbytes: int


@dataclass
class Chunk:
    """Aligned rows of one step: ``[B, T]`` float64 log-probs and the bool mask.

    ``valid`` excludes non-finite positions (counted, the first one described); ``lines`` are the file's line numbers.
    """

    logp_old: torch.Tensor
    logp_rollout: torch.Tensor
    valid: torch.Tensor
    lines: list[int]
    n_nonfinite: int = 0
    first_nonfinite: str = ""
    n_filtered: int = 0  # valid positions whose prev_logprobs is the top-k/top-p placeholder 0 (left out)

    @property
    def num_positions(self) -> int:
        """B x T."""
        return self.valid.numel()


@dataclass
class ReadCounts:
    """Rows read and bad rows skipped in one file; the first skipped row's message."""

    rows: int = 0
    bad_rows: int = 0
    lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


def _require_dir(path: Path) -> None:
    if not path.is_dir():
        what = "not a directory" if path.exists() else "does not exist"
        raise BadInputError(path, 0, f"{what} (expected a NeMo-RL log_dir)")


def _has_step_file(directory: Path) -> bool:
    try:
        return any(STEP_FILE.match(p.name) and p.is_file() for p in directory.iterdir())
    except OSError:  # unreadable directory: it holds no run we can read
        return False


def _subdirs(directory: Path, name: re.Pattern | None = None) -> list[Path]:
    """Sorted sub-directories (no symlinks) whose name matches ``name``; [] if ``directory`` cannot be listed."""
    try:
        return sorted(
            p for p in directory.iterdir() if (name is None or name.match(p.name)) and p.is_dir() and not p.is_symlink()
        )
    except OSError:
        return []


def find_log_dirs(root: Path | str, max_depth: int = SEARCH_DEPTH) -> list[Path]:
    """The run log directories at or below ``root``: those holding step files, sorted.

    ``root`` itself if it holds a ``train_data_step{N}.jsonl``, else every directory up to ``max_depth`` levels below it
    that holds one; below a run's log directory only ``exp_NNN`` directories (resumed launches, :func:`join_launches`).
    Never follows symbolic links. Raises :class:`BadInputError` if ``root`` is not a directory.
    """
    root = Path(root)
    _require_dir(root)
    found, level = [], [root]
    for depth in range(max_depth + 1):
        below = []
        for directory in level:
            if _has_step_file(directory):
                found.append(directory)
                below += _subdirs(directory, LAUNCH_DIR)
            elif depth < max_depth:
                below += _subdirs(directory)
        level = below
    return sorted(found)


def find_step_files(log_dir: Path | str) -> list[StepFile]:
    """Every ``train_data_step{N}.jsonl`` directly in ``log_dir``, ordered by N.

    Raises:
        BadInputError: ``log_dir`` is not a directory, holds no step file (the first three directories below it, up to
            :data:`SEARCH_DEPTH` levels, that do are named, then "and N more"), or two files have the same N.
    """
    log_dir = Path(log_dir)
    _require_dir(log_dir)
    found: dict[int, Path] = {}
    for path in log_dir.iterdir():
        match = STEP_FILE.match(path.name)
        if match is None or not path.is_file():
            continue
        step = int(match.group(1))
        if step in found:
            raise BadInputError(path, 0, f"step {step} also in {found[step].name}")
        found[step] = path
    if not found:
        nested = find_log_dirs(log_dir)
        more = f" and {len(nested) - _MAX_HINTS} more" if len(nested) > _MAX_HINTS else ""
        hint = (
            f"; found some in {', '.join(map(str, nested[:_MAX_HINTS]))}{more}: pass one of those"
            if nested
            else f" in it or {SEARCH_DEPTH} levels below it (NeMo-RL writes them to "
            "logger.log_dir during GRPO training; nemo-ais run to <run_dir>/logs/<arm>_seed<n>)"
        )
        raise BadInputError(log_dir, 0, f"no train_data_step{{N}}.jsonl files{hint}")
    return [StepFile(s, found[s], found[s].stat().st_size) for s in sorted(found)]


def _natural(log_dir: Path) -> list[list[int | str]]:
    """Natural path order: exp_999 before exp_1000, a launch before the exp_NNN nested in it."""
    return [[int(t) if t.isdigit() else t for t in re.split(r"(\d+)", part)] for part in log_dir.parts]


def join_launches(log_dirs: list[Path]) -> list[list[Path]]:
    """Group log directories into runs, the launches of a resumed NeMo-RL run together.

    Each launch logs to a new ``exp_NNN`` (beside the earlier ones, or inside the first launch's when resumed with the
    checkpoint's config), and a launch resumed from step N's checkpoint logs from step N + 1 on. So an ``exp_NNN``
    whose first step file F is not step 1 continues the one earlier run there (an ``exp_MMM`` beside it, M < N, or
    the directory it is in) that logged step F - 1 or later; with none or several such runs it is analysed alone,
    with a warning. Any other directory begins a run of its own.
    ``[exp_001 (1-57), exp_002 (1-30), exp_003 (51-100)]`` -> ``[[exp_001, exp_003], [exp_002]]``.
    """
    runs: list[list[Path]] = []
    span: dict[int, tuple[int, int]] = {}  # id(run) -> its first step and its last as stitched so far
    for log_dir in sorted(log_dirs, key=_natural):
        steps = sorted(int(m.group(1)) for p in log_dir.iterdir() if (m := STEP_FILE.match(p.name)))
        first = steps[0] if steps else 1
        if LAUNCH_DIR.match(log_dir.name) and first > 1:
            candidates = [
                run
                for run in runs
                if log_dir.parent in {*run, *(d.parent for d in run)}
                and span[id(run)][0] < first <= span[id(run)][1] + 1
            ]
            if len(candidates) == 1:
                candidates[0].append(log_dir)
                span[id(candidates[0])] = (span[id(candidates[0])][0], steps[-1])
                continue
            logger.warning(
                "%s starts at step %d, a launch resumed from a checkpoint, but %s; analysed as a run of its own "
                "(analyze_run([...]) joins launches given in order)",
                log_dir,
                first,
                f"{' and '.join(str(r[-1]) for r in candidates)} each logged step {first - 1}"
                if candidates
                else f"no earlier launch beside it logged step {first - 1}",
            )
        runs.append([log_dir])
        span[id(runs[-1])] = (first, steps[-1] if steps else 0)  # each directory is listed once
    return runs


def stitch_launches(launches: list[list[StepFile]]) -> tuple[list[StepFile], list[StepFile]]:
    """``(kept, rolled_back)``: a resumed run's step files, each launch's (``find_step_files``) in launch order.

    A launch whose first step is N resumed from step N - 1's checkpoint, so it replaces every step >= N that the
    launches before it logged (rolled back, whether or not it logs that step again).
    """
    kept: list[StepFile] = []
    rolled_back: list[StepFile] = []
    for files in launches:
        rolled_back += [f for f in kept if f.step >= files[0].step]
        kept = [f for f in kept if f.step < files[0].step] + files
    return kept, rolled_back


def missing_steps(files: list[StepFile]) -> list[int]:
    """Steps between the first and the last step file that have no file: 1, 2, 4 -> ``[3]``."""
    present = {f.step for f in files}
    first, last = min(present, default=0), max(present, default=-1)
    return [s for s in range(first, last + 1) if s not in present]


def format_steps(steps: list[int], limit: int = 10) -> str:
    """``[3, 7, 8, 9]`` -> ``"3, 7-9"``; after ``limit`` ranges, ``"... and N more"``."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    if len(runs) > limit:
        rest = sum(b - a + 1 for a, b in runs[limit:])
        text += f" and {rest} more"
    return text


def _loads(raw: bytes) -> object:
    if _fast_loads is not None:
        try:
            return _fast_loads(raw)
        except _FAST_ERRORS:
            pass
    return json.loads(raw)


def _unwrap(key: str, value: object) -> object:
    """NeMo-RL wraps each value as a batch of one: ``[[...]]`` -> ``[...]``, ``[x]`` -> ``x``."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    raise _RowError(f"{key}: expected a batch of one ([[...]] or [x], as NeMo-RL's logger writes), got {_short(value)}")


def _short(value: object) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"{type(value).__name__} {value!r}"[:60]


def _huge(value: object) -> bool:
    """An int (JSON allows any) that no float64 holds."""
    return type(value) is int and abs(value) > sys.float_info.max


def _vector(key: str, value: object, has_bool: bool) -> torch.Tensor:
    """``[[v_0, ..., v_{S-1}]]`` -> a 1-D float64 tensor; only numbers (no bool, no lists)."""
    inner = _unwrap(key, value)
    if not isinstance(inner, list):
        raise _RowError(f"{key}: expected [[numbers]], got [{_short(inner)}]")
    try:
        out = torch.tensor(inner, dtype=_DTYPE)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        out = None
    # has_bool: the line holds a JSON boolean somewhere, perhaps only in its text; map(type) finds one here at C speed
    if out is None or out.dim() != 1 or (has_bool and bool in set(map(type, inner))):
        j, bad = next(
            ((j, v) for j, v in enumerate(inner) if isinstance(v, bool) or not isinstance(v, int | float) or _huge(v)),
            (None, None),
        )
        if j is not None:
            if isinstance(bad, list):
                what = "a nested list"
            elif _huge(bad):
                what = "an integer beyond float64 range"
            else:
                what = _short(bad)
            raise _RowError(
                f"{key}: expected numbers in one flat list ([[v_0, ..., v_S-1]]), found {what} at position {j}"
            )
        if out is None:  # pragma: no cover - every non-number is caught above
            raise _RowError(f"{key}: expected a flat list of numbers")
    return out


def _parse_row(raw: bytes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prev, gen, mask) of one row, aligned ``[1:]``; raises :class:`_RowError`."""
    try:
        row = _loads(raw)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError; an int over 4300 digits
        cut = not raw.endswith(b"\n")  # only a file's last line can lack it
        what = "truncated line (no newline at the end of the file)" if cut else "not valid JSON"
        raise _RowError(f"{what}: {err}") from None
    if not isinstance(row, dict):
        raise _RowError(f"expected a JSON object per line, got {type(row).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise _RowError(
            f"missing key(s) {', '.join(missing)} (need {', '.join(REQUIRED_KEYS)}; has {', '.join(sorted(row))})"
        )
    has_bool = b"true" in raw or b"false" in raw  # JSON booleans (cheap pre-check)
    prev = _vector("prev_logprobs", row["prev_logprobs"], has_bool)
    gen = _vector("generation_logprobs", row["generation_logprobs"], has_bool)
    token_mask = _vector("token_loss_mask", row["token_loss_mask"], has_bool)
    lengths = {
        k: len(v[0])
        for k, v in ((k, row.get(k)) for k in _PER_TOKEN_KEYS)
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list)
    }
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k} {n}" for k, n in lengths.items())
        raise _RowError(f"lists have mismatched lengths: {shown}")
    sample_mask = _unwrap("sample_loss_mask", row["sample_loss_mask"])
    if isinstance(sample_mask, bool) or not isinstance(sample_mask, int | float):
        raise _RowError(f"sample_loss_mask: expected [0 or 1], got [{_short(sample_mask)}]")
    if sample_mask not in (0, 1):
        raise _RowError(f"sample_loss_mask: expected 0 or 1, got {str(sample_mask)[:60]}")
    bad_mask = torch.nonzero((token_mask != 0) & (token_mask != 1))
    if bad_mask.numel():
        j = int(bad_mask[0])
        raise _RowError(f"token_loss_mask: value {float(token_mask[j])} at position {j}, expected 0 or 1")
    return prev[1:], gen[1:], token_mask[1:] * sample_mask


def _chunk(
    rows: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]], path: Path, filtered_sampling: bool = False
) -> Chunk:
    width = max((r[1].numel() for r in rows), default=0)
    shape = (len(rows), width)
    logp_old, logp_rollout = torch.zeros(shape, dtype=_DTYPE), torch.zeros(shape, dtype=_DTYPE)
    valid = torch.zeros(shape, dtype=torch.bool)
    for i, (_, prev, gen, mask) in enumerate(rows):
        n = prev.numel()
        logp_old[i, :n], logp_rollout[i, :n], valid[i, :n] = prev, gen, mask == 1
    # NeMo-RL logs float32 log-probs: beyond float32's range is as corrupt as NaN / inf
    finite = (logp_old.abs() <= FP32_MAX) & (logp_rollout.abs() <= FP32_MAX)
    bad = valid & ~finite
    kept, n_filtered = valid & finite, 0
    if filtered_sampling:  # NeMo-RL writes 0.0 where the trainer's filtered distribution excludes the sampled token
        placeholder = kept & (logp_old == 0) & (logp_rollout < 0)  # (mask_out_neg_inf_logprobs); its loss: ratio 1
        kept, n_filtered = kept & ~placeholder, int(placeholder.sum())
    chunk = Chunk(
        logp_old=torch.where(finite, logp_old, 0.0),
        logp_rollout=torch.where(finite, logp_rollout, 0.0),
        valid=kept,
        lines=[r[0] for r in rows],
        n_filtered=n_filtered,
    )
    if bad.any():
        i, j = (int(v) for v in torch.nonzero(bad)[0])
        chunk.n_nonfinite = int(bad.sum())
        which = "prev_logprobs" if not abs(logp_old[i, j]) <= FP32_MAX else "generation_logprobs"
        value = float(logp_old[i, j] if which == "prev_logprobs" else logp_rollout[i, j])
        chunk.first_nonfinite = f"{path.name}:{rows[i][0]} {which}[{j + 1}] = {value}"
    return chunk


def _bad_row(path: Path, lineno: int, err: _RowError, skip: bool, counts: ReadCounts) -> None:
    """Raise :class:`BadInputError` for a bad row, or (``skip``) count it."""
    if not skip:
        raise BadInputError(path, lineno, f"{err} ({_SKIP_BAD_ROWS_HINT})") from None
    counts.bad_rows += 1
    if len(counts.bad_examples) < 3:
        counts.bad_examples.append(f"{path.name}:{lineno}: {err}")


def cut_off_error(path: Path, lineno: int, what: str, skip: bool) -> BadInputError:
    """A step file its writer did not finish (``what``: the evidence): :class:`CutOffStepError` if ``skip``."""
    problem = f"{what}; the writer stopped there, the rows it had yet to write are missing"
    if skip:
        return CutOffStepError(path, lineno, problem)
    return BadInputError(path, lineno, f"{problem} (--skip-bad-rows skips such a step)")


def iter_chunks(
    step_file: StepFile,
    *,
    chunk_tokens: int,
    skip_bad_rows: bool = False,
    counts: ReadCounts | None = None,
    on_bytes: Callable[[int], None] | None = None,
    filtered_sampling: bool = False,
) -> Iterator[Chunk]:
    """Stream one step file as aligned chunks of at most ``chunk_tokens`` positions.

    Args:
        chunk_tokens: positions (rows x aligned length) per chunk; a longer row is its own chunk.
        filtered_sampling: the run trained with top-k / top-p filtering: a valid position with ``prev_logprobs`` 0
            and ``generation_logprobs`` < 0 is NeMo-RL's placeholder, left out (counted in ``Chunk.n_filtered``).
        counts: filled with rows read / bad rows skipped.
        on_bytes: called with the bytes of each line read (progress bar).

    Trailing blank lines are skipped; a blank line followed by a row is a bad row.

    Raises:
        BadInputError: the first bad row (unless ``skip_bad_rows``), or an empty file.
        CutOffStepError: with ``skip_bad_rows``, the file's last line lacks its newline (raised after the chunks
            before it: a caller that keeps a step's chunks drops them); without, a :class:`BadInputError`.
    """
    counts = counts if counts is not None else ReadCounts()
    path = step_file.path
    rows: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    width = lineno = 0
    blank = 0  # first blank line not yet followed by a row (trailing ones are skipped)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if on_bytes is not None:
                on_bytes(len(raw))
            if not raw.strip():
                blank = blank or lineno
                continue
            if blank:  # a blank line followed by a row: bad input at the blank line
                _bad_row(path, blank, _RowError("empty line"), skip_bad_rows, counts)
                blank = 0
            try:
                prev, gen, mask = _parse_row(raw)
            except _RowError as err:
                if not raw.endswith(b"\n"):
                    raise cut_off_error(path, lineno, str(err), skip_bad_rows) from None
                _bad_row(path, lineno, err, skip_bad_rows, counts)
                continue
            if not raw.endswith(b"\n"):  # a whole row, its newline not written
                raise cut_off_error(
                    path, lineno, "the last row has no newline (NeMo-RL's logger ends each with one)", skip_bad_rows
                )
            counts.rows += 1
            if rows and max(width, prev.numel()) * (len(rows) + 1) > chunk_tokens:
                yield _chunk(rows, path, filtered_sampling)
                rows, width = [], 0
            rows.append((lineno, prev, gen, mask))
            width = max(width, prev.numel())
    counts.lines = lineno
    if counts.rows + counts.bad_rows == 0:
        raise EmptyStepError(path, 0, "empty file (no rows)")
    if rows:
        yield _chunk(rows, path, filtered_sampling)
