# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais run``: the experiment driver around :class:`~nemo_ais.embedded.recipe.GRPORecipe`.

:func:`run_experiment` validates the config, pins it in the run directory, trains the cached warm start alone, then
launches ``cluster.dp_size`` gloo ranks that run every (arm, seed) in order (:func:`_worker`), and writes the report.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from nemo_ais.embedded.config import RecipeConfig, migrate_config, resolve_arm, validate_config
from nemo_ais.embedded.dist import DistContext, RecipeError, launch
from nemo_ais.embedded.logs import METRICS_FILE
from nemo_ais.embedded.recipe import GRPORecipe
from nemo_ais.embedded.warmstart import build_task, warm_start

CONFIG_FILE = "config.yaml"
# Keys free to change on resume: none changes a result (the warm-start cache file is named by the settings that do).
_RESUME_FREE_KEYS = (
    "logger.run_dir",  # where the run is: its pinned config.yaml was found there ("runs", "./runs", a moved one)
    "logger.name",
    "logger.progress_bar",
    "logger.plots",
    "cluster",
    "experiment.include",
    "policy.warm_start.cache_dir",
)


def _worker(ctx: DistContext, raw: dict[str, Any], run_dir: str, warm_file: str | None) -> None:
    """Every (arm, seed) run, in order, on this rank."""
    base = resolve_arm(raw, None)
    torch.set_num_threads(base.cluster.num_threads_per_rank)
    runs = [(arm, seed) for arm in base.experiment.arm_names for seed in base.experiment.seeds]
    progress = None
    if ctx.is_main and base.logger.progress_bar:
        progress = tqdm(total=len(runs) * base.grpo.max_num_steps, desc="GRPO steps", unit="step")
    try:
        for arm, seed in runs:
            recipe = GRPORecipe(
                resolve_arm(raw, arm),
                arm=arm,
                seed=seed,
                ctx=ctx,
                run_dir=Path(run_dir),
                warm_start_file=Path(warm_file) if warm_file else None,
                progress=progress,
            )
            recipe.setup()
            recipe.train()
    finally:
        if progress is not None:
            progress.close()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def prepare_run_dir(raw: dict[str, Any], base: RecipeConfig, overwrite: bool) -> Path:
    """Create (or reopen) ``logger.run_dir/logger.name`` and pin its config.

    Raises:
        RecipeError: the directory is not writable, or holds results of a run with another config (a
            config pinned by a run that failed before its first result, e.g. in the warm start, is re-pinned).
    """
    run_dir = Path(base.logger.run_dir) / base.logger.name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise RecipeError(
            f"run directory {run_dir} is not writable ({err.strerror or err}); choose another "
            "with logger.run_dir=<dir> or logger.name=<name>"
        ) from None
    cfg_file = run_dir / CONFIG_FILE
    if overwrite:
        # every file the run and its report write: a plot or tolerance file left over would pass for the new run's
        for path in [
            *(run_dir / n for n in (METRICS_FILE, CONFIG_FILE, "summary.md", "tolerance.json")),
            *run_dir.glob("*.png"),
        ]:
            path.unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(run_dir / "logs", ignore_errors=True)
    elif cfg_file.is_file() and ((run_dir / METRICS_FILE).is_file() or (run_dir / "checkpoints").is_dir()):
        # a run pinned with the former rollout.fp8 block compares in the current keys
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            old = _flat(migrate_config(yaml.safe_load(cfg_file.read_text()) or {}))
            new = _flat(migrate_config(json.loads(json.dumps(raw))))
        free = lambda k: any(k == f or k.startswith(f + ".") for f in _RESUME_FREE_KEYS)  # noqa: E731
        diff = sorted(k for k in set(old) | set(new) if not free(k) and old.get(k) != new.get(k))
        if diff:
            shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
            raise RecipeError(
                f"{run_dir} holds a run with a different config ({shown}); resume it with the "
                "same config, pick another logger.name, or pass --overwrite to start over"
            )
    cfg_file.write_text(yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False))
    return run_dir


def run_experiment(raw: dict[str, Any], *, overwrite: bool = False) -> Path:
    """``nemo-ais run``: warm start, every arm x seed on the DP ranks, then the report.

    Re-running with the same config resumes from the last checkpoints. Returns the run directory; raises ``ValueError``
    (invalid config), ``RecipeError`` (a failed run) or ``KeyboardInterrupt`` (checkpoints kept).
    """
    from nemo_ais.embedded.report import write_report

    raw = migrate_config(raw)  # the former rollout.fp8 block: warned about once, here
    base = validate_config(raw)
    run_dir = prepare_run_dir(raw, base, overwrite)
    task = build_task(base)
    warm_file = None
    if base.policy.warm_start.steps > 0:
        threads = torch.get_num_threads()
        # the warm start runs alone, before the DP ranks: policy.warm_start.num_threads
        torch.set_num_threads(base.policy.warm_start.num_threads)
        try:
            warm_file = warm_start(base, task, progress=base.logger.progress_bar)
        finally:
            torch.set_num_threads(threads)
    launch(
        _worker,
        (raw, str(run_dir), str(warm_file) if warm_file else None),
        world_size=base.cluster.dp_size,
        num_threads=base.cluster.num_threads_per_rank,
        timeout_s=base.cluster.timeout_s,
    )
    write_report(run_dir, plots=base.logger.plots)  # summary.md always (the CLI names it)
    return run_dir
