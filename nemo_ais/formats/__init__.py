# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Low-precision formats: one record per format (PyTorch; TE and the CPU kernels load lazily)."""

from nemo_ais.formats.fp8_block import (
    E4M3_MAX,
    dequantize_activations,
    dequantize_blockwise,
    quantize_activations,
    quantize_blockwise,
)
from nemo_ais.formats.mxfp4 import MXFP4Tensor, dequantize_mxfp4, quantize_mxfp4
from nemo_ais.formats.mxfp8 import MXFP8Tensor, dequantize_mxfp8, fake_quantize_mxfp8, quantize_mxfp8
from nemo_ais.formats.nvfp4 import NVFP4Tensor, dequantize_nvfp4, fake_quantize_nvfp4, quantize_nvfp4

__all__ = [
    "E4M3_MAX",
    "MXFP4Tensor",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "dequantize_activations",
    "dequantize_blockwise",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "fake_quantize_mxfp8",
    "fake_quantize_nvfp4",
    "quantize_activations",
    "quantize_blockwise",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "quantize_nvfp4",
]
