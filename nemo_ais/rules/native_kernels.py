# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The GPU each rollout format needs to run as named, and what vLLM runs below it.

vLLM (0.20.0 and 0.25.1) picks a kernel at engine build and only logs a fallback: NVFP4 needs capability >= 10.0,
else weight-only Marlin (``input_scale`` dropped); MXFP8 needs SM100; block FP8 runs weight-only Marlin below 8.9.
Torch-free: the runtime check and ``nemo_ais.preflight`` both read this table.
"""

from __future__ import annotations

from typing import NamedTuple

HOPPER = (9, 0)
"""H100 / H200, the GPU the shipped cluster configs target."""


class NativeKernel(NamedTuple):
    """The GPU a rollout format needs to run as named (its activations quantized too)."""

    min_capability: tuple[int, int]
    gpus: str  # in words, for messages
    fallback: str  # what vLLM runs below min_capability
    family: str  # the vLLM method family: fp8, mxfp8 or nvfp4
    weight_only: str  # the held format of that family's weight-only (Marlin) kernel
    refit_reloads_experts_v070: bool = True  # False: v0.7.0 never re-processes its experts

    @property
    def min_text(self) -> str:
        """``10.0``."""
        return ".".join(map(str, self.min_capability))


NATIVE_KERNELS: dict[str, NativeKernel] = {
    "fp8": NativeKernel(
        (8, 9), "Ada, Hopper or newer", "weight-only Marlin FP8 (W8A16)", family="fp8", weight_only="fp8_weight_only"
    ),
    "mxfp8": NativeKernel(
        (10, 0),
        "Blackwell (SM100)",
        "weight-only Marlin MXFP8 (W8A16), which NeMo-RL main's MXFP8 refit refuses",
        family="mxfp8",
        weight_only="mxfp8_weight_only",
    ),
    "nvfp4_w4a4": NativeKernel(
        (10, 0),
        "Blackwell (SM100)",
        "weight-only Marlin NVFP4 (W4A16), input_scale unused",
        family="nvfp4",
        weight_only="nvfp4_w4a16",
        refit_reloads_experts_v070=False,
    ),
    "nvfp4_w4a16": NativeKernel(
        (7, 5),
        "Turing or newer (Marlin)",
        "none",
        family="nvfp4",
        weight_only="nvfp4_w4a16",
        refit_reloads_experts_v070=False,
    ),
}
