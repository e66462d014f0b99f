# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Rules shared by the runtime and the offline check, below both (torch-free, stdlib only)."""
