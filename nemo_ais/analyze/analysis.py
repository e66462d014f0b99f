# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais analyze``: replay every correction mode over a NeMo-RL run's step logs.

Per ``LOG_DIR/train_data_step{N}.jsonl`` in order of N (:mod:`.reader`): the core's AIS diagnostics, alpha and mode
weights (:mod:`.replay`) and the refit guard (:mod:`nemo_ais.alarms`); written to ``analysis.jsonl`` as the steps are
read, then ``report.md`` and PNG plots (:mod:`.report`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from nemo_ais.alarms import AISAlarmsConfig, AlarmConfig, AlarmMonitor, alarm_metrics
from nemo_ais.analyze.placement import load_study
from nemo_ais.analyze.reader import (
    LAUNCH_DIR,
    BadInputError,
    EmptyStepError,
    StepFile,
    cut_off_error,
    find_log_dirs,
    find_step_files,
    format_steps,
    join_launches,
    missing_steps,
    stitch_launches,
)
from nemo_ais.analyze.replay import StepResult, replay_step
from nemo_ais.analyze.report import write_report
from nemo_ais.config import CorrectionConfig, require_config, validate_section
from nemo_ais.core import AISState
from nemo_ais.core.metrics import AIS_METRIC_NAMES
from nemo_ais.rollout.readback import READBACK_FILE, read_readback

logger = logging.getLogger(__name__)

ANALYSIS_FILE = "analysis.jsonl"
DEFAULT_OUT = "ais_analysis"
_SECTIONS = {"loss_fn.ais": CorrectionConfig, "alarms": AlarmConfig}


def output_dir(log_dir: Path | str, out_dir: Path | str | None = None) -> Path:
    """Where an analysis of ``log_dir`` writes: ``out_dir``, else ``log_dir/ais_analysis``."""
    return Path(out_dir) if out_dir is not None else Path(log_dir) / DEFAULT_OUT


@dataclass
class AnalysisResult:
    """What :func:`analyze_run` produced."""

    out_dir: Path
    rows: list[dict[str, Any]]
    files: list[Path]
    bad_rows: int
    missing_steps: list[int] = field(default_factory=list)
    global_batches_per_step: int = 1
    bad_readback_rows: int = 0

    @property
    def alarms(self) -> list[str]:
        """Every fired alarm (``step N: kind: evidence``), in step order."""
        return [a for r in self.rows for a in r["alarms"]]


def analysis_row(result: StepResult, alarms: Sequence[Any]) -> dict[str, Any]:
    """One ``analysis.jsonl`` row: ``step``, the docs/metrics.md ``ais/*`` names, the rest."""
    diag = result.diagnostics.as_dict()
    quarters = result.profile.quarters()
    row: dict[str, Any] = {"step": result.step}
    row.update({name: diag[name.removeprefix("ais/")] for name in AIS_METRIC_NAMES})
    row["analysis/ess_tok"] = result.diagnostics.ess_tok  # 1 / (1 + CV^2) (docs/method.md)
    for mode, summary in result.weights.items():
        row.update({f"weights/{mode}/{k}": v for k, v in summary.items()})
    row.update(
        {
            "analysis/rows": result.counts.rows,
            "analysis/bad_rows": result.counts.bad_rows,
            "analysis/positions": result.n_positions,
            "analysis/nonfinite": result.n_nonfinite,
            "analysis/filtered_placeholders": result.n_filtered,
            "analysis/kv_sequences": result.profile.n_seq,
            "analysis/abs_log_rho_by_quarter": [q[0] for q in quarters] if quarters else [],
        }
    )
    row.update(alarm_metrics(list(alarms)))
    row["alarms"] = [str(a) for a in alarms]
    return row


def _section(data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """``data``'s dotted ``path`` as a mapping ({} if absent); ValueError naming the key that is not one."""
    node: Any = data
    for depth, key in enumerate(path.split(".")):
        node = node.get(key)
        if node is None:
            return {}
        if not isinstance(node, Mapping):
            where = ".".join(path.split(".")[: depth + 1])
            raise ValueError(f"{where}: expected a mapping of fields, got {type(node).__name__}")
    return node


def _where_set(line: str, overridden: set[str]) -> str:
    """An error line on ``loss_fn.ais_alarms.<field>`` as ``alarms.<field>`` when an override set the field."""
    field = re.match(r"loss_fn\.ais_alarms\.(\w+)", line)
    return "alarms." + line.removeprefix("loss_fn.ais_alarms.") if field and field[1] in overridden else line


def load_analysis_config(
    path: Path | str | None, overrides: Sequence[str] = ()
) -> tuple[CorrectionConfig, AlarmConfig]:
    """The ``loss_fn.ais`` and ``alarms`` sections from a YAML file and ``key=value`` overrides.

    The file may be a NeMo-RL run config (``defaults:`` inheritance is resolved; only ``loss_fn.ais`` and the alarms are
    read: a top-level ``alarms`` section, else the online guard's ``loss_fn.ais_alarms`` without ``enabled`` and
    ``fail_on_alarm``) or an embedded one. Overrides are ``loss_fn.ais.<field>=value`` (a mode's knob:
    ``loss_fn.ais.<mode>.<field>=value``) or ``alarms.<field>=value`` (YAML values).

    Raises:
        FileNotFoundError: the file (or a ``defaults:`` parent) does not exist.
        ValueError: a malformed override or an invalid field (named with its path).
    """
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    online = False  # the alarms are the online guard's loss_fn.ais_alarms
    if path is not None:
        from nemo_ais.preflight import load_config

        data = load_config(path)
        loss_fn = _section(data, "loss_fn")
        sections["loss_fn.ais"] = dict(_section(data, "loss_fn.ais"))
        online = not data.get("alarms") and loss_fn.get("ais_alarms") is not None
        alarms = _section(data, "loss_fn.ais_alarms" if online else "alarms")
        # the run's own thresholds; whether its training step failed on an alarm is not ours (an override's is)
        drop = ("enabled", "fail_on_alarm") if online else ()
        sections["alarms"] = {k: v for k, v in alarms.items() if k not in drop}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section = next((name for name in _SECTIONS if key.startswith(f"{name}.")), None)
        leaf = key.removeprefix(f"{section}.") if section else ""
        if not sep or section is None or not leaf:
            raise ValueError(
                f"override {item!r} is invalid: expected loss_fn.ais.<field>=value (a mode's "
                "knob: loss_fn.ais.<mode>.<field>=value) or alarms.<field>=value"
            )
        *parents, name = leaf.split(".")
        node = sections[section]
        for part in parents:  # a sub-section, e.g. loss_fn.ais.icepop.min
            node = node.setdefault(part, {})
        try:
            node[name] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ValueError(f"override {item!r}: value is not YAML ({err})") from None
    if online:  # validated with the overrides: a bad value is named by where it was set
        given = {item.partition("=")[0].removeprefix("alarms.") for item in overrides if item.startswith("alarms.")}
        try:
            guard = validate_section(AISAlarmsConfig, sections["alarms"], "loss_fn.ais_alarms")
        except ValueError as err:
            raise ValueError("\n".join(_where_set(line, given) for line in str(err).splitlines())) from None
        sections["alarms"] = guard.model_dump(exclude_unset=True, exclude={"enabled"})
    return tuple(validate_section(model, sections[n], n) for n, model in _SECTIONS.items())


def _short_last_step(n_rows: int, earlier: list[int]) -> bool:
    """The last step file holds fewer rows than every earlier one, which all agree (at least two): cut off.

    NeMo-RL logs every step's whole rollout batch (``num_prompts_per_step x num_generations_per_prompt``), one row per
    sample, so a shorter last file is one its writer did not finish (one cut mid-row is :class:`CutOffStepError`).
    """
    return len(earlier) >= 2 and len(set(earlier)) == 1 and n_rows < earlier[0]


def global_batches_per_step(path: Path | str) -> int:
    """Optimizer steps per GRPO step of a run config: rollout batch / train_global_batch_size.

    Rounded down, as NeMo-RL's workers count them (``total // gbs``: rows past the last whole global batch are not
    trained); at least 1; 1 when the config does not give them (the embedded recipe's ``null``: the whole step).
    ``FileNotFoundError``: no such file (or ``defaults:`` parent); ``ValueError``: a section is not a mapping.
    """
    from nemo_ais.preflight import load_config

    data = load_config(path)
    grpo, policy = _section(data, "grpo"), _section(data, "policy")
    prompts, generations = grpo.get("num_prompts_per_step"), grpo.get("num_generations_per_prompt")
    global_batch = policy.get("train_global_batch_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (prompts, generations, global_batch)):
        return 1
    return max(1, prompts * generations // global_batch)


def trains_with_filtered_sampling(path: Path | str) -> bool:
    """Whether a run config samples with top-k or top-p filtering (NeMo-RL's ``need_top_k_or_top_p_filtering``).

    ``policy.generation.top_k`` >= 1 or ``top_p`` != 1: the trainer then logs the placeholder ``prev_logprobs`` 0
    where its filtered distribution excludes the sampled token. FileNotFoundError: no file.
    """
    from nemo_ais.preflight import load_config

    generation = _section(load_config(path), "policy.generation")
    top_k, top_p = generation.get("top_k"), generation.get("top_p")
    return (isinstance(top_k, int) and top_k > 0) or (top_p is not None and top_p != 1.0)


def _replay(step_file: StepFile, *args: Any, **kwargs: Any) -> StepResult:
    """:func:`replay_step`; an unexpected error becomes a one-line :class:`BadInputError`."""
    try:
        return replay_step(step_file, *args, **kwargs)
    except (BadInputError, OSError):
        raise
    except Exception as err:  # a backstop: name the file, keep the first line only
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise BadInputError(step_file.path, 0, f"unexpected {type(err).__name__} while analysing it: {first}") from err


def _warn_if_resumed(log_dir: Path, first_step: int) -> None:
    """Warn when ``log_dir`` (first step file ``first_step``) continues launches beside it (:func:`join_launches`)."""
    if not LAUNCH_DIR.match(log_dir.name) or first_step == 1:
        return
    run = next((r for r in join_launches(find_log_dirs(log_dir.parent, max_depth=1)) if log_dir in r), [log_dir])
    if len(run) > 1:
        earlier = " + ".join(str(d) for d in run[: run.index(log_dir)])
        logger.warning(
            "%s is a launch resumed from a checkpoint that continues %s; analysed alone it starts a fresh alpha EMA and "
            "alarm history: analyse %s to join the launches",
            log_dir,
            earlier,
            log_dir.parent,
        )


def _launches(log_dir: Path | str | Sequence[Path | str]) -> list[Path]:
    """``log_dir`` as the list of a run's launches (ValueError: none, or one given twice)."""
    if isinstance(log_dir, str | Path):
        return [Path(log_dir)]
    launches = [Path(d) for d in log_dir]
    if not launches:
        raise ValueError("analyze_run(log_dir): expected a log directory or a non-empty list of a run's launches")
    if len(set(launches)) < len(launches):
        raise ValueError(f"analyze_run(log_dir): a launch is given twice in {[str(d) for d in launches]}")
    return launches


def _read_launches(
    launches: list[Path], skip_bad_rows: bool
) -> tuple[list[StepFile], list[str], dict[int, Any], list[str]]:
    """A run's step files, rolled-back steps (``exp_001: 51-57``), refit readbacks by step, bad readback rows skipped.

    A bad readback row raises unless ``skip_bad_rows``; then it is skipped and listed as ``file:line: problem``.
    """
    per_launch = [find_step_files(d) for d in launches]
    for i, (log_dir, own) in enumerate(zip(launches, per_launch, strict=True)):
        if i and own[0].step == 1:
            raise ValueError(
                f"analyze_run(log_dir): launch {i + 1} ({log_dir}) starts at step 1, so it resumed nothing; give a "
                "run's launches in the order they ran (each after the first starts where its checkpoint left off)"
            )
    files, rolled_back = stitch_launches(per_launch)
    readbacks: dict[int, Any] = {}
    bad_readback: list[str] = []
    for log_dir, own in zip(launches, per_launch, strict=True):
        rows, problems = read_readback(log_dir / READBACK_FILE)
        if problems and not skip_bad_rows:
            raise BadInputError(log_dir / READBACK_FILE, *problems[0])
        bad_readback += [str(BadInputError(log_dir / READBACK_FILE, *p)) for p in problems]
        readbacks = {s: r for s, r in readbacks.items() if s < own[0].step} | rows
    dropped = [
        f"{d.name}: {format_steps(steps)}"
        for d in launches
        if (steps := sorted(f.step for f in rolled_back if f.path.parent == d))
    ]
    if bad_readback:
        logger.warning("skipping %d bad refit readback row(s), first: %s", len(bad_readback), bad_readback[0])
    return files, dropped, readbacks, bad_readback


def analyze_run(
    log_dir: Path | str | Sequence[Path | str],
    out_dir: Path | str | None = None,
    config: CorrectionConfig | None = None,
    alarm_config: AlarmConfig | None = None,
    *,
    skip_bad_rows: bool = False,
    progress: bool = False,
    plots: bool = True,
    chunk_tokens: int = 1 << 20,
    memory_budget_bytes: int = 128 << 20,
    global_batches_per_step: int = 1,
    tolerance: Path | str | None = None,
    filtered_sampling: bool = False,
) -> AnalysisResult:
    """Analyse every step of ``log_dir``; write ``analysis.jsonl``, ``report.md`` and plots.

    Args:
        log_dir: a NeMo-RL ``logger.log_dir`` holding ``train_data_step{N}.jsonl`` files, or a resumed run's launches
            in order (``[exp_001, exp_002]``, stitched by :func:`~nemo_ais.analyze.reader.stitch_launches`); the EMA
            state and the alarm history carry across them, as the AIS worker's checkpoint carries them.
        out_dir: output directory (default ``<the last launch's log_dir>/ais_analysis``).
        config: the ``loss_fn.ais`` section (default: CorrectionConfig's defaults).
        alarm_config: refit-guard thresholds; ``fail_on_alarm`` never stops the analysis (``nemo-ais analyze``: exit 3).
        skip_bad_rows: count and skip bad rows (step files, refit_readback.jsonl) instead of stopping at the first.
        progress: show a progress bar (bytes read) on stderr.
        chunk_tokens: positions per chunk read at once (bounds the memory).
        memory_budget_bytes: per step, aligned chunks kept in memory for the ``ais`` pass; the rest spills to disk.
        global_batches_per_step: of the run (:func:`global_batches_per_step`); above 1, a warning and the report say the
            replayed alpha differs from the online one.
        tolerance: a dose-response study's ``tolerance.json`` (default: the shipped one).
        filtered_sampling: the run trained with top-k / top-p filtering (:func:`trains_with_filtered_sampling`):
            ``prev_logprobs`` 0 placeholders are left out, as NeMo-RL's loss does (``analysis/filtered_placeholders``).

    A gap in the step files (steps 1, 2, 4) is warned about and listed in the report and
    :attr:`AnalysisResult.missing_steps`; the steps present are analysed.

    Raises:
        BadInputError: ``file:line: problem`` for the first bad input; any other error while a step file is analysed
            (except ``OSError`` and ``KeyboardInterrupt``) becomes ``file:0: unexpected <type>: <first line>``.
        TypeError: ``config`` or ``alarm_config`` is not the config object (e.g. a dict).
    """
    require_config(config, CorrectionConfig, "analyze_run(config)", optional=True)
    require_config(alarm_config, AlarmConfig, "analyze_run(alarm_config)", optional=True)
    launches = _launches(log_dir)
    one_dir = isinstance(log_dir, str | Path)  # not a list: the caller did not choose the launches
    log_dir = launches[-1]
    study = load_study(None if tolerance is None else Path(tolerance))
    config = config if config is not None else CorrectionConfig()
    alarm_config = alarm_config if alarm_config is not None else AlarmConfig()
    monitor_config = alarm_config.model_copy(update={"fail_on_alarm": False})  # never raise
    files, rolled_back, readbacks, bad_readback = _read_launches(launches, skip_bad_rows)
    if one_dir:
        _warn_if_resumed(log_dir, files[0].step)
    gaps = missing_steps(files)
    if gaps:
        logger.warning(
            "%s: %d step file(s) missing between steps %d and %d: %s (analysing the %d present)",
            " + ".join(map(str, launches)),
            len(gaps),
            files[0].step,
            files[-1].step,
            format_steps(gaps),
            len(files),
        )
    if global_batches_per_step > 1:
        logger.warning(
            "the run has %d global batches per step: online, alpha is formed once per global batch; this replay forms "
            "one per step file, so the replayed alpha differs from the online one",
            global_batches_per_step,
        )
    out = output_dir(log_dir, out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInputError(out, 0, f"cannot create the output directory ({err.strerror})") from None
    state, monitor = AISState(), AlarmMonitor(monitor_config)
    rows: list[dict[str, Any]] = []
    bad_rows, rows_read, bad_examples = 0, 0, []
    bar = tqdm(
        total=sum(f.nbytes for f in files),
        unit="B",
        unit_scale=True,
        desc="nemo-ais analyze",
        disable=None if progress else True,  # None: off when stderr is not a terminal
        leave=False,
    )
    # rows stream into a .partial file, renamed when every step is in: a failed or interrupted analysis never leaves an
    # analysis.jsonl that looks complete (or pairs with an old report)
    partial = out / f"{ANALYSIS_FILE}.partial"
    empty: list[str] = []  # with skip_bad_rows: steps without a row to analyse or cut off mid-row, skipped
    masked: list[str] = []  # steps whose rows hold no valid token, analysed as empty global batches
    row_counts: list[int] = []  # rows (bad ones included) of each step analysed
    with bar, partial.open("w") as f:
        for step_file in files:
            bar.set_postfix_str(f"step {step_file.step}", refresh=False)
            try:
                result = _replay(
                    step_file,
                    config,
                    state,
                    chunk_tokens=chunk_tokens,
                    memory_budget_bytes=memory_budget_bytes,
                    skip_bad_rows=skip_bad_rows,
                    on_bytes=bar.update,
                    kv_min_length=alarm_config.kv_min_length,
                    filtered_sampling=filtered_sampling,
                )
                n_rows = result.counts.rows + result.counts.bad_rows
                if step_file is files[-1] and _short_last_step(n_rows, row_counts):
                    what = f"{n_rows} rows where each of the {len(row_counts)} earlier steps has {row_counts[0]}"
                    raise cut_off_error(step_file.path, 0, f"{what} (cut at a row boundary)", skip_bad_rows)
            except EmptyStepError as err:
                if not skip_bad_rows:
                    raise
                logger.warning("skipping step %d: %s", step_file.step, err)
                empty.append(f"{step_file.path.name}: {err.problem}")
                continue
            row_counts.append(n_rows)
            fired = monitor.observe(
                result.step,
                result.diagnostics,
                n_nonfinite=result.n_nonfinite,
                nonfinite_where=result.first_nonfinite,
                profile=result.profile,
                readback=readbacks.get(result.step),
            )
            # NeMo-RL masked every sequence (seq_logprob_error_threshold, overlong filtering); non-finite log-probs are
            # the nonfinite alarm's
            if result.n_tok == 0 and result.n_nonfinite == 0:
                logger.warning(
                    "step %d: no valid token in %d rows: an empty global batch", result.step, result.counts.rows
                )
                masked.append(f"{step_file.path.name} ({result.counts.rows} rows)")
            row = analysis_row(result, fired)
            f.write(json.dumps(row) + "\n")
            f.flush()
            rows.append(row)
            bad_rows += result.counts.bad_rows
            rows_read += result.counts.rows
            bad_examples += result.counts.bad_examples[: 3 - len(bad_examples)]
    if not rows:
        raise BadInputError(log_dir, 0, f"no step file with a row to analyse ({len(empty)} skipped)")
    meta = {
        "log_dir": str(log_dir),
        "launches": [str(d) for d in launches],
        "rolled_back": rolled_back,
        "empty_steps": empty,
        "masked_steps": masked,
        "files": len(files),
        "rows_read": rows_read,
        "bad_rows": bad_rows,
        "bad_examples": bad_examples,
        "bad_readback": bad_readback,
        "config": config.model_dump(exclude_defaults=True),
        "alarm_config": alarm_config.model_dump(exclude_defaults=True, exclude={"fail_on_alarm"}),
        "missing_steps": gaps,
        "global_batches_per_step": global_batches_per_step,
        "filtered_sampling": filtered_sampling,
        "filtered_placeholders": sum(r["analysis/filtered_placeholders"] for r in rows),
        "tolerance": study,
    }
    write_report(out, rows, meta, plots=plots)
    os.replace(partial, out / ANALYSIS_FILE)  # last: a failed report leaves the .partial
    return AnalysisResult(
        out, rows, [f.path for f in files], bad_rows, gaps, global_batches_per_step, len(bad_readback)
    )
