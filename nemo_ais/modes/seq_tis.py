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
"""Mode ``seq_tis``: w_hat_i = min(prod_t rho_t, C_s) = exp(clamp(S_i, -L, log C_s)) (veRL)."""

from __future__ import annotations

from nemo_ais.modes._base import Mode, capped_exp, seq_log_weight

__all__ = ["MODE"]


def weight(logp_old, logp_rollout, valid, config, batch_value):
    """w_hat_i = min(prod_t rho_t, C_s) = exp(clamp(S_i, -L, log C_s)) (veRL sequence TIS)."""
    log_w = seq_log_weight(logp_old, logp_rollout, valid)
    return capped_exp(log_w, config).mul(valid)


MODE = Mode(name="seq_tis", weight=weight, mode_stats=True, seq_level=True)
