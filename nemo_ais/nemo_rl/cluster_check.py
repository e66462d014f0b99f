# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Alias of :mod:`nemo_ais.preflight` (``python -m nemo_ais.nemo_rl.cluster_check``, torch-free)."""

import sys

from nemo_ais.preflight import *  # noqa: F403
from nemo_ais.preflight import __all__  # noqa: F401
from nemo_ais.preflight.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nemo_ais.nemo_rl.cluster_check"))
