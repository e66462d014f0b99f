# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The simulated rollout engine ("twin"): :class:`~.twin.RolloutTwin` and its config."""
