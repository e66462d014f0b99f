# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``python -m nemo_ais.preflight``: check NeMo-RL GRPO + AIS configs offline."""

import sys

from nemo_ais.preflight.cli import main

sys.exit(main())
