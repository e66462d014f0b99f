# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais run``: the experiment driver around :class:`~nemo_ais.embedded.recipe.GRPORecipe`.

:func:`run_experiment` validates the config, pins it in the run directory, trains the cached warm start alone, then
launches ``cluster.dp_size`` gloo ranks that run every (arm, seed) in order (:func:`_worker`), and writes the report.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from nemo_ais.embedded.checkpoint import atomic_write, checkpoint_path, load_checkpoint
from nemo_ais.embedded.config import RecipeConfig, migrate_config, resolve_arm, validate_config
from nemo_ais.embedded.dist import DistContext, RecipeError, launch
from nemo_ais.embedded.logs import METRICS_FILE
from nemo_ais.embedded.recipe import GRPORecipe
from nemo_ais.embedded.warmstart import build_task, warm_start

try:
    import fcntl
except ImportError:  # not POSIX: one launcher per run directory is then the user's to keep
    fcntl = None

CONFIG_FILE = "config.yaml"
_LAUNCH_LOCK, _RANKS_LOCK = ".launch.lock", ".ranks.lock"  # held by the launcher / shared by its ranks
_RANKS_GONE_S = 5.0  # a killed launcher's ranks end within a second (dist.launch's parent watch)
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}  # flock unsupported where the directory is
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


def _lock(path: Path, mode: int) -> Any:
    """``path`` opened and ``flock``-ed (``mode`` | LOCK_NB), or None if another process holds it.

    Read-write: NFS turns ``flock`` into POSIX locks, and a shared one needs a readable file. Without fcntl, or on a
    filesystem without locks (Lustre ``noflock``, some FUSE mounts), the file unlocked, with a warning: one launch per
    directory is then the user's to keep.
    """
    handle = path.open("a+")
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    except OSError as err:
        if err.errno not in _NO_LOCKS:
            handle.close()
            raise
        warnings.warn(
            f"{path}: the filesystem has no file locks ({err.strerror}); run directory not claimed", stacklevel=2
        )
    return handle


@contextlib.contextmanager
def claim_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for one launch: refuse a second launcher, or ranks a killed launcher left behind.

    Raises:
        RecipeError: another ``nemo-ais run`` writes ``run_dir``, or its ranks still run after :data:`_RANKS_GONE_S`.
    """
    launch_lock = _lock(run_dir / _LAUNCH_LOCK, fcntl.LOCK_EX if fcntl else 0)
    if launch_lock is None:
        raise RecipeError(f"another nemo-ais run is writing {run_dir}: wait for it to end, or pick another logger.name")
    with launch_lock:
        deadline = time.monotonic() + _RANKS_GONE_S
        while (ranks := _lock(run_dir / _RANKS_LOCK, fcntl.LOCK_EX if fcntl else 0)) is None:
            if time.monotonic() > deadline:
                raise RecipeError(
                    f"trainer ranks of an earlier launch still write {run_dir} (their launcher was killed): end them "
                    f"(`fuser {run_dir / _RANKS_LOCK}` names them), then re-run"
                )
            time.sleep(0.1)
        ranks.close()  # this launch's ranks take it shared
        yield


def _worker(ctx: DistContext, raw: dict[str, Any], run_dir: str, warm_file: str | None) -> None:
    """Every (arm, seed) run, in order, on this rank."""
    ranks_lock = _lock(Path(run_dir) / _RANKS_LOCK, fcntl.LOCK_SH if fcntl else 0)  # held while this rank lives
    if ranks_lock is None:
        raise RecipeError(f"another launch's trainer ranks hold {run_dir}")
    with ranks_lock:
        _run_all(ctx, raw, run_dir, warm_file)


def _run_all(ctx: DistContext, raw: dict[str, Any], run_dir: str, warm_file: str | None) -> None:
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
    """Create (or reopen) ``logger.run_dir/logger.name`` and pin its config, under a claim released on return.

    Raises:
        RecipeError: as :func:`_run_dir` and :func:`pin_config`, or another launch holds the directory.
    """
    run_dir = _run_dir(base)
    with claim_run_dir(run_dir):
        pin_config(raw, run_dir, overwrite)
    return run_dir


def _run_dir(base: RecipeConfig) -> Path:
    """``logger.run_dir/logger.name``, created; ``RecipeError`` if it is not writable."""
    run_dir = Path(base.logger.run_dir) / base.logger.name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe.{os.getpid()}"  # per process: two launchers race to the claim, not here
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise RecipeError(
            f"run directory {run_dir} is not writable ({err.strerror or err}); choose another "
            "with logger.run_dir=<dir> or logger.name=<name>"
        ) from None
    return run_dir


def pin_config(raw: dict[str, Any], run_dir: Path, overwrite: bool) -> None:
    """Pin ``raw`` as the run's ``config.yaml`` (written whole); ``--overwrite`` first deletes the run's outputs.

    Raises:
        RecipeError: ``run_dir`` holds results of a run with another config, or results without a readable pinned
            config (a config pinned by a run that failed before its first result, e.g. in the warm start, is re-pinned).
    """
    cfg_file = run_dir / CONFIG_FILE
    results = [p.name for p in (run_dir / METRICS_FILE, run_dir / "checkpoints") if p.exists()]
    if overwrite:
        # every file the run and its report write (a plot or tolerance file left over would pass for the new run's);
        # the pinned config last, so that an interrupted --overwrite leaves no results without it
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(run_dir / "logs", ignore_errors=True)
        for path in [*(run_dir / n for n in (METRICS_FILE, "summary.md", "tolerance.json")), *run_dir.glob("*.png")]:
            path.unlink(missing_ok=True)
        if cfg_file.is_dir() and not cfg_file.is_symlink():
            shutil.rmtree(cfg_file)
        cfg_file.unlink(missing_ok=True)
    elif results:
        try:
            pinned = yaml.safe_load(cfg_file.read_text()) if cfg_file.is_file() else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise RecipeError(f"{cfg_file} cannot be read ({err}); pass --overwrite to start over") from None
        if not isinstance(pinned, dict):
            if pinned is not None:
                state = f"is a YAML {type(pinned).__name__}, not a mapping"
            elif cfg_file.is_file():
                state = "is empty"
            else:
                state = "is not a file" if cfg_file.exists() else "is missing"
            raise RecipeError(
                f"{run_dir} holds results ({', '.join(results)}) but no config pinned beside them ({CONFIG_FILE} "
                f"{state}: an interrupted --overwrite?), so a resume cannot be told from another run; pass "
                "--overwrite to start over, or pick another logger.name"
            )
        # a run pinned with the former rollout.fp8 block compares in the current keys
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            old = _flat(migrate_config(pinned))
            new = _flat(migrate_config(json.loads(json.dumps(raw))))
        free = lambda k: any(k == f or k.startswith(f + ".") for f in _RESUME_FREE_KEYS)  # noqa: E731
        diff = sorted(k for k in set(old) | set(new) if not free(k) and old.get(k) != new.get(k))
        if diff:
            shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
            raise RecipeError(
                f"{run_dir} holds a run with a different config ({shown}); resume it with the "
                "same config, pick another logger.name, or pass --overwrite to start over"
            )
    pinned_text = yaml.safe_dump(json.loads(json.dumps(raw)), sort_keys=False)
    atomic_write(cfg_file, lambda tmp: Path(tmp).write_text(pinned_text))


def run_experiment(raw: dict[str, Any], *, overwrite: bool = False) -> Path:
    """``nemo-ais run``: warm start, every arm x seed on the DP ranks, then the report.

    Re-running with the same config resumes from the last checkpoints. Returns the run directory; raises ``ValueError``
    (invalid config), ``RecipeError`` (a failed run) or ``KeyboardInterrupt`` (checkpoints kept).
    """
    raw = migrate_config(raw)  # the former rollout.fp8 block: warned about once, here
    base = validate_config(raw)
    run_dir = _run_dir(base)
    with claim_run_dir(run_dir):  # for the whole launch
        pin_config(raw, run_dir, overwrite)
        _run(raw, base, run_dir)
    return run_dir


def _run(raw: dict[str, Any], base: RecipeConfig, run_dir: Path) -> None:
    from nemo_ais.embedded.report import write_report

    for arm in base.experiment.arm_names:  # an unreadable checkpoint stops the launch before any run trains
        if resolve_arm(raw, arm).checkpointing.enabled:
            for seed in base.experiment.seeds:
                load_checkpoint(checkpoint_path(run_dir, arm, seed))
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
