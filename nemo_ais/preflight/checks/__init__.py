# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The pre-flight checks, run by :func:`check_config` in registration order (:data:`CHECKS`)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from nemo_ais.preflight.checks.registry import CHECKS, Check, CheckFn, CheckResult, Context, Verdict, check
from nemo_ais.preflight.checks.upstream import MASTER_CONFIG_SECTIONS, missing_sections
from nemo_ais.preflight.layout import parallel_layout, size_problems, split_problems
from nemo_ais.preflight.loader import get, is_mixin
from nemo_ais.preflight.model_shapes import resolve_model_shape
from nemo_ais.preflight.nemo_rl_target import resolve_target

__all__ = [
    "CHECKS",
    "RULE_MODULES",
    "Check",
    "CheckFn",
    "CheckResult",
    "Context",
    "Verdict",
    "check",
    "check_config",
    "validate_config",
]

RULE_MODULES = ("loss", "upstream", "parallel", "fp8", "formats", "refit", "trainer")
"""The modules whose checks :func:`check_config` runs, imported (registered) in this order."""
for _module in RULE_MODULES:
    importlib.import_module(f"{__name__}.{_module}")


def check_config(
    cfg: Mapping[str, Any], nemo_rl_version: str | None = None, environ: Mapping[str, str] | None = None
) -> list[CheckResult]:
    """Run every registered check on a loaded config; never raises on content.

    ``nemo_rl_version`` None: the source at ``NEMO_RL_DIR`` is read, else version checks warn. An arm mixin gets only
    the ``mixins=True`` checks; a full config missing a ``MasterConfig`` section gets one ``sections`` failure. The
    first result, ``model_shapes``, says where the shapes came from; unknown shapes skip ``needs_shape=True`` checks.
    """
    mixin = is_mixin(cfg)
    if not mixin and (missing := missing_sections(cfg)):
        verb = "is" if len(missing) == 1 else "are"
        return [
            CheckResult(
                "sections",
                "fail",
                f"{', '.join(missing)} {verb} missing: NeMo-RL's GRPO MasterConfig requires each of "
                f"{', '.join(MASTER_CONFIG_SECTIONS)} (a full config is a defaults: delta on "
                "configs/nemo_rl/grpo_ais_base.yaml; an arm mixin holds loss_fn.ais and no policy/cluster)",
            )
        ]
    if sizes := size_problems(cfg):  # every check reads the layout (a mixin may set parallel sizes too)
        return [CheckResult("parallel_sizes", "fail", "; ".join(sizes))]
    if not mixin and (split := split_problems(cfg)):  # and its GPU counts
        return [CheckResult("gpu_split", "fail", "; ".join(split))]
    target, how = resolve_target(nemo_rl_version, environ)
    job_dir = (os.environ if environ is None else environ).get("NEMO_RL_DIR") or None
    if mixin:
        return _run(Context(cfg, parallel_layout(cfg), None, target, how, job_dir), mixin=True)
    found = resolve_model_shape(str(get(cfg, "policy.model_name", "")))
    detail = found.detail
    if found.shape is None:
        detail += ": head, expert and FP8 shard checks skipped (put the model's config.json there)"
    shapes = CheckResult("model_shapes", "ok" if found.ok else "warn", detail)
    ctx = Context(cfg, parallel_layout(cfg), found.shape, target, how, job_dir)
    return [shapes, *_run(ctx, mixin=False)]


def _run(ctx: Context, mixin: bool) -> list[CheckResult]:
    results = []
    for registered in CHECKS.values():
        if (mixin and not registered.mixins) or (registered.needs_shape and ctx.shape is None):
            continue
        try:
            verdict = registered.fn(ctx)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
            # a value of a type no rule expected: this check fails with what it read, the others still run
            why = f"{type(err).__name__}: {err}"
            verdict = Verdict([f"could not read the config ({why}); expected the types of NeMo-RL's MasterConfig"])
        if verdict is not None:
            results += verdict.results(registered.name)
    return results


def validate_config(
    cfg: Mapping[str, Any],
    source: str = "config",
    nemo_rl_version: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Run :func:`check_config`; one ``ValueError`` (``<source>: N check(s) failed:``) lists all."""
    results = check_config(cfg, nemo_rl_version, environ)
    failed = [r for r in results if r.status == "fail"]
    if failed:
        lines = "\n".join(f"  {r}" for r in failed)
        raise ValueError(f"{source}: {len(failed)} check(s) failed:\n{lines}")
    return results
