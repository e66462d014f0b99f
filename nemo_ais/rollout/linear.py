# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""A linear layer (and fused MoE experts) running one rollout format's fake quantization.

:class:`QuantLinear` for ``x [..., K]``, ``W [N, K]``: at refit ``W_dq = weight_fq(W, amax)`` (cached fp32); at every
forward ``x_dq = activation_fq(x, input_amax)``, then ``y = x_dq @ W_dq^T + bias`` in fp32, cast to ``x.dtype``.
:class:`QuantExperts` replaces transformers-5 fused MoE experts by one linear per expert and projection.
:class:`Fp8Linear` also keeps vLLM's block-FP8 codes and scales, so the twin loads a refit stream as sent; every operand
being exact, only the fp32 summation order differs from a real FP8 GEMM.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nemo_ais.formats.checks import check_e4m3_codes
from nemo_ais.formats.fp8_block import Family, dequantize_blockwise, quantize_weight
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LinearFakeQuant, linear_fake_quant, scale_error


@torch.no_grad()
def load_bias(module: nn.Module, bias: torch.Tensor) -> None:
    """Copy a new bias into ``module.bias`` (kept in high precision, as vLLM does)."""
    if module.bias is None or bias.shape != module.bias.shape:
        expected = None if module.bias is None else list(module.bias.shape)
        raise ValueError(f"{module.name} bias: got {list(bias.shape)}, expected {expected}")
    module.bias.copy_(bias)


class QuantLinear(nn.Module):
    """Drop-in ``nn.Linear`` running a format's fake quantization (module doc).

    Attributes:
        weight_dequant: fp32 ``[N, K]``, the fake-quantized weight.
        weight_amax: the amax behind the weight's global scale (None: its own).
        input_amax: 0-dim fp32 static input amax (None until calibrated, and after a refit).
        calibrating: while True, the input is not quantized.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        fake_quant: LinearFakeQuant,
        *,
        name: str = "weight",
        weight_amax: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"{name}: got {list(weight.shape)}, expected a 2-D [out, in] weight")
        self.out_features, self.in_features = weight.shape
        self.fake_quant = fake_quant
        self.name = name
        self.register_buffer("weight_dequant", torch.empty(0), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)
        self.weight_amax: torch.Tensor | None = None
        self.input_amax: torch.Tensor | None = None
        self.calibrating = False
        self.load_weight(weight, amax=weight_amax)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Re-quantize from a high-precision ``[out, in]`` weight (ValueError: shape, NaN)."""
        self._check_shape(weight)
        self.weight_amax = amax
        self.weight_dequant = self.expected_weight(weight, amax)

    def _check_shape(self, weight: torch.Tensor) -> None:
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"{self.name}: got {list(weight.shape)}, expected {list(expected)}")

    @torch.no_grad()
    def expected_weight(self, weight: torch.Tensor, amax: torch.Tensor | None) -> torch.Tensor:
        """The fp32 weight a correct refit of ``weight`` gives (the refit readback's oracle)."""
        return self.fake_quant.weight(weight.detach(), amax=amax, name=self.name)

    def load_bias(self, bias: torch.Tensor) -> None:
        """Copy a new bias (kept in high precision, as vLLM does)."""
        load_bias(self, bias)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The format's activation fake quant (raw ``x`` while calibrating)."""
        if self.calibrating:
            return x
        if self.fake_quant.static_input_amax and self.input_amax is None:
            raise ValueError(
                f"{self.name}: the static input amax is not calibrated (format "
                f"{self.fake_quant.format}); the twin calibrates it after every refit"
            )
        return self.fake_quant.activation(x, amax=self.input_amax, name=f"{self.name} input")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = fq_act(x) @ fq_w(W)^T (+ bias)`` in fp32, returned in ``x.dtype``."""
        y = F.linear(self.quantize_input(x).to(torch.float32), self.weight_dequant)
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        """Shapes and format, for ``print(model)``."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, format={self.fake_quant.format!r}"
        )


class QuantExperts(nn.Module):
    """Fake-quantized replacement of a transformers-5 fused MoE experts module.

    The standard layout only, else ``NotImplementedError`` (``gate_up_proj [E, 2I, H]`` as ``[gate; up]``,
    ``down_proj [E, H, I]``, no bias): ``y_t += w_tk * down_e(act(gate_e(x_t)) * up_e(x_t))``, each projection
    ``make_linear(weight, name)``.
    """

    def __init__(
        self, experts: nn.Module, make_linear: Callable[[torch.Tensor, str], nn.Module], *, name: str = "experts"
    ) -> None:
        super().__init__()
        layout = {
            "has_gate": True,
            "has_bias": False,
            "is_transposed": False,
            "is_concatenated": True,
            "has_post_expert_norm": False,
        }
        odd = {k: getattr(experts, k) for k, v in layout.items() if getattr(experts, k, v) != v}
        gate_up = getattr(experts, "gate_up_proj", None)
        down = getattr(experts, "down_proj", None)
        if (
            odd
            or not isinstance(gate_up, torch.Tensor)
            or not isinstance(down, torch.Tensor)
            or gate_up.dim() != 3
            or down.shape != (gate_up.shape[0], gate_up.shape[2], gate_up.shape[1] // 2)
        ):
            raise NotImplementedError(
                f"{name}: unsupported MoE experts layout ({type(experts).__name__}, {odd or ''}gate_up_proj "
                f"{getattr(gate_up, 'shape', None)}, down_proj {getattr(down, 'shape', None)}); expected gate_up_proj "
                "[E, 2I, H] and down_proj [E, H, I], concatenated, not transposed, no bias"
            )
        self.name = name
        self.num_experts = gate_up.shape[0]
        self.act_fn = experts.act_fn
        self.gate_up_proj = nn.ModuleList(
            make_linear(w, f"{name}.gate_up_proj[{e}]") for e, w in enumerate(gate_up.detach())
        )
        self.down_proj = nn.ModuleList(make_linear(w, f"{name}.down_proj[{e}]") for e, w in enumerate(down.detach()))

    def _loader(self, linears: nn.ModuleList, param: str):
        def load(weight: torch.Tensor) -> None:
            if weight.dim() != 3 or weight.shape[0] != self.num_experts:
                raise ValueError(f"{self.name}.{param}: got {list(weight.shape)}, expected [{self.num_experts}, N, K]")
            for linear, w in zip(linears, weight, strict=True):
                linear.load_weight(w)

        return load

    def loaders(self) -> dict[str, object]:
        """``{relative parameter name: load function}`` for the refit (fused 3-D tensors)."""
        return {param: self._loader(getattr(self, param), param) for param in ("gate_up_proj", "down_proj")}

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """Routed fake-quantized experts: ``[T, H]`` -> ``[T, H]`` in ``hidden_states.dtype``."""
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue  # HF marks dropped (capacity / EP) routes with an out-of-range id
            token_idx, k_pos = torch.where(top_k_index == e)
            gate, up = self.gate_up_proj[e](hidden_states[token_idx]).chunk(2, dim=-1)
            y = self.down_proj[e](self.act_fn(gate) * up)
            y = y * top_k_weights[token_idx, k_pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


class Fp8Linear(QuantLinear):
    """:class:`QuantLinear` of format fp8 that keeps vLLM's ``weight`` / ``weight_scale_inv``."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        weight_block: tuple[int, int] = (128, 128),
        activation_group: int = 128,
        weight_family: Family = "reciprocal",
        activation_family: Family = "divide",
        weight_eps: float = 1e-4,
        activation_eps: float = 1e-10,
        ue8m0: bool = False,
        error_scale: float = 1.0,
        name: str = "weight",
    ) -> None:
        self.knobs = RolloutPrecisionConfig(
            format="fp8",
            block=tuple(weight_block),
            activation_group=activation_group,
            family=weight_family,
            activation_family=activation_family,
            eps=weight_eps,
            activation_eps=activation_eps,
            ue8m0=ue8m0,
            error_scale=error_scale,
        )
        super().__init__(weight, bias, linear_fake_quant(self.knobs), name=name)

    @property
    def weight_block(self) -> tuple[int, int]:
        """The scale tile of the held weight (the config's ``weight_block``)."""
        return self.knobs.weight_block

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "weight", **kwargs) -> Fp8Linear:
        """Build from an ``nn.Linear``, quantizing its current weight (``kwargs`` as ``__init__``)."""
        return cls(linear.weight.detach(), linear.bias, name=name, **kwargs)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Re-quantize from a high-precision ``[out, in]`` weight (ValueError: shape, NaN)."""
        self._check_shape(weight)
        self._store(*self._quantize(weight))
        self.weight_dequant = scale_error(weight.detach(), self.weight_dequant, self.knobs.error_scale)

    def _quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_weight(weight, self.knobs, name=self.name)

    @torch.no_grad()
    def expected_weight(self, weight: torch.Tensor, amax: torch.Tensor | None) -> torch.Tensor:
        """:meth:`QuantLinear.expected_weight` (``amax`` unused: FP8 scales are per tile)."""
        w_dq = dequantize_blockwise(*self._quantize(weight), self.weight_block, torch.float32, check=False)
        return scale_error(weight.detach(), w_dq, self.knobs.error_scale)

    @torch.no_grad()
    def load_quantized(self, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> None:
        """Load vLLM-format codes and scales as is (ValueError: wrong dtype/shape, bad scales)."""
        if self.knobs.error_scale != 1.0:
            raise ValueError(
                f"{self.name}: error_scale={self.knobs.error_scale} needs the high-precision "
                "weight (x + k (q(x) - x)); load it with load_weight, not as FP8 codes"
            )
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
        check_e4m3_codes(weight, self.name, "weight")  # before anything is stored: no half-loaded layer
        self._store(weight.detach().clone(), s.detach().clone())

    def _store(self, w_q: torch.Tensor, s_w: torch.Tensor) -> None:
        for buffer, value in (("weight", w_q), ("weight_scale_inv", s_w)):
            if buffer in self._buffers:
                setattr(self, buffer, value)
            else:
                self.register_buffer(buffer, value)
        self.weight_dequant = dequantize_blockwise(w_q, s_w, self.weight_block, torch.float32, check=False)


class Fp8Experts(QuantExperts):
    """:class:`QuantExperts` of one :class:`Fp8Linear` per expert and projection (vLLM)."""

    def __init__(self, experts: nn.Module, *, name: str = "experts", **quant_kwargs) -> None:
        super().__init__(experts, lambda w, n: Fp8Linear(w, name=n, **quant_kwargs), name=name)
