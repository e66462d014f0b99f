# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Alias of :mod:`nemo_ais.preflight.memory_budget` (``python -m``, torch-free)."""

import sys

from nemo_ais.preflight.memory_budget import *  # noqa: F403
from nemo_ais.preflight.memory_budget import (
    __all__,  # noqa: F401
    main,
)

if __name__ == "__main__":
    sys.exit(main(prog="python -m nemo_ais.nemo_rl.memory_budget"))
