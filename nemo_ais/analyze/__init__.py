# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Offline analysis of NeMo-RL step logs (``nemo-ais analyze``, docs/analyze.md).

:func:`analyze_run` replays the AIS diagnostics and every correction mode over a run's
step logs; the refit guard is re-exported from :mod:`nemo_ais.alarms`.
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
