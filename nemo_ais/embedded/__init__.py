# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The embedded experiment behind ``nemo-ais run``: GRPO with a quantized rollout on one CPU."""
