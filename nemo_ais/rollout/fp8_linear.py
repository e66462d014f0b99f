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
The forward, the bias and the input quantization are :class:`~nemo_ais.rollout.linear.
QuantLinear`'s with the ``fp8`` record's fake quantization; this class only keeps the codes
and scales a vLLM FP8 engine holds.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_ais.formats.fp8_block import Family, dequantize_blockwise, quantize_blockwise
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import linear_fake_quant
from nemo_ais.rollout.linear import QuantExperts, QuantLinear

__all__ = ["Fp8Experts", "Fp8Linear"]


class Fp8Linear(QuantLinear):
    """:class:`~nemo_ais.rollout.linear.QuantLinear` of format ``fp8`` that keeps vLLM's tensors.

    Buffers: ``weight`` ``[N, K]`` float8_e4m3fn and ``weight_scale_inv`` fp32
    ``[ceil(N/bn), ceil(K/bk)]`` (what the refit stream sends, so the twin can also load
    them as they are: :meth:`load_quantized`), and the non-persistent fp32
    ``weight_dequant`` cache the forward multiplies by. ``bias`` (if any) is a frozen
    parameter in the layer's original dtype.
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
        self.knobs = RolloutPrecisionConfig(
            format="fp8",
            weight_block=tuple(weight_block),
            activation_group=activation_group,
            weight_family=weight_family,
            activation_family=activation_family,
            weight_eps=weight_eps,
            activation_eps=activation_eps,
            ue8m0=ue8m0,
        )
        self.weight_block = tuple(weight_block)
        super().__init__(weight, bias, linear_fake_quant(self.knobs), name=name)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "weight", **kwargs) -> Fp8Linear:
        """Build from an ``nn.Linear``, quantizing its current weight (``kwargs`` as ``__init__``)."""
        return cls(linear.weight.detach(), linear.bias, name=name, **kwargs)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Re-quantize from a high-precision ``[out, in]`` weight (the refit of one tensor).

        Raises:
            ValueError: wrong shape, or non-finite values (count and first index, from
                :func:`~nemo_ais.formats.fp8_block.quantize_blockwise`).
        """
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"{self.name}: got {list(weight.shape)}, expected {list(expected)}")
        k = self.knobs
        w_q, s_w = quantize_blockwise(
            weight.detach(), k.weight_block, k.weight_family, k.weight_eps, k.ue8m0, name=self.name
        )
        self._store(w_q, s_w)

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
        self._store(weight.detach().clone(), s.detach().clone())

    def _store(self, w_q: torch.Tensor, s_w: torch.Tensor) -> None:
        for buffer, value in (("weight", w_q), ("weight_scale_inv", s_w)):
            if buffer in self._buffers:
                setattr(self, buffer, value)
            else:
                self.register_buffer(buffer, value)
        self.weight_dequant = dequantize_blockwise(w_q, s_w, self.weight_block, torch.float32)


class Fp8Experts(QuantExperts):
    """W8A8 replacement of a transformers-5 fused MoE experts module (module doc).

    :class:`~nemo_ais.rollout.linear.QuantExperts` with one :class:`Fp8Linear` per
    expert and projection (so the down input is re-quantized per token, as in vLLM's FP8
    fused MoE); ``quant_kwargs`` are :class:`Fp8Linear`'s.
    """

    def __init__(self, experts: nn.Module, *, name: str = "experts", **quant_kwargs) -> None:
        super().__init__(experts, lambda w, n: Fp8Linear(w, name=n, **quant_kwargs), name=name)
