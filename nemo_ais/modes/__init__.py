# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The correction modes: one module each, one :class:`~nemo_ais.modes.Mode` record each.

:data:`MODES` maps ``loss_fn.ais.mode`` to its record, in the order of the docs. Adding a
mode is one module here exporting ``MODE`` and one line below (``docs/architecture.md``,
"Where a new correction mode goes").
"""

from nemo_ais.modes import ais, icepop, kl_rs, m2po, none, seq_mask_geo, seq_mis, seq_tis, tbpo, tis
from nemo_ais.modes._base import (
    BatchStatistic,
    Interval,
    Mode,
    Replay,
    compute_dtype,
    log_ratio,
    where_valid,
)

__all__ = [
    "MODES",
    "BatchStatistic",
    "Interval",
    "Mode",
    "Replay",
    "compute_dtype",
    "log_ratio",
    "where_valid",
]

MODES: dict[str, Mode] = {
    module.MODE.name: module.MODE
    for module in (none, tis, icepop, seq_mask_geo, ais, seq_tis, seq_mis, kl_rs, m2po, tbpo)
}
