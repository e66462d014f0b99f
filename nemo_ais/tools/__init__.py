# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Tools on the rollout engine: ``nemo-ais attribute`` and ``nemo-ais calibrate-input-amax``."""
