# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The refit and KV-calibration sections, read by the functions the entry point arms them with."""

from __future__ import annotations

from nemo_ais.preflight.checks.formats import NVFP4_DEFAULT_IGNORE
from nemo_ais.preflight.checks.registry import Context, Verdict, check
from nemo_ais.refit.config import SECTIONS, kv_calibration_reduction, section_config

_KV_SECTION = "ais_kv_calibration"


@check("refit_sections", mixins=True)
def check_refit_sections(ctx: Context) -> Verdict | None:
    """Each ``ais_*_refit`` and ``ais_kv_calibration`` section validates as ``launchers/run_grpo_ais.py`` reads it.

    :func:`~nemo_ais.refit.config.section_config` and :func:`~nemo_ais.refit.config.kv_calibration_reduction`, as
    before Ray: an unknown key, a bad value or ``enabled`` that is not a boolean, disabled sections included.
    """
    present = [s for s in (*SECTIONS, _KV_SECTION) if ctx.cfg.get(s) is not None]
    if not present:
        return None
    problems = []
    for section in SECTIONS:
        try:
            section_config(ctx.cfg, section, lambda: NVFP4_DEFAULT_IGNORE)
        except (TypeError, ValueError) as err:
            problems.append(str(err))
    reduction = ""
    try:
        reduction = f" (reduction {kv_calibration_reduction(ctx.cfg)})" if _KV_SECTION in present else ""
    except ValueError as err:
        problems.append(str(err))
    return Verdict(problems, f"{', '.join(present)}{reduction}: valid as the entry point reads them")
