# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Which implementation runs a public quantizer: ONE decision for every format.

:func:`backend_for` picks, for a tensor's device, dtype and layout (all three give the same bits):

* ``"triton"``: a CUDA tensor with Triton importable: :mod:`nemo_ais.kernels.triton_quant` (one launch per weight or
  expert stack); ``NEMO_AIS_TRITON=0`` turns it off.
* ``"cpu"``: a non-empty contiguous fp32 / bf16 / fp16 CPU tensor with the C++ kernels built
  (:mod:`nemo_ais.formats.cpu_kernel`; ``NEMO_AIS_CPU_KERNEL=0`` turns them off).
* ``"torch"``: the PyTorch path everywhere else.

``kernels/`` imports ``formats/``, so the Triton module is loaded by name on first use (no import cycle). On non-finite
input a Triton kernel calls the public quantizer under :func:`without_triton`, which raises; any other kernel failure
(a Triton or driver that cannot compile or launch it) is logged once and turns Triton off for the process.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from typing import Any, Literal

import torch

from nemo_ais.formats import cpu_kernel as _cpu

Backend = Literal["triton", "cpu", "torch"]

TRITON_MODULE = "nemo_ais.kernels.triton_quant"
_TRITON_DEVICES = ("cuda",)  # device types the Triton kernels are compiled for
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NO_TRITON = contextvars.ContextVar("nemo_ais_no_triton", default=False)
_BROKEN: list[str] = []  # the first failure of a Triton kernel in this process, if any

logger = logging.getLogger(__name__)


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_enabled() -> bool:
    """Triton importable, ``NEMO_AIS_TRITON`` not 0, no :func:`without_triton`, no failure yet."""
    if os.environ.get("NEMO_AIS_TRITON", "1") == "0" or _NO_TRITON.get() or _BROKEN:
        return False
    return _triton_importable()


def backend_for(
    device: torch.device | str, dtype: torch.dtype = torch.float32, *, contiguous: bool = True, numel: int = 1
) -> Backend:
    """The implementation that quantizes a tensor of ``device``, ``dtype`` and layout (module doc)."""
    kind = torch.device(device).type
    if kind in _TRITON_DEVICES and triton_enabled():
        return "triton"
    fits = dtype in _CPU_DTYPES and contiguous and numel > 0
    if kind == "cpu" and fits and _cpu.cpu_kernel() is not None:
        return "cpu"
    return "torch"


def backend_of(x: torch.Tensor) -> Backend:
    """:func:`backend_for` of tensor ``x``."""
    return backend_for(x.device, x.dtype, contiguous=x.is_contiguous(), numel=x.numel())


def kernel_for(x: torch.Tensor) -> Any:
    """The fused C++ extension where :func:`backend_of` ``x`` is ``"cpu"``, else None."""
    return _cpu.cpu_kernel() if backend_of(x) == "cpu" else None


@contextlib.contextmanager
def without_triton() -> Iterator[None]:
    """Within the block the public quantizers take no Triton path (this thread / task only)."""
    token = _NO_TRITON.set(True)
    try:
        yield
    finally:
        _NO_TRITON.reset(token)


def triton_quantize(kernel: str, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``nemo_ais.kernels.triton_quant.<kernel>(x, *args, **kwargs)`` under :func:`without_triton`, or None.

    None (the caller's path runs) where ``x``'s backend is not ``"triton"`` or the kernel failed (module doc).
    """
    if backend_of(x) != "triton":
        return None
    module = importlib.import_module(TRITON_MODULE)
    try:
        with without_triton():
            return getattr(module, kernel)(x, *args, **kwargs)
    except (ValueError, TypeError):
        raise  # the caller's input: the same error as the PyTorch path's
    except Exception as err:  # compile / launch failure: same bits on the PyTorch path
        _BROKEN.append(f"{kernel}: {type(err).__name__}: {err}")
        logger.warning(
            "nemo_ais.formats: the Triton kernel %s failed (%s: %s); the PyTorch path runs from now on in this process "
            "(same bits, slower). NEMO_AIS_TRITON=0 skips the attempt.",
            kernel,
            type(err).__name__,
            err,
        )
        return None
