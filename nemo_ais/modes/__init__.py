# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The correction modes: one module each, one :class:`~nemo_ais.modes.Mode` record each.

:data:`MODES` maps ``loss_fn.ais.mode`` to its record, in the order of the docs. Adding a mode is one module here
exporting ``MODE`` and one line below (``docs/architecture.md``, "Where a new correction mode goes").
"""

from nemo_ais.modes import ais, icepop, kl_rs, m2po, none, seq_mask_geo, seq_mis, seq_tis, tbpo, tis
from nemo_ais.modes._base import (
    BatchStatistic,
    BatchValue,
    Interval,
    Mode,
    Replay,
    compute_dtype,
    log_ratio,
    masked,
    where_valid,
)

__all__ = [
    "MODES",
    "BatchStatistic",
    "BatchValue",
    "Interval",
    "Mode",
    "Replay",
    "batch_values",
    "compute_dtype",
    "log_ratio",
    "masked",
    "where_valid",
]

MODES: dict[str, Mode] = {
    module.MODE.name: module.MODE
    for module in (none, tis, icepop, seq_mask_geo, ais, seq_tis, seq_mis, kl_rs, m2po, tbpo)
}


def batch_values() -> tuple[BatchValue, ...]:
    """Every registered mode's new global-batch values, in registry order (read at call time)."""
    return tuple(
        value
        for mode in MODES.values()
        if mode.batch_statistic is not None
        for value in mode.batch_statistic.new_values
    )
