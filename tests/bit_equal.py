# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Quantizer outputs compared bit for bit, and a spy on the Triton wrappers' calls.

:func:`assert_same_bits` takes ``(q, s)`` tuples or the formats' tensor dataclasses
(``NVFP4Tensor``, ``MXFP8Tensor``, ...) on any device; a mismatch names the part, the count,
the first differing index and both raw values (DeepGEMM style).
"""

from __future__ import annotations

import pytest
import torch

import nemo_ais.kernels.triton_quant as triton_quant


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``t`` on the CPU: uint8 for 1-byte dtypes, else int32 (fp32)."""
    t = t.contiguous().cpu()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def assert_same_bits(got, want, what: str, labels: tuple[str, str] = ("triton", "reference")):
    """Every part of ``got`` has the shape, dtype and bits of ``want``'s."""
    got_parts = got if isinstance(got, tuple) else tuple(vars(got).values())
    want_parts = want if isinstance(want, tuple) else tuple(vars(want).values())
    for i, (g, w) in enumerate(zip(got_parts, want_parts, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}[{i}]: {g.shape} {g.dtype}"
        gb, wb = bits(g), bits(w)
        diff = (gb != wb).nonzero()
        if diff.numel():
            idx = tuple(diff[0].tolist())
            raise AssertionError(
                f"{what}[{i}]: {diff.shape[0]} mismatch(es), first at {idx}: "
                f"{labels[0]} {gb[idx].item():#x}, {labels[1]} {wb[idx].item():#x}"
            )


def spy_triton(monkeypatch: pytest.MonkeyPatch, kernels) -> list[str]:
    """Wrap each named wrapper of ``nemo_ais.kernels.triton_quant``; the list of calls made."""
    calls: list[str] = []
    for kernel in set(kernels):
        fn = getattr(triton_quant, kernel)

        def spy(*args, _fn=fn, _kernel=kernel, **kwargs):
            calls.append(_kernel)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(triton_quant, kernel, spy)
    return calls
