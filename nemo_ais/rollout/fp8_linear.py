# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Simulated W8A8 block-FP8 linear layer (the vLLM FP8 GEMM, emulated on any device).

What one forward computes, for ``x [..., K]`` and a weight ``W [N, K]``:

1. At weight-sync time (:meth:`Fp8Linear.load_weight`): ``(W_q, S_w) = quant(W)`` with
   128x128 blocks (:func:`~nemo_ais.formats.fp8_block.quantize_blockwise`), stored as
   ``weight`` (float8_e4m3fn) and ``weight_scale_inv`` (fp32 dequant multiplier, vLLM's
   name). ``W_dq = W_q * S_w`` is cached in fp32 for the matmul.
2. At every forward: ``(x_q, S_x) = quant(x)`` per token in 1x128 groups
   (:func:`~nemo_ais.formats.fp8_block.quantize_activations`), ``x_dq = x_q * S_x``.
3. ``y = x_dq @ W_dq^T`` in fp32 (the FP8 GEMM's fp32 accumulation; the product of two
   E4M3 values and their fp32 scales is what the tensor core multiplies), then
   ``+ bias`` (kept unquantized), then cast to the input dtype (the GEMM output dtype).

Since every operand of step 3 is exactly representable, the only difference from a
real FP8 GEMM is the summation order of the fp32 accumulation.

:class:`Fp8Experts` applies the same to the fused MoE experts of transformers 5
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``, as vLLM's ``w13`` / ``w2``): one
:class:`Fp8Linear` per expert and projection, both expert GEMMs W8A8.
:func:`fake_quant_fp8_weight` and :func:`fake_quant_fp8_activation` are the two fake
quantizations as functions (the ``fp8`` entry of :data:`nemo_ais.rollout.fake_quant.LINEAR_FAKE_QUANT`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nemo_ais.formats.fp8_block import (
    Family,
    dequantize_blockwise,
    fake_quant_fp8_activation,
    fake_quant_fp8_weight,
    quantize_blockwise,
)
from nemo_ais.rollout.linear import QuantExperts, load_bias

__all__ = ["Fp8Experts", "Fp8Linear", "fake_quant_fp8_activation", "fake_quant_fp8_weight"]


class Fp8Linear(nn.Module):
    """Drop-in ``nn.Linear`` replacement running simulated W8A8 block FP8 (module doc).

    Buffers: ``weight`` ``[N, K]`` float8_e4m3fn, ``weight_scale_inv`` fp32
    ``[ceil(N/bn), ceil(K/bk)]``, and the non-persistent fp32 ``weight_dequant`` cache.
    ``bias`` (if any) is a frozen parameter in the layer's original dtype.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        weight_block: tuple[int, int] = (128, 128),
        activation_group: int = 128,
        weight_family: Family = "a",
        activation_family: Family = "b",
        weight_eps: float = 1e-4,
        activation_eps: float = 1e-10,
        ue8m0: bool = False,
        name: str = "weight",
    ) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"{name}: got {list(weight.shape)}, expected a 2-D [out, in] weight")
        self.out_features, self.in_features = weight.shape
        self.weight_block = tuple(weight_block)
        self.activation_group = activation_group
        self.weight_family = weight_family
        self.activation_family = activation_family
        self.weight_eps = weight_eps
        self.activation_eps = activation_eps
        self.ue8m0 = ue8m0
        self.name = name
        self.register_buffer("weight", torch.empty(0, dtype=torch.float8_e4m3fn))
        self.register_buffer("weight_scale_inv", torch.empty(0, dtype=torch.float32))
        self.register_buffer("weight_dequant", torch.empty(0), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)
        self.load_weight(weight)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "weight", **kwargs) -> Fp8Linear:
        """Build from an ``nn.Linear``, quantizing its current weight (``kwargs`` as ``__init__``)."""
        return cls(linear.weight.detach(), linear.bias, name=name, **kwargs)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Re-quantize from a high-precision ``[out, in]`` weight (the refit of one tensor).

        Raises:
            ValueError: wrong shape, or non-finite values (count and first index, from
                :func:`~nemo_ais.formats.fp8_block.quantize_blockwise`).
        """
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"{self.name}: got {list(weight.shape)}, expected {list(expected)}")
        w_q, s_w = quantize_blockwise(
            weight.detach(),
            self.weight_block,
            self.weight_family,
            self.weight_eps,
            self.ue8m0,
            name=self.name,
        )
        self.weight = w_q
        self.weight_scale_inv = s_w
        self.weight_dequant = dequantize_blockwise(w_q, s_w, self.weight_block, torch.float32)

    @torch.no_grad()
    def load_quantized(self, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> None:
        """Load already-quantized codes and scales (a vLLM-format refit stream) as is.

        Raises:
            ValueError: codes not ``float8_e4m3fn [out, in]``, or scales not fp32 with one
                finite, positive entry per block.
        """
        expected = (self.out_features, self.in_features)
        if weight.dtype != torch.float8_e4m3fn or tuple(weight.shape) != expected:
            raise ValueError(
                f"{self.name}: got codes {list(weight.shape)} {weight.dtype}, expected "
                f"{list(expected)} torch.float8_e4m3fn"
            )
        blocks = tuple(-(-n // b) for n, b in zip(expected, self.weight_block, strict=True))
        s = weight_scale_inv
        if s.dtype != torch.float32 or tuple(s.shape) != blocks:
            raise ValueError(
                f"{self.name}_scale_inv: got {list(s.shape)} {s.dtype}, expected "
                f"{list(blocks)} torch.float32 for block {self.weight_block}"
            )
        if not bool((torch.isfinite(s) & (s > 0)).all()):
            raise ValueError(
                f"{self.name}_scale_inv: {int((~(torch.isfinite(s) & (s > 0))).sum())} "
                "scale(s) not finite and > 0 (a never-loaded or corrupted scale)"
            )
        self.weight = weight.detach().clone()
        self.weight_scale_inv = s.detach().clone()
        self.weight_dequant = dequantize_blockwise(
            self.weight, self.weight_scale_inv, self.weight_block, torch.float32
        )

    def load_bias(self, bias: torch.Tensor) -> None:
        """Copy a new bias (kept in high precision, as vLLM does)."""
        load_bias(self, bias)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token 1x``group`` FP8 fake-quant of the input (:func:`fake_quant_fp8_activation`)."""
        return fake_quant_fp8_activation(
            x,
            self.activation_group,
            self.activation_family,
            self.activation_eps,
            self.ue8m0,
            name=f"{self.name} input",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = dq(q(x)) @ dq(q(W))^T (+ bias)`` in fp32, returned in ``x.dtype``."""
        x_dq = self.quantize_input(x)
        y = F.linear(x_dq, self.weight_dequant)
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        """Shapes, block/group sizes and formula families, for ``print(model)``."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, block={self.weight_block}, "
            f"group={self.activation_group}, families=({self.weight_family!r}, "
            f"{self.activation_family!r}), ue8m0={self.ue8m0}"
        )


class Fp8Experts(QuantExperts):
    """W8A8 replacement of a transformers-5 fused MoE experts module (module doc).

    :class:`~nemo_ais.rollout.linear.QuantExperts` with one :class:`Fp8Linear` per
    expert and projection (so the down input is re-quantized per token, as in vLLM's FP8
    fused MoE); ``quant_kwargs`` are :class:`Fp8Linear`'s.
    """

    def __init__(self, experts: nn.Module, *, name: str = "experts", **quant_kwargs) -> None:
        super().__init__(experts, lambda w, n: Fp8Linear(w, name=n, **quant_kwargs), name=name)
