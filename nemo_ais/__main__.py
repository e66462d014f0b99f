# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``python -m nemo_ais`` == the ``nemo-ais`` console script."""

import sys

from nemo_ais.cli import main

if __name__ == "__main__":
    sys.exit(main())
