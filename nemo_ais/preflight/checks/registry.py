# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The check registry: a check is one function, registered with :func:`check`.

A check takes the :class:`Context` of one loaded config and returns a :class:`Verdict`, or None when it does not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nemo_ais.preflight.layout import ParallelLayout
from nemo_ais.preflight.loader import get
from nemo_ais.preflight.model_shapes import ModelShape
from nemo_ais.preflight.nemo_rl_target import NeMoRLTarget


@dataclass(frozen=True)
class CheckResult:
    """One check: ``name``, ``status`` (ok | warn | fail) and a one-line ``detail``."""

    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str

    def __str__(self) -> str:
        return f"[{self.status.upper():4}] {self.name}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    """What one check found: ``problems`` (the check fails), else ``detail``; ``warnings``."""

    problems: Sequence[str] = ()
    detail: str = ""
    warnings: Sequence[str] = ()

    def results(self, name: str) -> list[CheckResult]:
        """One ``fail`` line (problems joined by "; ") or one ``ok`` line, then the warnings."""
        head = []
        if self.problems:
            head = [CheckResult(name, "fail", "; ".join(self.problems))]
        elif self.detail:
            head = [CheckResult(name, "ok", self.detail)]
        return head + [CheckResult(name, "warn", w) for w in self.warnings]


@dataclass(frozen=True)
class Context:
    """What a check reads: the config, its parallel layout, the model's shapes, the NeMo-RL."""

    cfg: Mapping[str, Any]
    layout: ParallelLayout
    shape: ModelShape | None  # None: unknown model (checks with needs_shape are skipped)
    nemo_rl: NeMoRLTarget | None = None  # None: the NeMo-RL version is unknown
    nemo_rl_detail: str = ""  # how the target was found (nemo_rl_target.resolve_target)
    job_dir: str | None = None  # where the job runs and its relative paths resolve (NEMO_RL_DIR); None: unknown

    def get(self, dotted: str, default: Any = None) -> Any:
        """A dotted key of the config (:func:`~nemo_ais.preflight.loader.get`)."""
        return get(self.cfg, dotted, default)


CheckFn = Callable[[Context], Verdict | None]


@dataclass(frozen=True)
class Check:
    """A registered check (see :func:`check`)."""

    name: str
    fn: CheckFn
    needs_shape: bool
    mixins: bool


CHECKS: dict[str, Check] = {}
"""Every registered check by name, in registration (= output) order."""


def check(name: str, *, needs_shape: bool = False, mixins: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated function as the check ``name`` (unique: ``ValueError`` otherwise).

    ``needs_shape``: skipped when the model's shapes are unknown; ``mixins``: also run on arm mixins.
    """

    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"check {name!r} is registered twice ({CHECKS[name].fn.__qualname__})")
        CHECKS[name] = Check(name, fn, needs_shape, mixins)
        return fn

    return register
