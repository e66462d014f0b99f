# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Offline analysis of NeMo-RL step logs (``nemo-ais analyze``) and the refit guard.

* :func:`analyze_run`: replay the AIS diagnostics, alpha and every correction mode's
  weights over ``<log_dir>/train_data_step{N}.jsonl`` with the core code; write
  ``analysis.jsonl``, ``report.md`` and plots (``docs/analyze.md``).
* :class:`AlarmMonitor` / :class:`AlarmConfig`: the refit guard, re-exported from
  :mod:`nemo_ais.alarms` (torch-free pure logic, which the AIS worker uses online too);
  :func:`position_profile` computes its ``kv_scale_position`` input from a step's tensors.
"""

from nemo_ais.alarms import (
    ALARM_KINDS,
    AISAlarmsConfig,
    Alarm,
    AlarmConfig,
    AlarmMonitor,
    RefitAlarmError,
    alarm_metrics,
)
from nemo_ais.analyze.analysis import (
    ANALYSIS_FILE,
    DEFAULT_OUT,
    AnalysisResult,
    analysis_row,
    analyze_run,
    load_analysis_config,
)
from nemo_ais.analyze.position import PositionProfile, position_profile
from nemo_ais.analyze.reader import BadInputError, find_step_files

__all__ = [
    "ALARM_KINDS",
    "ANALYSIS_FILE",
    "DEFAULT_OUT",
    "AISAlarmsConfig",
    "Alarm",
    "AlarmConfig",
    "AlarmMonitor",
    "AnalysisResult",
    "BadInputError",
    "PositionProfile",
    "RefitAlarmError",
    "alarm_metrics",
    "analysis_row",
    "analyze_run",
    "find_step_files",
    "load_analysis_config",
    "position_profile",
]
