# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Fused GPU kernels of the rollout quantizers (:mod:`.triton_quant`; Triton on first use)."""

from nemo_ais.kernels.triton_quant import *  # noqa: F403
from nemo_ais.kernels.triton_quant import __all__
