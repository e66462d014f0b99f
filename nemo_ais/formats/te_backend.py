# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Transformer Engine backend of :func:`~nemo_ais.formats.fp8_block.quantize_blockwise` (CUDA only).

TE 2.x's ``Float8BlockQuantizer`` (128x128 blocks, its row-wise ``scale_inv`` cropped) is family ``"multiplier"``
(``force_pow_2_scales`` is our ``ue8m0``); other families or tiles: ``backend="te"`` raises, ``"auto"`` uses torch. TE
is imported lazily, only here (``pip install 'nemo-ais[te]'``).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_ais.formats.checks import check_finite
from nemo_ais.rules.format_geometry import TE_BLOCK, TE_FAMILY, te_refuses


def _import_te() -> tuple[Any, Any]:
    """(``Float8BlockQuantizer``, ``transformer_engine_torch``), else ImportError."""
    try:
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    except ImportError as err:
        raise ImportError(
            "backend='te' needs Transformer Engine 2.x with PyTorch support: "
            "pip install 'nemo-ais[te]' (on a CUDA machine)"
        ) from err
    return Float8BlockQuantizer, tex


def is_available() -> bool:
    """True if Transformer Engine's blockwise quantizer imports and CUDA is available."""
    try:
        return torch.cuda.is_available() and bool(_import_te())
    except ImportError:
        return False


def use_te(
    x: torch.Tensor, backend: str, *, name: str = "x", family: str = TE_FAMILY, block: tuple[int, int] = TE_BLOCK
) -> bool:
    """Whether ``backend`` quantizes ``x`` by TE (``auto``: importable, CUDA, multiplier, 128x128).

    Raises:
        ValueError: unknown backend, or ``"te"`` with a CPU tensor or another family / block.
        ImportError: ``"te"`` without Transformer Engine (names the ``nemo-ais[te]`` extra).
    """
    if backend == "torch":
        return False
    if backend == "auto":
        return bool(te_refuses(family, block) is None and x.is_cuda and is_available())
    if backend != "te":
        raise ValueError(f"{name}: backend={backend!r} is invalid: expected 'torch', 'te' or 'auto'")
    _import_te()
    if not x.is_cuda:
        raise ValueError(f"{name}: backend='te' needs a CUDA tensor, got device {x.device}")
    refused = te_refuses(family, block)
    if refused is not None:
        raise ValueError(f"{name}: {refused}; use backend='torch' for the others")
    return True


def _quantize_2d(x2: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn q, cropped fp32 scale) of one 2-D tensor by TE."""
    n, k = x2.shape
    qt = quantizer(x2.contiguous())
    q = qt._rowwise_data.view(torch.float8_e4m3fn).reshape(n, k)
    nb, kb = -(-n // TE_BLOCK[0]), -(-k // TE_BLOCK[1])
    scale = qt._rowwise_scale_inv
    if scale.dim() != 2 or scale.shape[0] < nb or scale.shape[1] < kb:
        raise RuntimeError(
            f"unexpected Transformer Engine scale layout {list(scale.shape)} for [{n}, {k}]: "
            f"expected at least [{nb}, {kb}] (GEMM-ready 2-D block scaling)"
        )
    return q, scale[:nb, :kb].to(torch.float32).contiguous()


def quantize_blockwise_te(
    x: torch.Tensor,
    block: tuple[int, int] = TE_BLOCK,
    family: str = TE_FAMILY,
    eps: float = 0.0,
    ue8m0: bool = False,
    *,
    name: str = "x",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of :func:`quantize_blockwise` by TE (one expert of ``[E, N, K]`` at a time).

    ValueError: non-finite input (checked here: TE would sync an infinite amax silently), an unsupported family/block.
    """
    use_te(x, "te", name=name, family=family, block=block)
    check_finite(x, name, amax=x.abs().amax())
    quantizer_cls, tex = _import_te()
    quantizer = quantizer_cls(
        tex.DType.kFloat8E4M3,
        rowwise=True,
        columnwise=False,
        amax_epsilon=float(eps),
        force_pow_2_scales=bool(ue8m0),
        block_scaling_dim=2,
    )
    if x.dim() == 2:
        return _quantize_2d(x, quantizer)
    pairs = [_quantize_2d(x[e], quantizer) for e in range(x.shape[0])]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
