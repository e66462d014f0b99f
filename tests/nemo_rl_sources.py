# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Where the vendored NeMo-RL versions live (``--nemo-rl`` choice -> source directory).

A module of its own so tests import it by name (``from nemo_rl_sources import ...``): a
bare ``from conftest import`` resolves to whichever ``conftest`` module was imported first
(tests/e2e has one too).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENDOR_DIR = REPO_ROOT.parent / "shared" / "vendor"
NEMO_RL_SOURCES = {"v0.7.0": VENDOR_DIR / "nemo-rl-v0.7.0", "main": VENDOR_DIR / "nemo-rl-main-7ea279a"}
