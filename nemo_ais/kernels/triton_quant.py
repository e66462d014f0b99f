# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Fused Triton quantizers with the signatures and bits of the PyTorch references in :mod:`nemo_ais.formats`.

One launch per weight or MoE expert stack ``[E, N, K]`` (NVFP4: also with a global scale per expert). A CPU tensor runs
the kernels under Triton's interpreter (scoped to this module; CI, small shapes). Non-finite input goes to the PyTorch
quantizer, which raises (one host read a call). ``pip install 'nemo-ais[triton]'``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import math
import sys
from collections.abc import Iterator
from types import ModuleType

import torch

from nemo_ais.formats import (
    MXFP4Tensor,
    MXFP8Tensor,
    NVFP4Tensor,
    quantize_blockwise,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
)
from nemo_ais.formats.checks import check_amax, check_last_dim
from nemo_ais.formats.fp8_block import _FAMILY_INDEX, Family, check_weight_args
from nemo_ais.formats.mx import MX_BLOCK
from nemo_ais.formats.nvfp4 import NVFP4_BLOCK, check_experts_args, nvfp4_global_scale, quantize_nvfp4_experts

__all__ = [
    "quantize_blockwise_triton",
    "quantize_mxfp4_triton",
    "quantize_mxfp8_triton",
    "quantize_nvfp4_experts_triton",
    "quantize_nvfp4_triton",
    "triton_available",
]

_KERNELS = "nemo_ais.kernels._triton_quant_jit"
# Elements per program of the 1-D formats: 16 rows x 256 columns (8 warps: 128 (MX) / 120 (NVFP4) registers, no spills)
_ROWS, _COLS, _WARPS = 16, 256, 8
_ABSMAX_BLOCK = 8192
# FP8 tiles are read in slices of this many rows (sm_90a ptxas: a whole 128x128 tile spilled at 255 registers; 8-row
# slices take 64, no spills).
_FP8_CHUNK = 16
_FP8_WARPS = 8
_HW_E4M3 = True  # E4M3 codes by the GPU's cvt instruction where it has one (benchmarks: False)
_READ_BACK = contextvars.ContextVar("nemo_ais_triton_read_back", default=True)  # False only inside _launches_only


def _hw_e4m3(x: torch.Tensor) -> bool:
    """E4M3 by the GPU's conversion (CUDA, sm_89+), else by integer arithmetic (same bits)."""
    return _HW_E4M3 and x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 9)


def _counter(device: torch.device) -> torch.Tensor:
    """The call's non-finite counter: one zeroed int32 the kernel adds to atomically."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _nonfinite(bad: torch.Tensor) -> bool:
    """Whether the kernel counted non-finite input: one 4-byte read back (a synchronization)."""
    return _READ_BACK.get() and bool(bad.item())


@contextlib.contextmanager
def _launches_only() -> Iterator[None]:
    """Benchmarks only (CUDA graph capture): the wrappers read no counter back, so non-finite input goes undetected."""
    token = _READ_BACK.set(False)
    try:
        yield
    finally:
        _READ_BACK.reset(token)


def triton_available() -> bool:
    """Whether Triton is importable (the kernels need it; CPU tensors use its interpreter)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _jit(interpret: bool) -> ModuleType:
    """The kernel module, compiled (CUDA) or loaded under Triton's interpreter (CPU)."""
    try:
        import triton
    except ImportError as err:
        raise ImportError("nemo_ais.kernels.triton_quant needs Triton: pip install 'nemo-ais[triton]'") from err
    if not interpret:
        return importlib.import_module(_KERNELS)
    # A second copy of the module whose @triton.jit functions are interpreter functions
    spec = importlib.util.find_spec(_KERNELS)
    module = importlib.util.module_from_spec(spec)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        spec.loader.exec_module(module)
    sys.modules.setdefault(_KERNELS + "_interpreted", module)
    return module


def _on_x_device(fn):
    """Run ``fn(x, ...)`` with ``x``'s GPU current: Triton launches on the current device."""

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor, *args, **kwargs):
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            return fn(x, *args, **kwargs)

    return wrapper


def _kernels_for(x: torch.Tensor) -> ModuleType:
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"x: got a tensor on {x.device}, expected CUDA (or CPU: interpreter)")
    return _jit(x.device.type == "cpu")


@_on_x_device
def quantize_blockwise_triton(
    x: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    family: Family = "reciprocal",
    eps: float = 1e-4,
    ue8m0: bool = False,
    *,
    name: str = "x",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise FP8 by one Triton launch; arguments, bits and errors of ``quantize_blockwise``."""
    check_weight_args(x, name, family, eps, block)
    x3 = (x if x.dim() == 3 else x.unsqueeze(0)).contiguous()
    e, n, k = x3.shape
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    q = torch.empty(e, n, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(e, nb, kb, dtype=torch.float32, device=x.device)
    if x3.numel():
        bad = _counter(x.device)
        tile_n, tile_k = triton_next_pow2(bn), triton_next_pow2(bk)
        _kernels_for(x).fp8_blockwise_kernel[(nb * kb, e)](
            x3, q.view(torch.uint8), s, bad, n, k, nb, kb, float(eps),
            BN=bn, BK=bk, TILE_N=tile_n, TILE_K=tile_k,
            FAMILY=_FAMILY_INDEX[family], UE8M0=bool(ue8m0), CHUNK=min(tile_n, _FP8_CHUNK),
            HW_CAST=_hw_e4m3(x),
            num_warps=_FP8_WARPS if tile_n * tile_k >= 8192 else 4,
        )  # fmt: skip
        if _nonfinite(bad):  # the PyTorch path raises, naming the count and first index
            return quantize_blockwise(x, block, family, eps, ue8m0, name=name)
    return (q, s) if x.dim() == 3 else (q[0], s[0])


def triton_next_pow2(v: int) -> int:
    """Smallest power of two >= ``v`` (a register block holding ``v`` elements)."""
    return 1 << max(0, (v - 1).bit_length())


def _mx(x: torch.Tensor, fp4: bool, ties_toward_zero: bool):
    """(uint8 codes ``[..., K or K/2]``, scale bytes ``[..., K/32]``, any non-finite) of ``x [..., K]``."""
    lead, k = x.shape[:-1], x.shape[-1]
    r = math.prod(lead)
    x2 = x.reshape(r, k).contiguous()
    q = torch.empty(*lead, k // 2 if fp4 else k, dtype=torch.uint8, device=x.device)
    scale = torch.empty(*lead, k // MX_BLOCK, dtype=torch.uint8, device=x.device)
    if x2.numel() == 0:
        return q, scale, False
    cols = min(_COLS, triton_next_pow2(k))
    grid = (-(-r // _ROWS), -(-k // cols))
    bad = _counter(x.device)
    _kernels_for(x).mx_kernel[grid](
        x2,
        q,
        scale,
        bad,
        r,
        k,
        BR=_ROWS,
        BK=cols,
        FP4=fp4,
        TIES_TO_ZERO=ties_toward_zero,
        HW_CAST=_hw_e4m3(x),
        num_warps=_WARPS,
    )
    return q, scale, _nonfinite(bad)


@_on_x_device
def quantize_mxfp8_triton(x: torch.Tensor, *, name: str = "x") -> MXFP8Tensor:
    """MXFP8 of ``x [..., K]`` by one Triton launch; the bits of ``quantize_mxfp8``."""
    check_last_dim(x, name, MX_BLOCK, "MXFP8")
    q, scale, bad = _mx(x, fp4=False, ties_toward_zero=False)
    if bad:
        return quantize_mxfp8(x, name=name)
    return MXFP8Tensor(q.view(torch.float8_e4m3fn), scale)


@_on_x_device
def quantize_mxfp4_triton(x: torch.Tensor, *, round_ties_toward_zero: bool = False, name: str = "x") -> MXFP4Tensor:
    """MXFP4 of ``x [..., K]`` by one Triton launch; the bits of ``quantize_mxfp4``."""
    check_last_dim(x, name, MX_BLOCK, "MXFP4")
    q, scale, bad = _mx(x, fp4=True, ties_toward_zero=bool(round_ties_toward_zero))
    if bad:
        return quantize_mxfp4(x, round_ties_toward_zero=round_ties_toward_zero, name=name)
    return MXFP4Tensor(q, scale)


def _matrix_amax(x: torch.Tensor, matrices: int, jit: ModuleType) -> torch.Tensor:
    """fp32 ``max |x|`` of each of ``matrices`` equal parts of ``x`` (inf for NaN / inf): [matrices]."""
    flat = x.reshape(-1)
    numel = flat.numel() // matrices
    partial = torch.empty(matrices, -(-numel // _ABSMAX_BLOCK), device=x.device)
    grid = (partial.shape[1], matrices)
    jit.absmax_kernel[grid](flat, partial, numel, BLOCK=_ABSMAX_BLOCK)
    return partial.amax(dim=1)


def _nvfp4(x, s_g, n, e, rows_per_block, jit):
    """Launch the NVFP4 kernel over ``x`` as ``[e, n, K]``; ``s_g`` 1 or ``e`` global scales."""
    k = x.shape[-1]
    data = torch.empty(*x.shape[:-1], k // 2, dtype=torch.uint8, device=x.device)
    scale = torch.empty(*x.shape[:-1], k // NVFP4_BLOCK, dtype=torch.uint8, device=x.device)
    cols = min(_COLS, triton_next_pow2(k))
    grid = (-(-n // _ROWS), -(-k // cols), e)
    bad = _counter(x.device)
    sg_stride = 0 if s_g.numel() == 1 else 1
    jit.nvfp4_kernel[grid](
        x, s_g.reshape(-1).contiguous(), data, scale, bad, n, k, sg_stride,
        BR=_ROWS, BK=cols, TILE_ROWS=rows_per_block, num_warps=_WARPS,
    )  # fmt: skip
    return data, scale.view(torch.float8_e4m3fn), _nonfinite(bad)


@_on_x_device
def quantize_nvfp4_triton(
    x: torch.Tensor, amax: float | torch.Tensor | None = None, *, rows_per_block: int = 1, name: str = "x"
) -> NVFP4Tensor:
    """NVFP4 of ``x [..., K]``; bits of :func:`nemo_ais.formats.quantize_nvfp4` (one global scale).

    Two launches with ``amax=None`` (amax, then quantizer), one with a static amax; 16x16 tiles stay within one matrix.
    """
    check_last_dim(x, name, NVFP4_BLOCK, "NVFP4")
    bad_tiles = rows_per_block not in (1, 16) or (rows_per_block > 1 and x.dim() < 2)
    if bad_tiles or x.numel() == 0:  # the PyTorch path: its error, or the empty result
        return quantize_nvfp4(x, amax, rows_per_block=rows_per_block, name=name)
    given = check_amax(amax, "amax")
    lead = x.shape[:-1]
    jit = _kernels_for(x)
    xc = x.contiguous()
    tensor_amax = _matrix_amax(xc, 1, jit)[0] if given is None else given.to(x.device)
    s_g = nvfp4_global_scale(tensor_amax)
    n = x.shape[-2] if rows_per_block > 1 else math.prod(lead)
    data, scale, bad = _nvfp4(xc, s_g, n, math.prod(lead) // n, rows_per_block, jit)
    if bad:
        return quantize_nvfp4(x, amax, rows_per_block=rows_per_block, name=name)
    return NVFP4Tensor(data, scale, s_g)


@_on_x_device
def quantize_nvfp4_experts_triton(
    x: torch.Tensor, amax: torch.Tensor | None = None, *, rows_per_block: int = 1, name: str = "x"
) -> NVFP4Tensor:
    """``quantize_nvfp4_experts`` of ``x [E, N, K]`` by one launch (its bits and errors)."""
    check_experts_args(x, amax, rows_per_block, name)
    if x.numel() == 0:  # the PyTorch path's empty result
        return quantize_nvfp4_experts(x, amax, rows_per_block=rows_per_block, name=name)
    e, n = x.shape[:2]
    jit = _kernels_for(x)
    xc = x.contiguous()
    expert_amax = _matrix_amax(xc, e, jit) if amax is None else amax.to(x.device, torch.float32)
    s_g = nvfp4_global_scale(expert_amax)
    data, scale, bad = _nvfp4(xc, s_g, n, e, rows_per_block, jit)
    # a non-finite x is counted by the kernel; a given amax (finite, >= 0) is checked here
    valid = torch.isfinite(expert_amax) & (expert_amax >= 0)
    if bad or (amax is not None and _READ_BACK.get() and not bool(valid.all())):
        for i in range(e):  # the PyTorch path raises, naming the expert
            quantize_nvfp4(x[i], None if amax is None else amax[i], name=f"{name}[{i}]")
        raise ValueError(f"amax: got {expert_amax.tolist()}, expected finite values >= 0")
    return NVFP4Tensor(data, scale, s_g)
