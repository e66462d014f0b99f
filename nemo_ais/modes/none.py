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
"""Mode ``none``: w_hat = 1, the uncorrected clipped loss (NeMo-RL's ``ClippedPGLossFn``)."""

from __future__ import annotations

from nemo_ais.modes._base import Mode, compute_dtype, uncorrected

__all__ = ["MODE"]


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat = 1 (the ratio is never computed)."""
    return valid.to(compute_dtype(logp_old, logp_rollout))


MODE = Mode(name="none", weight=weight, importance_weight=False, applied_alpha=uncorrected)
