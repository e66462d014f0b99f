# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The quantizers' result does not depend on the band size.

On CPU the fast paths work in cache-sized bands of rows; on a GPU the whole weight is one
band (``nemo_ais.formats.grids.band_elems``: 1 MiB bands made them 25-76x slower there,
docs/benchmarks.md "quant_cuda"). Here the GPU band size is forced on CPU and every byte
must equal the banded result (tests/gpu/test_cuda_quant.py checks CUDA against CPU).
"""

from __future__ import annotations

import pytest
import torch

import nemo_ais.formats.cpu_kernel as cpu_kernel_mod
import nemo_ais.formats.fp8_block as quant
import nemo_ais.formats.grids as grids
from nemo_ais.fp8 import quantize_blockwise, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4


def _bytes(q) -> list[torch.Tensor]:
    parts = q if isinstance(q, tuple) else tuple(vars(q).values())
    return [p.contiguous().view(torch.uint8) if p.element_size() == 1 else p for p in parts]


QUANTIZERS = {
    "fp8": lambda x: quantize_blockwise(x),
    "nvfp4": lambda x: quantize_nvfp4(x),
    "nvfp4_2d": lambda x: quantize_nvfp4(x, rows_per_block=16),
    "mxfp8": lambda x: quantize_mxfp8(x),
    "mxfp4": lambda x: quantize_mxfp4(x),
}


def test_band_elems_by_device():
    assert grids.band_elems(torch.device("cpu")) == 1 << 18
    assert grids.band_elems(torch.device("cpu"), 1 << 20) == 1 << 20
    assert grids.band_elems(torch.device("cuda")) == 1 << 26
    # a 1024 x 4096 weight: 16 CPU bands, one GPU band
    assert len(grids.row_bands(1024, 4096)) == 16
    assert grids.row_bands(1024, 4096, device=torch.device("cuda")) == [(0, 1024)]


@pytest.mark.parametrize("fmt", sorted(QUANTIZERS))
def test_one_band_equals_many_bands(fmt, monkeypatch):
    x = torch.randn(704, 2048, generator=torch.Generator().manual_seed(3)) * 2
    x[5, 16:32] = 0.0  # an all-zero block
    fn = QUANTIZERS[fmt]
    monkeypatch.setattr(cpu_kernel_mod, "cpu_kernel", lambda: None)  # the PyTorch paths
    banded = _bytes(fn(x))
    assert len(grids.row_bands(704, 2048)) > 1  # the default really has several bands
    gpu_sized = grids.band_elems(torch.device("cuda"))
    monkeypatch.setattr(grids, "_BAND_ELEMS", gpu_sized)
    monkeypatch.setattr(quant, "_BAND_ELEMS", gpu_sized)
    assert len(grids.row_bands(704, 2048)) == 1
    for a, b in zip(_bytes(fn(x)), banded, strict=True):
        assert torch.equal(a, b), fmt
